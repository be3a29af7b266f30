"""Runs parked for approval in this process: resuming them, waking them, ending them.

A run whose speaker waits for a person's decision parks (`graph.context.Parked`): its
execution ends, its `LiveRun` stays in the registry with its streams (and its snapshot and
credentials, in memory only), and it gives up its place among the runs executing. It goes
on when a decision is recorded here (ResolvePermission), when its first request expires
(one timer), when another replica records a decision or a cancel (the coordination's
watch, on a shared store), or when it is cancelled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from roundtable.domain.errors import TooManyRuns
from roundtable.runs.approvals import cancel_calls
from roundtable.runs.coordination import Coordination
from roundtable.runs.execution import Executor
from roundtable.runs.live import LiveRun
from roundtable.runs.log import EventLog
from roundtable.runs.progress import Progress, cancelled_event
from roundtable.runs.registry import LiveRegistry
from roundtable.store.base import LeaseLost, RunRecord, RunStatus


class Parking:
    """Resumes, wakes and cancels the runs parked in this process."""

    def __init__(
        self,
        *,
        log: EventLog,
        registry: LiveRegistry,
        coordination: Coordination,
        executor: Executor,
        lock: asyncio.Lock,
        lease_s: float,
    ) -> None:
        self.log = log
        self.registry = registry
        self.coordination = coordination
        self.executor = executor
        self.lock = lock
        """The run manager's: a resume and a StartRun of the same run never interleave."""
        self.lease_s = lease_s
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watch: asyncio.Task[None] | None = None
        self._closed = False
        """The process is stopping: no watch starts again (`close`)."""
        registry.on_wake = self.wake
        registry.on_park = self._watching
        registry.on_stop = self._stop_soon

    def _watching(self) -> None:
        """Starts the coordination's watch of parked runs at a park, unless it is on: it
        ends by itself once nothing is parked (between its polls, never while a park
        could slip by it: both run on the loop, the watch looks after every sleep)."""
        if not self._closed and (self._watch is None or self._watch.done()):
            self._watch = self.coordination.watch_parked(self.registry.parked_keys, self._wake_key)

    def _wake_key(self, key: tuple[str, str]) -> None:
        live = self.registry.get(*key)
        if live is not None:
            self.wake(live)

    def _stop_soon(self, live: LiveRun) -> None:
        """A new turn of the thread stops a run parked here (its stop is requested): in a
        task, since the turn holds the lock a resume takes."""
        task = asyncio.create_task(self.cancel(live))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def wake(self, live: LiveRun) -> None:
        """Resumes a parked run in a task of its own (a timer or a watch calls this)."""
        task = asyncio.create_task(self.unpark(live))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def unpark(self, live: LiveRun) -> bool:
        """Resumes a run parked here (a decision came, or a cancel); False when it cannot
        start now (no room: it stays parked, its decision recorded)."""
        async with self.lock:
            if self.registry.parked(*live.key) is None:
                return True  # resumed already (two decisions at once)
            try:
                launch = self.registry.unpark(live)
            except TooManyRuns:
                return False
            record, store = live.record, self.log.store
            await store.acquire_lease(
                record.tenant, record.run_id, self.coordination.owner, self.lease_s
            )
            record.status = RunStatus.RUNNING
            await store.update_run(record)
            self.executor.launch(
                live, dataclasses.replace(launch, resumed=True, unparks=True, wait_for=None)
            )
            return True

    async def cancel_waiting(self, tenant: str, run_id: str) -> None:
        """Records every waiting call of a run being cancelled as denied (`cancelled`)."""
        calls = await self.log.store.tool_calls(tenant, run_id)
        waiting = (c.call_key for c in calls if c.waiting)
        await cancel_calls(self.log.store, tenant, run_id, waiting)

    async def cancel(self, live: LiveRun) -> None:
        """Cancels a run parked here: its waiting calls count as denied, and it goes on to
        run_cancelled at the speaker boundary where it waits."""
        await self.cancel_waiting(*live.key)
        await self.unpark(live)

    async def cancel_elsewhere(self, record: RunRecord, progress: Progress, reason: str) -> bool:
        """Cancels a waiting run this process does not hold. Another replica keeps it
        parked: the cancel is recorded for it (its watch wakes it). Nobody does (its server
        stopped): its log is closed here with run_cancelled, and `record` updated in place
        (`progress`, read from its log, does not change with a run_cancelled). False when
        it moved on."""
        store, owner = self.log.store, self.coordination.owner
        await self.cancel_waiting(record.tenant, record.run_id)
        if record.leased_by_other(owner, time.time()):
            return await store.request_cancel(record.tenant, record.run_id, "graceful", reason)
        if not await store.acquire_lease(record.tenant, record.run_id, owner, self.lease_s):
            return False
        try:
            await self.log.end(
                record, cancelled_event(reason, progress), RunStatus.CANCELLED, owner
            )
        except LeaseLost:
            return False  # another replica took it meanwhile
        return True

    def close(self) -> None:
        """Stops watching parked runs for good (the process is stopping: a run that parks
        while it drains stays parked, for the next replica or restart)."""
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
