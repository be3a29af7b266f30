"""RunManager: what the servicer asks of runs: start, stream, cancel, describe, drain.

Idempotent on (tenant, run_id): a run executes at most once at a time in this process,
a finished run is replayed from the event log with its original seq numbers, and an
interrupted or cancelled one resumes by set difference against that log.

Each request is first turned into a decision (`decide_start`: attach, replay, follow or
launch), then one branch acts on it. The parts it composes each have one job: the live
registry (`registry`), the execution (`execution`), following another replica
(`follow`), the busy-thread policy (`threads`) and, where one deployment differs from
another, the coordination strategy (`coordination`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass

from roundtable.domain.errors import Draining, RoundtableError, RunNotFound, StreamGap
from roundtable.domain.events import Envelope
from roundtable.domain.snapshot import RunRequest
from roundtable.graph.directives import classify, words_hash
from roundtable.runs.approvals import Approvals, deny_left_waiting
from roundtable.runs.coordination import Coordination
from roundtable.runs.decisions import StartAction, decide_start
from roundtable.runs.execution import Executor, Launch
from roundtable.runs.follow import Follower
from roundtable.runs.identity import LegacyFingerprint, check_fingerprint, trace_context
from roundtable.runs.live import LiveRun, Subscription
from roundtable.runs.log import EventLog
from roundtable.runs.parking import Parking
from roundtable.runs.progress import Progress
from roundtable.runs.registry import LiveRegistry
from roundtable.runs.replay import replay
from roundtable.runs.threads import BusyRun, claim_thread
from roundtable.store.base import ACTIVE, LEASED, RESUMABLE, RunRecord, RunStatus

QUEUED_CANCEL_WAIT_S = 2.0
"""How long CancelRun waits for a queued or parked run it stopped to end (it does so at
once: a queued run writes two events and its row, a parked one goes on to its
run_cancelled where it waits), so that its answer shows the run ended."""


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What a cancel did, and the run as it is now."""

    accepted: bool
    record: RunRecord
    progress: Progress


