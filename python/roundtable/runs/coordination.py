"""How a run's execution is coordinated with other processes: the one part that differs
between a single process on SQLite and replicas on Postgres.

The composition root picks one strategy and the rest of runs/ never asks which it got:

- `LocalCoordination`: a SQLite file belongs to one process (a file lock says so), so
  there is nobody to lock a thread against, fence out, or hear a cancel from; runs a dead
  process left running are closed at start-up, and those it left waiting for approval
  take part in the busy-thread policy (read from the store at each StartRun).
- `SharedCoordination`: replicas share the registry. A thread is locked while a StartRun
  checks it; a live run keeps a lease (renewed every third of it) and stops when it loses
  it; a cancel another replica records is polled at speaker boundaries and while queued;
  a thread's runs on other replicas, and those parked for approval whose replica died,
  take part in the busy-thread policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol

from roundtable.domain.snapshot import RunRequest
from roundtable.graph.context import StopSignal
from roundtable.runs.elsewhere import RemoteRun
from roundtable.runs.follow import PARKED_POLL_MAX_S
from roundtable.runs.live import LiveRun
from roundtable.runs.log import EventLog
from roundtable.runs.threads import BusyRun
from roundtable.store.base import LEASED, CancelMark, RunRecord, RunStatus, RunStore

log = logging.getLogger(__name__)

Accept = Callable[[CancelMark | None], None]
"""Called with an appended event's cancel mark once the event is in the log."""


ParkedKeys = Callable[[], Mapping[tuple[str, str], object]]
"""The runs this process keeps parked now, by (tenant, run_id): each with a token of its
park (another object once it was resumed and parked again)."""
Wake = Callable[[tuple[str, str], bool], None]
"""Resumes a run this process keeps parked; the flag says a cancel is recorded for it (a
run that waits for room for its decision goes on before then only for one)."""


class CancelMarks(Protocol):
    """What a run's sink tells about the cancel its last append saw (`RunSink`)."""

    def take_cancel_mark(self) -> tuple[bool, CancelMark | None]:
        """Whether an event was appended since the last call, and the mark it saw."""
        ...


Dormant = Callable[[RunRecord], Awaitable[BusyRun | None]]
"""Makes a busy run of a run waiting for approval under no live lease (its process ended),
or None when this process holds it after all."""


class Coordination(Protocol):
    """The differing part of a run's life between one process and several replicas."""

    owner: str
    """This process's id in leases and appends."""

    async def hold_thread(
        self, tenant: str, thread_id: str, guard: contextlib.AsyncExitStack
    ) -> None:
        """Holds the thread against other replicas' StartRuns until `guard` closes."""
        ...

    async def busy_elsewhere(self, request: RunRequest, dormant: Dormant) -> list[BusyRun]:
        """The thread's runs that other processes execute now, and those waiting for
        approval that no process holds (`dormant` makes them busy runs, or None for one
        this process holds)."""
        ...

    async def append(self, append: Awaitable[CancelMark | None], accept: Accept) -> None:
        """Awaits an append to the event log and hands its result to `accept`, unless it
        never committed (a cancel while it waited)."""
        ...

    def attend(self, live: LiveRun, marks: CancelMarks) -> asyncio.Task[None] | None:
        """Starts what keeps a live run coordinated while it executes; the returned task
        (if any) is cancelled when the execution ends."""
        ...

    def watch_queued(self, stop: StopSignal) -> asyncio.Task[None] | None:
        """Watches for a cancel recorded elsewhere while a run waits in a thread's queue."""
        ...

    async def close_interrupted(self, runs: Iterable[tuple[str, str]], log: EventLog) -> None:
        """Closes the logs of runs start-up found left running by a dead process."""
        ...

    def sweep_interrupted(self) -> asyncio.Task[None] | None:
        """What marks, while this process serves, the runs a dead process left running."""
        ...

    def park_holder(self) -> tuple[str, float]:
        """Who keeps a run parked for approval in the registry, and until when: this
        process (while its lease is renewed) where replicas share the store."""
        ...

    def watch_parked(self, parked: ParkedKeys, wake: Wake) -> asyncio.Task[None] | None:
        """Keeps the runs parked here leased, and wakes one when a decision or a cancel
        for it is recorded by another replica (None: every decision lands here)."""
        ...

    async def cancel_recorded(self, record: RunRecord) -> str:
        """The reason of a cancel another replica recorded for this run ("" for none)."""
        ...


