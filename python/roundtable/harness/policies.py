"""Harness policies: frozen values, configured by server settings and the snapshot's model refs."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from roundtable.domain.errors import (
    ModelError,
    ModelRateLimited,
    ModelTimeout,
    ToolError,
    ToolRateLimited,
    ToolTimeout,
)
from roundtable.domain.flags import flag


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutPolicy:
    """Per-attempt timeout: of silence for a streamed call, of the whole call otherwise."""

    default_s: float = field(
        default=60.0,
        metadata=flag(
            "model-timeout-seconds",
            "Per-attempt model timeout when a model ref sets none: how long an answer may "
            "be silent, before its first chunk or between two.",
            minimum=0.01,
        ),
    )
    """Seconds a streamed attempt may be silent, or an attempt that streams nothing may
    take, when the model ref sets no timeout of its own."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Retries of transient errors on one target."""

    max_retries: int = field(
        default=2,
        metadata=flag(
            "model-max-retries", "Retries of transient model errors on one target.", minimum=0
        ),
    )
    """Retries after the first attempt (so at most 1 + max_retries attempts)."""
    initial_backoff_s: float = field(
        default=0.2,
        metadata=flag(
            "model-retry-backoff-seconds",
            "First retry backoff; doubles per retry, with jitter.",
            minimum=0,
        ),
    )
    """Seconds before the first retry; doubles for each further retry."""
    max_backoff_s: float = 2.0
    """Upper bound of one backoff, in seconds."""
    jitter: float = 0.2
    """Fraction of the backoff added or removed at random, so retries do not align."""
    max_retry_after_s: float = 10.0
    """Longest wait a 429's Retry-After may impose before a retry on the same target; a
    longer one ends the target's attempts at once (failover moves on)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerPolicy:
    """Circuit breaker per target (`llm:<provider>:<model>`, and its server's URL if set)."""

    failure_threshold: int = field(
        default=5,
        metadata=flag(
            "breaker-failure-threshold",
            "Consecutive system failures that open a target's circuit breaker.",
            minimum=1,
        ),
    )
    """Consecutive system failures that open the breaker."""
    cooldown_s: float = field(
        default=30.0,
        metadata=flag(
            "breaker-cooldown-seconds",
            "Seconds before an open breaker lets one probe through.",
            minimum=0,
        ),
    )
    """Seconds an open breaker waits before letting one probe through (half-open)."""


def backoff_s(policy: RetryPolicy, retry: int, rng: random.Random) -> float:
    """Seconds to wait before retry number `retry` (from 1): exponential, capped, jittered."""
    base = min(policy.initial_backoff_s * 2.0 ** (retry - 1), policy.max_backoff_s)
    spread: float = policy.jitter * (2 * rng.random() - 1)
    return max(0.0, base * (1 + spread))


@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessPolicy:
    """All harness policies together."""

    timeout: TimeoutPolicy = TimeoutPolicy()
    retry: RetryPolicy = RetryPolicy()
    breaker: BreakerPolicy = BreakerPolicy()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolTimeoutPolicy:
    """Per-attempt tool timeout."""

    default_s: float = 30.0
    """Seconds an attempt may take when the tool sets no timeout of its own."""

    def seconds_for(self, tool_timeout_s: float | None) -> float:
        """The bound of one attempt: the tool's own timeout, else the default."""
        return tool_timeout_s or self.default_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolPolicy:
    """The tool harness's policies. Retries apply to read-only tools only; the breaker is
    per tool server (`mcp:<url>`, `tool_layers.breaker_key`)."""

    timeout: ToolTimeoutPolicy = ToolTimeoutPolicy()
    retry: RetryPolicy = RetryPolicy()
    breaker: BreakerPolicy = BreakerPolicy()


def is_transient(error: BaseException) -> bool:
    """Whether an error may go away by itself: timeouts, 429, 5xx, connection errors.

    A 4xx or an answer that failed validation is not transient: retrying cannot help.
    Model and tool calls alike (a tool server that is down or slow is transient).
    """
    return isinstance(error, ModelError | ToolError) and error.retryable


def is_system_failure(error: BaseException) -> bool:
    """Whether an error says the target is unhealthy (what a breaker counts).

    A 429 does not: it is about the caller's key or quota (one tenant's), not the server's
    health, and counting it would let one tenant's rate limit refuse every tenant's calls.
    Nor does a timeout of a deadline the caller set shorter than the server's default
    (`ModelTimeout.callers_deadline`): a tenant's 1 ms timeout would open the breaker of a
    healthy model for everyone. Both are still retried and failed over (`is_transient`).
    """
    if isinstance(error, ModelTimeout | ToolTimeout) and error.callers_deadline:
        return False
    return is_transient(error) and not isinstance(error, ModelRateLimited | ToolRateLimited)
