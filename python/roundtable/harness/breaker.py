"""Circuit breakers, one per target, shared by every run of the process."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum

from roundtable.harness.policies import BreakerPolicy, is_system_failure

StateListener = Callable[[str, "BreakerState"], None]
"""Told (target, new state) on every change; metrics hook here."""


class BreakerState(StrEnum):
    """Where a breaker is."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Opens after consecutive system failures; lets one probe through after a cool-down."""

    def __init__(
        self,
        target: str,
        policy: BreakerPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        listener: StateListener | None = None,
    ) -> None:
        self.target = target
        self.policy = policy
        self.state = BreakerState.CLOSED
        self._clock = clock
        self._listener = listener
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False

    def allow(self) -> bool:
        """Whether a call may go to the target now (and, half-open, claims the one probe)."""
        if self.state is BreakerState.OPEN:
            if self._clock() - self._opened_at < self.policy.cooldown_s:
                return False
            self._set(BreakerState.HALF_OPEN)
        if self.state is BreakerState.HALF_OPEN:
            if self._probing:
                return False
            self._probing = True
        return True

    def on_success(self) -> None:
        """A call succeeded: the target is healthy."""
        self._failures = 0
        self._probing = False
        if self.state is not BreakerState.CLOSED:
            self._set(BreakerState.CLOSED)

    def on_failure(self, error: BaseException) -> None:
        """A call failed; only system failures count towards opening."""
        self._probing_done()
        if not is_system_failure(error):
            return
        self._failures += 1
        if self.state is BreakerState.HALF_OPEN or self._failures >= self.policy.failure_threshold:
            self._opened_at = self._clock()
            self._set(BreakerState.OPEN)

    def on_abandon(self) -> None:
        """The call was cancelled: neither success nor failure, but the probe slot is free."""
        self._probing_done()

    def _probing_done(self) -> None:
        self._probing = False

    def _set(self, state: BreakerState) -> None:
        self.state = state
        if self._listener is not None:
            self._listener(self.target, state)


class BreakerBoard:
    """The breakers of the process, created on first use."""

    def __init__(
        self,
        policy: BreakerPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        listener: StateListener | None = None,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._listener = listener
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, target: str) -> CircuitBreaker:
        """The breaker of a target."""
        breaker = self._breakers.get(target)
        if breaker is None:
            breaker = CircuitBreaker(
                target, self.policy, clock=self._clock, listener=self._listener
            )
            self._breakers[target] = breaker
        return breaker
