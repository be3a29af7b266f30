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
    """Opens after consecutive system failures; lets one probe through after a cool-down.

    Every call `allow()` lets through ends with exactly one of `on_success`, `on_failure`
    or `on_abandon`, given the `probe_id` read right after `allow()`: the breaker counts the
    calls out (a board never drops a breaker a call will report to) and knows which probe
    a failing one was (only the current half-open spell's probe may reopen it or free its
    slot, not a probe of an earlier spell that ends late).
    """

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
        self._spell = 0
        """The number of the latest probe let through (one per half-open spell)."""
        self.calls_out = 0
        """Calls let through that have not reported their end yet."""

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
            self._spell += 1
        self.calls_out += 1
        return True

    @property
    def probe_id(self) -> int:
        """Read right after `allow()`: the probe that call is (the only call a half-open
        breaker lets through), or 0 when it is no probe. Pass it to the call's end."""
        return self._spell if self.state is BreakerState.HALF_OPEN and self._probing else 0

    def on_success(self) -> None:
        """A call succeeded: the target is healthy."""
        self._ended()
        self._failures = 0
        self._probing = False
        if self.state is not BreakerState.CLOSED:
            self._set(BreakerState.CLOSED)

    def on_failure(self, error: BaseException, *, probe: int = 0) -> None:
        """A call failed; only system failures count towards opening. A call that is not the
        current probe failing while the breaker is not closed (let through before it opened,
        or an earlier spell's probe) tells nothing new: it neither frees the probe's slot nor
        opens the breaker again."""
        self._ended()
        if self.state is not BreakerState.CLOSED and not self._is_current(probe):
            return
        self._probing = False
        # A rejection (4xx) neither counts nor restarts the count: a server's auth layer
        # answers while its inference is down, so one tenant with a revoked key would
        # keep the breaker every tenant shares from ever opening.
        if not is_system_failure(error):
            return
        self._failures += 1
        if self.state is BreakerState.HALF_OPEN or self._failures >= self.policy.failure_threshold:
            self._opened_at = self._clock()
            self._set(BreakerState.OPEN)

    def on_abandon(self, *, probe: int = 0) -> None:
        """The call was cancelled: neither success nor failure; the current probe's slot is
        free."""
        self._ended()
        if self._is_current(probe):
            self._probing = False

    def _is_current(self, probe: int) -> bool:
        return bool(probe) and probe == self._spell and self.state is BreakerState.HALF_OPEN

    def _ended(self) -> None:
        self.calls_out = max(0, self.calls_out - 1)

    def _set(self, state: BreakerState) -> None:
        self.state = state
        if self._listener is not None:
            self._listener(self.target, state)


MAX_BREAKERS = 1024
"""Breakers a board keeps; past it, the least recently used with no call out go."""


class BreakerBoard:
    """The breakers of the process, created on first use.

    Requests name their targets (a model and a server URL, a tool server's URL), so the
    board would grow with every target any tenant ever named, failing ones included (a
    one-off dead URL opens its breaker and is never asked again). Past `max_breakers`, the
    least recently used with no call out go, whatever their state: a target still asked
    for keeps its place (each `get` moves it to the end), so an outage that callers still
    meet is not forgotten; one nobody asked for since is, and comes back fresh.
    """

    def __init__(
        self,
        policy: BreakerPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        listener: StateListener | None = None,
        max_breakers: int = MAX_BREAKERS,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._listener = listener
        self._max = max_breakers
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
        if len(self._breakers) >= self._max:
            self._drop_least_recent()
        breaker = CircuitBreaker(target, self.policy, clock=self._clock, listener=self._listener)
        self._breakers[target] = breaker
        return breaker

    def _drop_least_recent(self) -> None:
        """Drops the least recently used breakers with no call out, down to three quarters
        of the limit: the scan stops there, so a get pays for it once per many gets."""
        excess = len(self._breakers) - self._max * 3 // 4
        victims: list[str] = []
        for key, breaker in self._breakers.items():
            if len(victims) >= excess:
                break
            if not breaker.calls_out:
                victims.append(key)
        for key in victims:
            del self._breakers[key]