class LocalCoordination:
    """One process owns the store: nothing to lock, lease, fence or poll; only the runs an
    earlier process left waiting for approval are read back (`busy_elsewhere`)."""

    def __init__(self, store: RunStore, owner: str) -> None:
        self.store = store
        self.owner = owner

    async def hold_thread(
        self, tenant: str, thread_id: str, guard: contextlib.AsyncExitStack
    ) -> None:
        """Nothing to hold: this process's own runs are known in memory."""

    async def busy_elsewhere(self, request: RunRequest, dormant: Dormant) -> list[BusyRun]:
        """No other process runs this store's runs; but runs that an earlier process left
        waiting for approval still wait (review: after a restart, 停止 did not stop such a
        run, and a person then approved its write)."""
        ctx = request.context
        waiting = await self.store.live_thread_runs(
            ctx.tenant, ctx.thread_id, exclude_run_id=ctx.run_id, owner=self.owner, now=time.time()
        )
        return [run for record in waiting if (run := await dormant(record)) is not None]

    async def append(self, append: Awaitable[CancelMark | None], accept: Accept) -> None:
        """SQLite's append can only wait before it writes (a WAL checkpoint's last pass): a
        cancel there leaves nothing written, and the event unnumbered."""
        accept(await append)

    def attend(self, live: LiveRun, marks: CancelMarks) -> asyncio.Task[None] | None:
        """Leases only matter where other replicas share the store; renewing one here would
        be a task and a write every lease/3 per live run for nothing."""
        return None

    def watch_queued(self, stop: StopSignal) -> asyncio.Task[None] | None:
        """Cancels reach a queued run in memory."""
        return None

    async def close_interrupted(self, runs: Iterable[tuple[str, str]], log: EventLog) -> None:
        """Each run gets the run_failed (RUN_INTERRUPTED, retryable) its execution never
        wrote, so a stream of one ends in a terminal event that says "send the same
        StartRun". Safe here: this process alone serves the file."""
        for tenant, run_id in runs:
            await log.close_if_open(tenant, run_id)

    def park_holder(self) -> tuple[str, float]:
        """Nobody: a parked run is this process's, in memory, or (after a restart) the
        next StartRun's."""
        return "", 0.0

    def sweep_interrupted(self) -> asyncio.Task[None] | None:
        """Nothing: the file is this process's, and its start marked a dead one's runs."""
        return None

    def watch_parked(self, parked: ParkedKeys, wake: Wake) -> asyncio.Task[None] | None:
        """ResolvePermission always lands in the process that holds the run."""
        return None

    async def cancel_recorded(self, record: RunRecord) -> str:
        """CancelRun always lands in the process that holds the run."""
        return ""


