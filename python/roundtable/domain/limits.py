"""How much one process takes on: runs at once and the streams that follow them."""

from __future__ import annotations

from dataclasses import dataclass, field

from roundtable.domain.flags import flag


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimits:
    """Backpressure: how much this process takes on."""

    max_runs: int = field(
        default=2_000,
        metadata=flag(
            "max-runs",
            "Runs executing or queued at once in this process (not those waiting for a "
            "person); more get RESOURCE_EXHAUSTED with a retry hint (a stop turn never does).",
            minimum=1,
        ),
    )
    """Runs executing or queued behind a thread's run at once."""
    max_runs_per_tenant: int = field(
        default=500,
        metadata=flag(
            "max-runs-per-tenant",
            "Runs of one tenant executing or queued at once in this process.",
            minimum=1,
        ),
    )
    """Runs of one tenant executing or queued at once."""
    stream_buffer: int = field(
        default=1_024,
        metadata=flag(
            "stream-buffer-events",
            "Events buffered per stream for a slow reader. When full, deltas are dropped; a "
            "durable event that does not fit ends the stream with RESOURCE_EXHAUSTED, and the "
            "reader re-attaches with StreamRun(after_seq) without losing anything.",
            minimum=1,
        ),
    )
    """Events buffered per stream (see `runs.live.Subscription`)."""
    max_streams_per_run: int = field(
        default=64,
        metadata=flag(
            "max-streams-per-run",
            "Streams attached to one live run at once (StartRun attaches and StreamRun followers).",
            minimum=1,
        ),
    )
    """Streams attached to one live run at once (a follower costs ≈60 KB)."""