class RunManager:
    """The live runs of this process and their durable records."""

    def __init__(
        self,
        *,
        log: EventLog,
        registry: LiveRegistry,
        coordination: Coordination,
        executor: Executor,
        follower: Follower,
        lease_s: float = 10.0,
    ) -> None:
        self.log = log
        """The event log; `log.store` is the one store every part uses."""
        self.registry = registry
        self.coordination = coordination
        self.executor = executor
        self.follower = follower
        self.lease_s = lease_s
        self.owner = coordination.owner
        self._lock = asyncio.Lock()
        self.parking = Parking(
            log=log,
            registry=registry,
            coordination=coordination,
            executor=executor,
            lock=self._lock,
            lease_s=lease_s,
        )
        """The runs parked here for approval: resumed, woken, cancelled."""
        self.approvals = Approvals(
            log=log, registry=registry, unpark=self.parking.unpark, owner=self.owner
        )
        """Decisions on permission requests (ResolvePermission) and the waiting ones."""

    # -- starting ---------------------------------------------------------------------------

    async def start(
        self,
        request: RunRequest,
        credentials: dict[str, str],
        *,
        legacy_fingerprint: LegacyFingerprint | None = None,
    ) -> Subscription:
        """Starts, attaches to, resumes or replays a run; returns its event stream.

        `legacy_fingerprint` computes the request's fingerprint as older versions did; it is
        called only when a known run's fingerprint differs from the request's.

        Raises:
            RunAlreadyExists: the run id is known with a different snapshot.
            ThreadBusy: the thread has a live run and the policy is REJECT.
            TooManyRuns: this process runs as many runs as it may.
            Draining: the server is shutting down.
        """
        ctx = request.context
        async with self._lock, contextlib.AsyncExitStack() as guard:
            live = await self._settled(ctx.tenant, ctx.run_id)
            record = live.record if live else await self.log.store.get_run(ctx.tenant, ctx.run_id)
            if record is not None:
                check_fingerprint(record, request, legacy_fingerprint)
            action = decide_start(
                live,
                None if live else record,
                owner=self.owner,
                now=time.time(),
                failed_retryably=live is None
                and record is not None
                and await self.log.failed_retryably(record),
            )
            if action is StartAction.ATTACH and live is not None:
                # As a follower or a replay would: the whole log, earlier executions too.
                return await self._subscribe(live, after_seq=0)
            if action is StartAction.LAUNCH:
                return await self._launch(request, credentials, record, guard, legacy_fingerprint)
            assert record is not None
            if action is StartAction.REPLAY:
                return await replay(self.log, record)
            return self._follow_start(record, request, credentials, legacy_fingerprint)

    async def _settled(self, tenant: str, run_id: str) -> LiveRun | None:
        """The run's live execution here, once one that already published its end is gone.

        Its terminal event and final row are written, and it is leaving the registry: let it,
        so a StartRun sent right after a run failed retryably or was cancelled resumes it, as
        one sent a moment later does, instead of attaching to the execution that just ended.
        """
        live = self.registry.get(tenant, run_id)
        if live is not None and live.ended and live.task is not None:
            await asyncio.wait({live.task})
            live = self.registry.get(tenant, run_id)
        return live

    def _follow_start(
        self,
        record: RunRecord,
        request: RunRequest,
        credentials: dict[str, str],
        legacy: LegacyFingerprint | None,
    ) -> Subscription:
        """Follows a run another replica executes; takes it over should that replica die."""
        return self.follower.follow(
            record,
            after_seq=0,
            takeover=lambda: self.start(request, credentials, legacy_fingerprint=legacy),
        )

    async def _launch(
        self,
        request: RunRequest,
        credentials: dict[str, str],
        record: RunRecord | None,
        guard: contextlib.AsyncExitStack,
        legacy: LegacyFingerprint | None,
    ) -> Subscription:
        """Starts a new run, or resumes a known one, under the busy-thread policy."""
        ctx = request.context
        if self.registry.draining:
            raise Draining()
        directive = classify(request.snapshot)
        if not directive.stops:  # it frees places, calling no model: never refused for room
            self.registry.check_capacity(ctx.tenant)
        await self.coordination.hold_thread(ctx.tenant, ctx.thread_id, guard)
        busy: list[BusyRun] = [
            *self.registry.busy(ctx.tenant, ctx.thread_id),
            *await self.coordination.busy_elsewhere(request, self.parking.dormant),
        ]
        wait_for = await claim_thread(request, directive, busy, resuming=record)
        if record is None:
            record = self._new_record(request, queued=wait_for is not None)
            if not await self.log.store.create_run(record):
                # Another replica created the same run between our read and our write:
                # it runs it, we follow (and take it over should it die).
                raced = await self.log.store.get_run(ctx.tenant, ctx.run_id)
                assert raced is not None
                check_fingerprint(raced, request, legacy)
                return self._follow_start(raced, request, credentials, legacy)
            prior: list[Envelope] = []
            unparks = False
        else:
            if not await self.log.store.acquire_lease(
                ctx.tenant, ctx.run_id, self.owner, self.lease_s
            ):
                return await self._lost_race(record, request, credentials, legacy)
            unparks = record.status is RunStatus.AWAITING_APPROVAL
            prior = await self._reopen(record)
        live = LiveRun(
            request=request,
            record=record,
            buffer=self.registry.limits.stream_buffer,
            max_streams=self.registry.limits.max_streams_per_run,
        )
        for envelope in prior:
            live.progress.observe(envelope.event)
        self.registry.add(live)
        # Every StartRun streams the run from seq 1: a resume hands on the earlier
        # executions' events first, so a gateway that lost them loses nothing.
        subscription = live.subscribe(0, head=prior)
        launch = Launch(
            credentials=credentials,
            directive=directive,
            resumed=bool(prior),
            wait_for=wait_for,
            unparks=unparks,
        )
        self.executor.launch(live, launch)
        return subscription

    def _new_record(self, request: RunRequest, *, queued: bool) -> RunRecord:
        ctx, now = request.context, time.time()
        return RunRecord(
            tenant=ctx.tenant,
            run_id=ctx.run_id,
            thread_id=ctx.thread_id,
            fingerprint=request.fingerprint,
            status=RunStatus.QUEUED if queued else RunStatus.RUNNING,
            created_at=now,
            updated_at=now,
            trace_context=trace_context(),
            turn_hash=words_hash(request.snapshot.user_turn.text),
            owner=self.owner,
            lease_until=now + self.lease_s,
        )

    async def _lost_race(
        self,
        record: RunRecord,
        request: RunRequest,
        credentials: dict[str, str],
        legacy: LegacyFingerprint | None,
    ) -> Subscription:
        """Another replica took the run's lease first: replay it if it has ended since it
        was read (a continue turn took it over, say), else follow it."""
        current = await self.log.store.get_run(record.tenant, record.run_id)
        if (
            current is not None
            and current.status not in ACTIVE | RESUMABLE
            and not await self.log.failed_retryably(current)
        ):
            return await replay(self.log, current)
        return self._follow_start(record, request, credentials, legacy)

    async def _reopen(self, record: RunRecord) -> list[Envelope]:
        """A resumed run's log, closed first if its last execution died mid-way; the run
        is marked running again."""
        prior = await self.log.read(record.tenant, record.run_id)
        # A run that waited for approval did not die: its execution goes on (unparks).
        waited = record.status is RunStatus.AWAITING_APPROVAL
        if prior and not prior[-1].terminal and not waited:
            # The execution before this one died mid-way (a crash, a kill, a lost replica):
            # its end goes in the log first, so that every execution there ends in a
            # terminal event, as the contract says.
            prior.append(
                await self.log.close_dead_execution(
                    record, prior[-1].seq, retryable=True, owner=self.owner
                )
            )
        await deny_left_waiting(self.log.store, record, prior)
        # The log, not the registry, knows the last seq: a killed process never wrote its
        # final registry update.
        record.last_seq = prior[-1].seq if prior else 0
        record.status = RunStatus.RUNNING
        await self.log.store.update_run(record)
        return prior

    async def close_interrupted(self, runs: Iterable[tuple[str, str]]) -> None:
        """Closes the logs of runs that start-up marked interrupted (their process died),
        where this process alone serves the store (see `Coordination.close_interrupted`)."""
        await self.coordination.close_interrupted(runs, self.log)

    # -- following, cancelling, describing --------------------------------------------------

    async def stream(self, tenant: str, run_id: str, after_seq: int) -> Subscription:
        """Replays durable events after `after_seq`, then follows the live run.

        Raises:
            RunNotFound: no such run for this tenant.
            StreamGap: `after_seq` is past the run's last seq, or the log lost events.
        """
        live = self.registry.get(tenant, run_id)
        record = live.record if live is not None else await self.log.store.get_run(tenant, run_id)
        if record is None:
            raise RunNotFound(run_id)
        try:
            if live is None:
                if record.status in LEASED and record.leased_by_other(self.owner, time.time()):
                    return self.follower.follow(record, after_seq=after_seq)
                return await replay(self.log, record, after_seq=after_seq, strict=True)
            if after_seq > record.last_seq:
                # As for a finished run: a seq the run never gave out is the caller's
                # mistake (another run's seq, say), not something to wait for.
                raise StreamGap(
                    f"after_seq {after_seq} is past the run's last seq {record.last_seq}"
                )
            return await self._subscribe(live, after_seq=after_seq)
        except RoundtableError as exc:
            exc.thread_id = record.thread_id  # for the RPC's span
            raise

    async def _subscribe(self, live: LiveRun, *, after_seq: int) -> Subscription:
        """A stream of a run this process executes: durable events after `after_seq`, then
        the live ones."""
        live.check_room()  # before reading the log for it
        # Events of an earlier execution of the run are in the log, not in memory.
        tenant, run_id = live.key
        head = await self.log.read_up_to(tenant, run_id, after_seq, lambda: live.first_in_memory)
        return live.subscribe(after_seq, head=head)

    def unsubscribe(self, tenant: str, run_id: str, sub: Subscription) -> None:
        """Detaches a stream whose client went away."""
        if sub.follower is not None:
            sub.follower.cancel()
        live = self.registry.get(tenant, run_id)
        if live is not None:
            live.unsubscribe(sub)

    async def cancel(
        self, tenant: str, run_id: str, *, immediate: bool, reason: str
    ) -> CancelResult:
        """Asks a run to stop (gracefully at the next speaker boundary, or now).

        Raises:
            RunNotFound: no such run for this tenant.
        """
        live = self.registry.get(tenant, run_id)
        if live is not None:
            queued = live.record.status is RunStatus.QUEUED
            parked = self.registry.parked(tenant, run_id) is not None
            live.stop.request(reason or "cancel_requested")
            if parked:
                await self.parking.cancel(live)
            elif immediate:
                live.interrupt_graph()
            if queued or parked:
                # It ends at once (its wait stops): the answer says so (outside testing: a
                # parked run's answer said RUNNING while its stream ended cancelled).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(QUEUED_CANCEL_WAIT_S):
                        await live.done.wait()
            return CancelResult(True, live.record, live.progress)
        record, progress = await self.describe(tenant, run_id)
        if record.status is RunStatus.AWAITING_APPROVAL:
            reason = reason or "cancel_requested"
            if await self.parking.cancel_elsewhere(record, progress, reason):
                return CancelResult(True, record, progress)  # the record as it is now
            # It moved on between the read and the cancel: say so, as it is now.
            record, progress = await self.describe(tenant, run_id)
            return CancelResult(False, record, progress)
        if record.status in ACTIVE and record.leased_by_other(self.owner, time.time()):
            # Another replica runs it: record the cancel there; it stops at its next
            # speaker boundary (an immediate cancel within a third of a lease).
            mode = "immediate" if immediate else "graceful"
            store = self.log.store
            if await store.request_cancel(tenant, run_id, mode, reason or "cancel_requested"):
                return CancelResult(True, record, progress)
            # It ended between the read and the write: say so, with its end.
            record, progress = await self.describe(tenant, run_id)
        return CancelResult(False, record, progress)

    async def describe(self, tenant: str, run_id: str) -> tuple[RunRecord, Progress]:
        """The run's record and progress.

        Raises:
            RunNotFound: no such run for this tenant.
        """
        live = self.registry.get(tenant, run_id)
        if live is not None:
            return live.record, live.progress
        record = await self.log.store.get_run(tenant, run_id)
        if record is None:
            raise RunNotFound(run_id)
        return record, await self.log.progress(record)

    # -- shutting down ----------------------------------------------------------------------

    async def drain(self, grace_s: float) -> None:
        """Stops taking runs, lets live ones reach a speaker boundary, interrupts the rest."""
        self.parking.close()
        await self.registry.drain(grace_s)

    @property
    def live_count(self) -> int:
        """Runs executing now."""
        return len(self.registry)