class SharedCoordination:
    """Replicas on one shared store: thread locks, leases, owner fences, remote cancels."""

    def __init__(
        self, store: RunStore, *, owner: str, lease_s: float, poll_s: float = 0.05
    ) -> None:
        self.store = store
        self.owner = owner
        self.lease_s = lease_s
        self.poll_s = poll_s
        """How often a waiting run or a follower asks the store again (seconds)."""
        self.parked_poll_s = 0.2
        """How often the runs parked here are checked for decisions made elsewhere."""

    async def hold_thread(
        self, tenant: str, thread_id: str, guard: contextlib.AsyncExitStack
    ) -> None:
        """Replicas check a thread's runs and record the new one in turn, so two StartRuns
        of one thread on two replicas never both see it idle."""
        await guard.enter_async_context(self.store.thread_lock(tenant, thread_id))

    async def busy_elsewhere(self, request: RunRequest, dormant: Dormant) -> list[BusyRun]:
        """The thread's runs (running, queued, or parked for approval) under another
        replica's live lease, and the runs parked for approval whose replica died (its
        lease ran out): they wait for their StartRun again, one query for both."""
        ctx = request.context
        now = time.time()
        busy = await self.store.live_thread_runs(
            ctx.tenant, ctx.thread_id, exclude_run_id=ctx.run_id, owner=self.owner, now=now
        )
        return [
            run
            for record in busy
            if (
                run := RemoteRun(self, record)
                if record.leased_by_other(self.owner, now)
                else await dormant(record)
            )
            is not None
        ]

    async def append(self, append: Awaitable[CancelMark | None], accept: Accept) -> None:
        """Over the network a cancel can land after the row was committed: the statement
        is let finish, and an event it committed is numbered and streamed before the
        cancel goes on (else the run's last event would reuse its seq)."""
        task = asyncio.ensure_future(append)
        try:
            mark = await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # not committed: nothing to number
                accept(await task)
            raise
        accept(mark)

    def attend(self, live: LiveRun, marks: CancelMarks) -> asyncio.Task[None] | None:
        """Keeps the run's lease and hears cancels recorded by other replicas: at every
        speaker boundary (the stop signal's poller) and, for immediate ones, with each
        renewal."""
        record = live.record
        live.stop.poller = lambda now: self.remote_cancel(record, marks=None if now else marks)
        return asyncio.create_task(self._keep_lease(live), name=f"lease:{record.run_id}")

    def watch_queued(self, stop: StopSignal) -> asyncio.Task[None] | None:
        """Asks the store for a cancel recorded elsewhere every `poll_s` until one is found
        (a waiting run passes no speaker boundary)."""

        async def poll() -> None:
            while not stop.requested:
                await asyncio.sleep(self.poll_s)
                await stop.refresh()

        return asyncio.create_task(poll())

    async def close_interrupted(self, runs: Iterable[tuple[str, str]], log: EventLog) -> None:
        """Nothing: a replica may be resuming such a run at this very moment, and that
        resume closes the log itself."""

    def sweep_interrupted(self) -> asyncio.Task[None] | None:
        """Every lease, marks the runs of dead replicas interrupted (running or queued, their
        lease run out a lease ago), as a replica's start does. Only at start, a replica
        restarted within its lease left its old runs RUNNING for good (outside testing:
        继续 found nothing to continue, CancelRun said they had ended)."""
        return asyncio.create_task(self._sweep(), name="interrupted")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s)
            try:
                # A lease past by a whole lease more: a replica alive but late to renew
                # (a pause, a starved loop) keeps its run; a dead one's reads interrupted
                # within about three leases.
                marked = await self.store.mark_interrupted(expired_for_s=self.lease_s)
            except Exception as exc:  # the store is unreachable: try again next time
                log.warning("looking for runs of dead replicas failed: %s", type(exc).__name__)
                continue
            if marked:
                log.warning("marked %d run(s) of a dead replica interrupted", len(marked))

    def park_holder(self) -> tuple[str, float]:
        """This replica, for a lease it renews while it keeps the run parked
        (`watch_parked`); if it dies, the lease runs out and any replica resumes the run."""
        return self.owner, time.time() + self.lease_s

    def watch_parked(self, parked: ParkedKeys, wake: Wake) -> asyncio.Task[None] | None:
        """One task for all the runs parked here: renews their leases every third of a
        lease, and every `parked_poll_s` asks which of them got a decision or a cancel
        on another replica (one query). It ends once nothing is parked here (an idle
        replica wakes for nothing); the next park starts it again."""
        return asyncio.create_task(self._watch_parked(parked, wake), name="parked")

    async def _watch_parked(self, parked: ParkedKeys, wake: Wake) -> None:
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.parked_poll_s)
            here = parked()
            if not here:
                return
            try:
                if time.monotonic() - renewed >= self.lease_s / 3:
                    held = dict(here)
                    kept = await self.store.renew_parked(self.owner, self.lease_s)
                    renewed = time.monotonic()
                    # Held here but no longer ours in the store: another replica took it
                    # over while our renewals failed. Its wake finds that out and lets it
                    # go (its streams here end with RunOrphaned), instead of keeping
                    # them on a run whose events now go to another log's end. Not a run
                    # that went on and parked again meanwhile (its row is ours, renewed
                    # or not by this round).
                    for key in held.keys() - kept:
                        if here.get(key) is held[key]:
                            wake(key, False)
                for tenant, run_id, cancelled in await self.store.decided_parked(self.owner):
                    if (tenant, run_id) in here:
                        wake((tenant, run_id), cancelled)
            except Exception as exc:  # the store is unreachable: try again next time
                log.warning("parked runs' watch failed: %s", type(exc).__name__)

    async def _keep_lease(self, live: LiveRun) -> None:
        """Renews the run's lease while it runs; honours immediate cancels recorded by
        other replicas. A lost lease means another replica took the run over (this one was
        presumed dead): stop at once, so one run never executes twice."""
        record = live.record
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                kept = await self.store.renew_lease(
                    record.tenant, record.run_id, self.owner, self.lease_s
                )
                reason = await self.remote_cancel(record, immediate_only=True)
                if reason and live.in_graph:
                    live.stop.request(reason)
                    live.interrupt_graph()
            except Exception as exc:  # the store is unreachable: keep trying until expiry
                log.warning("lease renewal of %s failed: %s", record.run_id, type(exc).__name__)
                continue
            if not kept:
                log.error("lease of run %s was taken over; stopping here", record.run_id)
                live.lease_lost = True
                live.interrupt_graph()
                return

    async def cancel_recorded(self, record: RunRecord) -> str:
        """The reason of a cancel recorded for the run, read from its row now."""
        return await self.remote_cancel(record)

    async def remote_cancel(
        self, record: RunRecord, *, immediate_only: bool = False, marks: CancelMarks | None = None
    ) -> str:
        """The reason of a cancel another replica recorded for this run, or "".

        With the run's sink: when it appended a durable event since it was last asked (a
        speaker boundary always follows the previous speaker's final), the row as that
        append saw it, read in the append's own round trip; else the row read now. A cancel
        committed in the moment between that append and the boundary (one `sleep(0)`) is
        honoured at the boundary after, one speaker later.
        """
        fresh, mark = marks.take_cancel_mark() if marks is not None else (False, None)
        if not fresh:
            try:
                current = await self.store.get_run(record.tenant, record.run_id)
            except Exception as exc:  # the store is unreachable: ask again next time
                # A cancel not heard now is heard at the next boundary or poll: a store
                # error here failed the run at a speaker boundary, and ended a queued
                # run's poll for good (it never heard a cancel after). A store that stays
                # down fails the run at its next write, as it should.
                log.warning("reading the run's cancel failed: %s", type(exc).__name__)
                return ""
            if current is not None and current.cancel_mode:
                mark = CancelMark(current.cancel_mode, current.cancel_reason)
        if mark is None or (immediate_only and mark.mode != "immediate"):
            return ""
        return mark.reason or "cancel_requested"

    async def wait_ended(self, record: RunRecord) -> None:
        """Returns once another replica's run has ended, or its lease ran out (it died).
        While the run waits for a person, it asks less often (`PARKED_POLL_MAX_S`)."""
        pause = self.poll_s
        while True:
            current = await self.store.get_run(record.tenant, record.run_id)
            if (
                current is None
                or current.status not in LEASED
                or not current.leased_by_other(self.owner, time.time())
            ):
                return
            await asyncio.sleep(pause)
            parked = current.status is RunStatus.AWAITING_APPROVAL
            pause = min(pause * 2, PARKED_POLL_MAX_S) if parked else self.poll_s
