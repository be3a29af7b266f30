"""The runs this process executes now: found by key or thread, bounded, drained at shutdown."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from roundtable.domain.errors import TooManyRuns
from roundtable.runs.live import LiveRun
from roundtable.runs.threads import LocalRun

SHUTDOWN_REASON = "server_shutdown"
"""The stop reason of runs a draining server interrupts (they resume on the same StartRun)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimits:
    """Backpressure: how much this process takes on."""

    max_runs: int = 2_000
    """Runs executing at once."""
    max_runs_per_tenant: int = 500
    """Runs of one tenant executing at once."""
    stream_buffer: int = 1_024
    """Events buffered per stream (see `live.Subscription`)."""
    max_streams_per_run: int = 64
    """Streams attached to one live run at once (a follower costs ≈60 KB)."""


class LiveRegistry:
    """The live runs of this process, by (tenant, run_id) and by thread."""

    def __init__(self, limits: RunLimits) -> None:
        self.limits = limits
        self._live: dict[tuple[str, str], LiveRun] = {}
        self._threads: dict[tuple[str, str], list[LiveRun]] = {}
        """Each thread's live runs in this process, oldest first."""
        self._per_tenant: Counter[str] = Counter()
        self.draining = False
        """Set once the server shuts down: no run starts any more."""

    def get(self, tenant: str, run_id: str) -> LiveRun | None:
        """The live run, if this process executes it."""
        return self._live.get((tenant, run_id))

    def busy(self, tenant: str, thread_id: str) -> list[LocalRun]:
        """The thread's runs here that have not ended, oldest first."""
        runs = self._threads.get((tenant, thread_id), ())
        return [LocalRun(live) for live in runs if not live.done.is_set()]

    def check_capacity(self, tenant: str) -> None:
        """Raises TooManyRuns when one more run would pass a limit."""
        if len(self._live) >= self.limits.max_runs:
            raise TooManyRuns(f"{len(self._live)} runs in this process")
        if self._per_tenant[tenant] >= self.limits.max_runs_per_tenant:
            raise TooManyRuns(f"{self._per_tenant[tenant]} runs of this tenant")

    def add(self, live: LiveRun) -> None:
        """Registers a run about to execute."""
        self._per_tenant[live.record.tenant] += 1
        self._live[live.key] = live
        self._threads.setdefault(live.thread_key, []).append(live)

    def forget(self, live: LiveRun) -> None:
        """Unregisters a run whose execution ended, and ends its streams."""
        if self._live.pop(live.key, None) is live:
            self._per_tenant[live.record.tenant] -= 1
        runs = self._threads.get(live.thread_key)
        if runs is not None and live in runs:
            runs.remove(live)
            if not runs:
                del self._threads[live.thread_key]
        live.finish()

    async def drain(self, grace_s: float) -> None:
        """Stops taking runs, lets live ones reach a speaker boundary, interrupts the rest."""
        self.draining = True
        runs = list(self._live.values())
        for live in runs:
            live.stop.request(SHUTDOWN_REASON)
        tasks = [live.task for live in runs if live.task is not None]
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._live)
