"""The runs this process executes now: found by key or thread, bounded, drained at shutdown."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from roundtable.domain.errors import TooManyRuns
from roundtable.domain.events import SHUTDOWN_REASON
from roundtable.domain.limits import RunLimits
from roundtable.runs.live import LiveRun
from roundtable.runs.threads import LocalRun

if TYPE_CHECKING:
    from roundtable.runs.execution import Launch


class LiveRegistry:
    """The live runs of this process, by (tenant, run_id) and by thread."""

    def __init__(self, limits: RunLimits) -> None:
        self.limits = limits
        self._live: dict[tuple[str, str], LiveRun] = {}
        self._threads: dict[tuple[str, str], list[LiveRun]] = {}
        """Each thread's live runs in this process, oldest first."""
        self._per_tenant: Counter[str] = Counter()
        self._parked: dict[tuple[str, str], Launch] = {}
        self._parked_view = MappingProxyType(self._parked)
        """Runs waiting for a person's decision, with how they were launched (their
        credentials stay in memory, never stored): found by key, streams attached, but
        no task, no graph, and no place among the runs executing."""
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self.on_wake: Callable[[LiveRun], object] | None = None
        """Called when a parked run's first request expires (`Parking` resumes it)."""
        self.on_stop: Callable[[LiveRun], object] | None = None
        """Called when a parked run is asked to stop by a new turn of its thread (the
        `Parking` resumes it, its waiting calls denied, to end it)."""
        self.on_park: Callable[[], object] | None = None
        """Called when a run parks (`Parking` starts its watch of parked runs unless it is
        on)."""
        self.on_room: Callable[[], object] | None = None
        """Called when a run here stops executing (it ended or parked): `Parking` resumes
        the parked runs that were to go on while there was no room for them."""
        self.draining = False
        """Set once the server shuts down: no run starts any more."""

    def get(self, tenant: str, run_id: str) -> LiveRun | None:
        """The live run, if this process executes it."""
        return self._live.get((tenant, run_id))

    def busy(self, tenant: str, thread_id: str) -> list[LocalRun]:
        """The thread's runs here that have not ended, oldest first."""
        runs = self._threads.get((tenant, thread_id), ())
        return [
            LocalRun(live, self.on_stop if live.key in self._parked else None)
            for live in runs
            if not live.done.is_set()
        ]

    def check_capacity(self, tenant: str) -> None:
        """Raises TooManyRuns when one more run would pass a limit."""
        executing = len(self._live) - len(self._parked)
        if executing >= self.limits.max_runs:
            raise TooManyRuns(f"{executing} runs in this process")
        if self._per_tenant[tenant] >= self.limits.max_runs_per_tenant:
            raise TooManyRuns(f"{self._per_tenant[tenant]} runs of this tenant")

    def add(self, live: LiveRun) -> None:
        """Registers a run about to execute."""
        self._per_tenant[live.record.tenant] += 1
        self._live[live.key] = live
        self._threads.setdefault(live.thread_key, []).append(live)

    def park(self, live: LiveRun, launch: Launch, wake_at: float) -> None:
        """Keeps a run whose execution parked for approval: its streams stay attached (idle)
        and it gives up its place among the runs executing. At `wake_at` (its first
        request's expiry) `on_wake` resumes it: one timer, no task, per waiting run."""
        if self.draining:
            # Parked as the process stops (a call asked for during the drain's grace): as
            # for the runs parked before it, nothing runs, and its streams end.
            self.forget(live)
            return
        if self._live.get(live.key) is live and live.key not in self._parked:
            self._per_tenant[live.record.tenant] -= 1
            self._parked[live.key] = launch
            self._made_room()
        live.task = None
        # Its events are in the log: a stream attached later reads them from there, and a
        # run may wait for days.
        live.backlog = []
        if self.on_park is not None:
            self.on_park()
        if self.on_wake is not None and wake_at:
            loop = asyncio.get_running_loop()
            delay = max(0.0, wake_at - time.time())
            self._timers[live.key] = loop.call_later(delay, self.on_wake, live)

    def _made_room(self) -> None:
        if self.on_room is not None and not self.draining:
            self.on_room()

    def wake(self, live: LiveRun) -> None:
        """Resumes a parked run now (through `on_wake`), as its expiry would."""
        if self.on_wake is not None and live.key in self._parked:
            self.on_wake(live)

    def parked_keys(self) -> Mapping[tuple[str, str], Launch]:
        """The runs parked here, by (tenant, run_id), with how each was launched (a new
        object at each park): a live, read-only view, not a copy (the parked-run watch asks
        for it every 0.2 s)."""
        return self._parked_view

    def parked(self, tenant: str, run_id: str) -> Launch | None:
        """How a parked run was launched, when this process holds it parked."""
        return self._parked.get((tenant, run_id))

    def unpark(self, live: LiveRun) -> Launch:
        """Takes a parked run back among the runs executing (its decision came). It goes on
        whatever the limits when a run of its thread queued behind it here holds a place
        waiting for it to end (else neither could ever go on), and when it was stopped (a
        cancel, 停止): it only writes its end, and must not wait for a place to do that.

        Raises:
            TooManyRuns: the process or the tenant runs as many runs as it may.
            KeyError: the run is not parked here.
        """
        launch = self._parked[live.key]
        waited_for = any(
            other is not live and other.key not in self._parked and not other.done.is_set()
            for other in self._threads.get(live.thread_key, ())
        )
        if not waited_for and not live.stop.requested:
            self.check_capacity(live.record.tenant)
        del self._parked[live.key]
        timer = self._timers.pop(live.key, None)
        if timer is not None:
            timer.cancel()
        self._per_tenant[live.record.tenant] += 1
        return launch

    def forget(self, live: LiveRun) -> None:
        """Unregisters a run whose execution ended, and ends its streams."""
        if self._live.pop(live.key, None) is live and self._parked.pop(live.key, None) is None:
            self._per_tenant[live.record.tenant] -= 1
            self._made_room()
        timer = self._timers.pop(live.key, None)
        if timer is not None:
            timer.cancel()
        runs = self._threads.get(live.thread_key)
        if runs is not None and live in runs:
            runs.remove(live)
            if not runs:
                del self._threads[live.thread_key]
        live.finish()

    async def drain(self, grace_s: float) -> None:
        """Stops taking runs, lets live ones reach a speaker boundary, interrupts the rest."""
        self.draining = True
        for key in list(self._parked):
            # Nothing runs: its streams end (send the same StartRun, here or elsewhere).
            self.forget(self._live[key])
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
        return len(self._live) - len(self._parked)
