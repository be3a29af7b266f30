"""Runs parked for approval in this process: resuming them, waking them, ending them.

A run whose speaker waits for a person's decision parks (`graph.context.Parked`): its
execution ends, its `LiveRun` stays in the registry with its streams (and its snapshot and
credentials, in memory only), and it gives up its place among the runs executing. It goes
on when a decision is recorded here (ResolvePermission), when its first request expires
(one timer), when another replica records a decision or a cancel (the coordination's
watch, on a shared store), or when it is cancelled. A run that is to go on while the
process runs as many runs as it may goes on as soon as one of them ends or parks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from roundtable.domain.errors import TooManyRuns
from roundtable.domain.tools import CallStatus
from roundtable.runs.approvals import cancel_waiting
from roundtable.runs.coordination import Coordination
from roundtable.runs.elsewhere import DormantRun
from roundtable.runs.execution import Executor
from roundtable.runs.live import LiveRun
from roundtable.runs.log import EventLog
from roundtable.runs.progress import Progress, cancelled_event
from roundtable.runs.registry import LiveRegistry
from roundtable.runs.threads import BusyRun
from roundtable.store.base import LeaseLost, RunRecord, RunStatus

log = logging.getLogger(__name__)

RETRY_UNPARK_S = 1.0
"""How soon a run whose resume failed on a store error tries again."""


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
        self._no_room: dict[tuple[str, str], LiveRun] = {}
        """Parked runs that were to go on (a decision, an expiry or a cancel came) while
        this process had no room for another executing run, in that order."""
        self._retry: asyncio.Task[None] | None = None
        self._room_freed = False
        """A run stopped executing since the retry's pass began (`_room`)."""
        registry.on_wake = self.wake
        registry.on_park = self._watching
        registry.on_stop = self._stop_soon
        registry.on_room = self._room

    def _watching(self) -> None:
        """Starts the coordination's watch of parked runs at a park, unless it is on: it
        ends by itself once nothing is parked (between its polls, never while a park
        could slip by it: both run on the loop, the watch looks after every sleep)."""
        if not self._closed and (self._watch is None or self._watch.done()):
            self._watch = self.coordination.watch_parked(self.registry.parked_keys, self._wake_key)

    def _wake_key(self, key: tuple[str, str], cancelled: bool) -> None:
        if key in self._no_room and not cancelled:
            # It has its decision and goes on when a place frees (`_room`): woken at each
            # poll it only found no room again, a lock and a read of its row every 0.2 s
            # (review). A cancel it takes at once: a stopped run needs no place.
            return
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
        task = asyncio.create_task(self._unpark_or_log(live))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unpark_or_log(self, live: LiveRun) -> None:
        """`unpark`, where nobody waits for it: a store error is logged (the run stays
        parked and tries again by itself)."""
        try:
            await self.unpark(live)
        except Exception as exc:
            log.warning("run %s could not resume: %s", live.record.run_id, type(exc).__name__)

    async def unpark(self, live: LiveRun) -> None:
        """Resumes a run parked here (a decision came, its expiry, or a cancel). Without room
        for it now, it goes on as soon as a run here ends or parks (`_room`). Either way it
        goes on without another StartRun; so too where another replica took it over while
        this one could not renew its lease (its streams here end with RunOrphaned, and the
        same StartRun follows it there)."""
        async with self.lock:
            if self._closed or self.registry.parked(*live.key) is None:
                self._no_room.pop(live.key, None)
                return  # resumed already (two decisions at once), ended, or stopping
            try:
                launch = self.registry.unpark(live)
            except TooManyRuns:
                # Waiting for room before the look below: a place freed during it finds
                # this run (review: it was lost, and the watch no longer wakes it).
                self._no_room[live.key] = live
                # A stopped run needs no place (it only writes its end), and a cancel
                # recorded by another replica woke it without stopping it here yet (review:
                # it waited for a place in a full process).
                reason = await self.coordination.cancel_recorded(live.record)
                if not reason:
                    return
                live.stop.request(reason)
                launch = self.registry.unpark(live)
            self._no_room.pop(live.key, None)
            try:
                resumed = await self.log.store.resume_parked(
                    live.record, self.coordination.owner, self.lease_s
                )
            except BaseException:
                if self._closed or self.registry.draining:
                    # The process is stopping: let it go as drain lets the parked ones go
                    # (its streams end; the same StartRun resumes it elsewhere or later).
                    self.registry.forget(live)
                else:
                    # A store error: it stays parked and tries again in a second.
                    self.registry.park(live, launch, time.time() + RETRY_UNPARK_S)
                raise
            if not resumed:
                # Another replica has it now: this one's lease ran out while it kept the
                # run parked (its renewals failed), and a StartRun there took it over (and
                # perhaps ended it). Its row and its log are that replica's to write.
                live.lease_lost = True
                self.registry.forget(live)
                return
            self.executor.launch(
                live, dataclasses.replace(launch, resumed=True, unparks=True, wait_for=None)
            )

    def _room(self) -> None:
        """A run here stopped executing: the runs that were to go on meanwhile try again,
        oldest first, in one task (those that still find no room keep their place)."""
        self._room_freed = True
        if self._no_room and not self._closed and (self._retry is None or self._retry.done()):
            self._retry = asyncio.create_task(self._resume_waiting_for_room())

    async def _resume_waiting_for_room(self) -> None:
        # Another pass when a run stopped executing during this one: the place it freed
        # may have come after the waiting run that tried it.
        while self._no_room and self._room_freed:
            self._room_freed = False
            for live in list(self._no_room.values()):
                await self._unpark_or_log(live)

    async def cancel(self, live: LiveRun) -> None:
        """Cancels a run parked here: its waiting calls count as denied, and it goes on to
        run_cancelled at the speaker boundary where it waits. Once they are denied the
        cancel stands: a store error as the run goes back to running leaves it parked to
        try again by itself (`unpark`), and is not the caller's."""
        await cancel_waiting(self.log.store, *live.key)
        await self._unpark_or_log(live)

    async def cancel_elsewhere(self, record: RunRecord, progress: Progress, reason: str) -> bool:
        """Cancels a waiting run this process does not hold. Another replica keeps it
        parked: the cancel is recorded for it (its watch wakes it). Nobody does (its server
        stopped): its log is closed here with run_cancelled, and `record` updated in place
        (`progress`, read from its log, does not change with a run_cancelled). False when
        it moved on."""
        store, owner = self.log.store, self.coordination.owner
        await cancel_waiting(store, record.tenant, record.run_id)
        if record.leased_by_other(owner, time.time()):
            return await store.request_cancel(record.tenant, record.run_id, "graceful", reason)
        current = await store.get_run(record.tenant, record.run_id)
        if current is None or (current.status, current.last_seq) != (
            RunStatus.AWAITING_APPROVAL,
            record.last_seq,
        ):
            return False  # it moved on since it was read (review: a second run_cancelled)
        if not await store.acquire_lease(record.tenant, record.run_id, owner, self.lease_s):
            return False
        try:
            await self.log.end(
                record, cancelled_event(reason, progress), RunStatus.CANCELLED, owner
            )
        except LeaseLost:
            return False  # another replica took it meanwhile
        return True

    async def dormant(self, record: RunRecord) -> BusyRun | None:
        """A run waiting for approval that no process holds, as a busy run of its thread
        (`elsewhere.DormantRun`, minded until its first call expires); None when this
        process holds it (in the registry)."""
        if self.registry.get(record.tenant, record.run_id) is not None:
            return None
        calls = await self.log.store.tool_calls(record.tenant, record.run_id)
        # Waiting for a person, or decided and waiting for its run (review: approved while
        # nobody held the run, it no longer held its thread, and its write ran after a
        # turn that came later).
        asked = [
            c.expires_at for c in calls if c.needs_approval and c.status is CallStatus.REQUESTED
        ]
        return DormantRun(record, self, min(asked, default=0.0))

    def close(self) -> None:
        """Stops watching parked runs for good (the process is stopping: a run that parks
        while it drains stays parked, for the next replica or restart)."""
        self._closed = True
        for task in (self._watch, self._retry):
            if task is not None:
                task.cancel()
