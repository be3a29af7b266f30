"""Circuit breakers, one per target, shared by every run of the process."""

from __future__ import annotations

import time
from collections import OrderedDict
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

    @property
    def idle(self) -> bool:
        """Closed, with no failure counted and no probe out: a fresh breaker is the same."""
        return self.state is BreakerState.CLOSED and not self._failures and not self._probing

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

    @property
    def probing(self) -> bool:
        """Half-open with its probe out: read right after `allow()`, whether that call is
        the probe (the only call a half-open breaker lets through)."""
        return self.state is BreakerState.HALF_OPEN and self._probing

    def on_failure(self, error: BaseException, *, probe: bool = False) -> None:
        """A call failed; only system failures count towards opening. A call let through
        before the breaker opened that fails after (`probe` False while not closed) tells
        nothing new: it neither frees the probe's slot nor opens the breaker again."""
        if self.state is not BreakerState.CLOSED and not probe:
            return
        self._probing_done()
        if not is_system_failure(error):
            return
        self._failures += 1
        if self.state is BreakerState.HALF_OPEN or self._failures >= self.policy.failure_threshold:
            self._opened_at = self._clock()
            self._set(BreakerState.OPEN)

    def on_abandon(self, *, probe: bool = False) -> None:
        """The call was cancelled: neither success nor failure; a probe's slot is free."""
        if probe or self.state is BreakerState.CLOSED:
            self._probing_done()

    def _probing_done(self) -> None:
        self._probing = False

    def _set(self, state: BreakerState) -> None:
        self.state = state
        if self._listener is not None:
            self._listener(self.target, state)


MAX_IDLE_BREAKERS = 1024
"""Closed breakers kept beyond this many, least recently used first, are dropped."""


class BreakerBoard:
    """The breakers of the process, created on first use.

    Requests name their targets (a model and a server URL, a tool server's URL), so the
    board would grow with every target any tenant ever named: past `max_idle` breakers, the
    least recently used closed ones without failures go (one comes back fresh, as it was).
    Open, half-open and failing ones stay: forgetting them would forget an outage.
    """

    def __init__(
        self,
        policy: BreakerPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        listener: StateListener | None = None,
        max_idle: int = MAX_IDLE_BREAKERS,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._listener = listener
        self._max_idle = max_idle
        self._breakers: OrderedDict[str, CircuitBreaker] = OrderedDict()

    @property
    def size(self) -> int:
        """How many breakers the board keeps (not `__len__`: an empty board is no None)."""
        return len(self._breakers)

    def get(self, target: str) -> CircuitBreaker:
        """The breaker of a target."""
        breaker = self._breakers.get(target)
        if breaker is not None:
            self._breakers.move_to_end(target)
            return breaker
        if len(self._breakers) >= self._max_idle:
            self._drop_idle()
        breaker = CircuitBreaker(target, self.policy, clock=self._clock, listener=self._listener)
        self._breakers[target] = breaker
        return breaker

    def _drop_idle(self) -> None:
        """Drops the least recently used breakers that remember nothing (closed, no
        failures, no probe), down to three quarters of the limit: one pass per many gets."""
        excess = len(self._breakers) - self._max_idle * 3 // 4
        for key in [k for k, b in self._breakers.items() if b.idle][:excess]:
            del self._breakers[key]
