"""RunManager: starts, attaches to, replays, resumes, cancels and describes runs.

Idempotent on (tenant, run_id): a run executes at most once at a time in this process,
a finished run is replayed from the event log with its original seq numbers, and an
interrupted or cancelled one resumes by set difference against that log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from roundtable.api.convert import FINGERPRINT_PREFIX, event_to_proto
from roundtable.domain.errors import (
    Draining,
    RoundtableError,
    RunAlreadyExists,
    RunContinued,
    RunNotFound,
    RunOrphaned,
    StreamGap,
    ThreadBusy,
    TooManyRuns,
)
from roundtable.domain.events import (
    ReplySummary,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    TokenUsage,
)
from roundtable.domain.plan import DirectiveKind, PlanStep, Route
from roundtable.domain.snapshot import BusyThreadPolicy, RunRequest, SessionKind
from roundtable.graph.context import (
    Continuation,
    Drained,
    GraphContext,
    GraphSettings,
    Prior,
    StopSignal,
)
from roundtable.graph.directives import Directive, classify
from roundtable.harness.chain import Harness
from roundtable.runs.live import TERMINAL_KINDS, LiveRun, Subscription
from roundtable.runs.progress import Progress
from roundtable.runs.sink import RunSink
from roundtable.store.base import (
    RESUMABLE,
    CancelMark,
    LeaseLost,
    RunRecord,
    RunStatus,
    RunStore,
    StoredEvent,
)
from roundtable.telemetry.attributes import run_correlation
from roundtable.telemetry.metrics import Metrics, no_metrics
from roundtable.v1 import events_pb2 as epb

log = logging.getLogger(__name__)

SHUTDOWN_REASON = "server_shutdown"
ACTIVE = frozenset({RunStatus.RUNNING, RunStatus.QUEUED})
CONTINUE_LOOKBACK = 8
"""How many of a thread's latest stopped runs a continue turn looks through for steps left."""


def default_owner() -> str:
    """A replica id unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _trace_context() -> str:
    """The current span as `<trace_id>-<span_id>`, or "" when nothing is traced."""
    span = trace.get_current_span().get_span_context()
    return f"{span.trace_id:032x}-{span.span_id:016x}" if span.is_valid else ""


def _span_context(value: str) -> trace.SpanContext | None:
    """The span context stored by `_trace_context`."""
    if not value:
        return None
    trace_id, _, span_id = value.partition("-")
    return trace.SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=trace.TraceFlags(1)
    )


class NewThreads(Protocol):
    """The checkpoint saver's side of "this run has no checkpoint yet" (BoundarySaver)."""

    def expect_new(self, thread_id: str) -> None:
        """The thread's next checkpoint read may answer None without a database read."""

    def forget_new(self, thread_id: str) -> None:
        """Drops the mark if the run ended before reading."""


async def _until_stopped(waiting: Awaitable[Any], stop: StopSignal) -> None:
    """Awaits `waiting`, or less: until a stop is requested (then `waiting` is cancelled)."""
    queued = asyncio.ensure_future(waiting)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((queued, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        queued.cancel()
        stopped.cancel()
    if queued.done() and not queued.cancelled():
        queued.result()  # its error, if it failed


def _both(
    first: Callable[[], Awaitable[Any]] | None, second: Callable[[], Awaitable[Any]] | None
) -> Callable[[], Awaitable[Any]] | None:
    """One wait for two (either may be None)."""
    if first is None or second is None:
        return first or second

    async def wait() -> None:
        await first()
        await second()

    return wait


def checkpoint_thread(tenant: str, run_id: str) -> str:
    """The LangGraph checkpoint thread of a run: one per (tenant, run)."""
    return f"{tenant}/{run_id}"


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


RUN_INTERRUPTED = "RUN_INTERRUPTED"
"""run_failed's code for an execution that died before its end, written when it is found dead."""


def _is_terminal(event: epb.RunEvent) -> bool:
    return event.WhichOneof("payload") in TERMINAL_KINDS


def _stored_stream(
    record: RunRecord, events: list[epb.RunEvent], last: epb.RunEvent | None
) -> Subscription:
    """A stream of a run no process executes: its stored events, then its end.

    A log whose last execution died before its terminal event (a lease that ran out on a
    shared store, before any replica resumed the run) does not end OK, which a gateway
    would take for the run's end: it ends UNAVAILABLE (RunOrphaned: send the same
    StartRun, which resumes it). A run a later run continued ends FAILED_PRECONDITION
    (RunContinued) when its log does not end for good: no terminal event, or a retryable
    run_failed, which would have the gateway send a StartRun that can only replay it.
    `events` are what the stream gives; `last` is the log's last event.
    """
    sub = Subscription(events, ended=True)
    log_ends = last is not None and _is_terminal(last)
    if record.status is RunStatus.CONTINUED:
        if not log_ends or (last is not None and last.run_failed.retryable):
            sub.error = RunContinued(f"run {record.run_id!r} by run {record.continued_by!r}")
    elif not log_ends:
        sub.error = RunOrphaned(record.run_id)
    return sub


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """How one execution of a run starts. `credentials` stays in memory only."""

    credentials: dict[str, str] = field(repr=False)
    directive: Directive
    resumed: bool
    wait_for: Callable[[], Awaitable[Any]] | None
    """Waits until the thread's busy run (here or on another replica) has ended."""


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
        store: RunStore,
        graph: Any,
        harness: Harness,
        checkpoints: NewThreads | None = None,
        graph_settings: GraphSettings | None = None,
        durability: str = "exit",
        tracer: trace.Tracer | None = None,
        metrics: Metrics | None = None,
        owner: str = "",
        lease_s: float = 10.0,
        follow_poll_s: float = 0.05,
        limits: RunLimits | None = None,
    ) -> None:
        self.store = store
        self.limits = limits or RunLimits()
        self._per_tenant: Counter[str] = Counter()
        self.owner = owner or default_owner()
        self.lease_s = lease_s
        self.follow_poll_s = follow_poll_s
        self.graph = graph
        self.harness = harness
        self.checkpoints = checkpoints
        self.graph_settings = graph_settings or GraphSettings()
        self.durability = durability
        self.tracer = tracer
        """Spans of runs, nodes and speakers; None: nothing is traced, no span is made."""
        self.metrics = metrics or no_metrics()
        self._live: dict[tuple[str, str], LiveRun] = {}
        self._threads: dict[tuple[str, str], list[LiveRun]] = {}
        """Each thread's live runs in this process, oldest first."""
        self._lock = asyncio.Lock()
        self._draining = False

    # -- starting ---------------------------------------------------------------------------

    async def start(
        self,
        request: RunRequest,
        credentials: dict[str, str],
        *,
        legacy_fingerprint: Callable[[], str] | None = None,
    ) -> Subscription:
        """Starts, attaches to, resumes or replays a run; returns its event stream.

        `legacy_fingerprint` computes the request's fingerprint as older versions did; it is
        called only when a known run's fingerprint differs from the request's.

        Raises:
            RunAlreadyExists: the run id is known with a different snapshot.
            ThreadBusy: the thread has a live run and the policy is REJECT.
            Draining: the server is shutting down.
        """
        ctx = request.context
        key = (ctx.tenant, ctx.run_id)
        async with self._lock, contextlib.AsyncExitStack() as guard:
            live = self._live.get(key)
            if live is not None and live.ended and live.task is not None:
                # Its terminal event is out and it is writing its registry row: let it, so
                # a StartRun sent right after a run failed retryably or was cancelled
                # resumes it, as one sent a moment later does, instead of attaching to
                # the execution that just ended.
                self._check_fingerprint(live.record, request, legacy_fingerprint)
                await asyncio.wait({live.task})
                live = self._live.get(key)
            if live is not None:
                self._check_fingerprint(live.record, request, legacy_fingerprint)
                # As a follower or a replay would: the whole log, earlier executions too.
                return await self._subscribe(live, after_seq=0)
            record = await self.store.get_run(ctx.tenant, ctx.run_id)
            if record is not None:
                self._check_fingerprint(record, request, legacy_fingerprint)
                if record.status in ACTIVE:
                    if record.leased_by_other(self.owner, time.time()):
                        return self._follow(
                            record,
                            after_seq=0,
                            takeover=lambda: self.start(
                                request, credentials, legacy_fingerprint=legacy_fingerprint
                            ),
                        )
                    # Otherwise the process that ran it is gone (its lease expired): resume.
                elif record.status not in RESUMABLE and not await self._failed_retryably(record):
                    return await self._replay(record)
            if self._draining:
                raise Draining()
            self._check_capacity(ctx.tenant)
            directive = classify(request.snapshot)
            if self.store.shared:
                # Replicas check a thread's runs and record the new one in turn, so two
                # StartRuns of one thread on two replicas never both see it idle.
                await guard.enter_async_context(self.store.thread_lock(ctx.tenant, ctx.thread_id))
            wait_for = self._claim_thread(request, directive)
            if self.store.shared:
                # Also the thread's runs on other replicas: a run waits for all of them.
                remote = await self._claim_thread_across_replicas(request, directive)
                wait_for = _both(wait_for, remote)
            if record is None:
                now = time.time()
                record = RunRecord(
                    tenant=ctx.tenant,
                    run_id=ctx.run_id,
                    thread_id=ctx.thread_id,
                    fingerprint=request.fingerprint,
                    status=RunStatus.QUEUED if wait_for else RunStatus.RUNNING,
                    created_at=now,
                    updated_at=now,
                    trace_context=_trace_context(),
                    owner=self.owner,
                    lease_until=now + self.lease_s,
                )
                if not await self.store.create_run(record):
                    # Another replica created the same run between our read and our write:
                    # it runs it, we follow (and take over should it die).
                    raced = await self.store.get_run(ctx.tenant, ctx.run_id)
                    assert raced is not None
                    self._check_fingerprint(raced, request, legacy_fingerprint)
                    return self._follow(
                        raced,
                        after_seq=0,
                        takeover=lambda: self.start(
                            request, credentials, legacy_fingerprint=legacy_fingerprint
                        ),
                    )
                prior_events: list[epb.RunEvent] = []
            else:
                if not await self.store.acquire_lease(
                    ctx.tenant, ctx.run_id, self.owner, self.lease_s
                ):
                    current = await self.store.get_run(ctx.tenant, ctx.run_id)
                    if (
                        current is not None
                        and current.status not in ACTIVE | RESUMABLE
                        and not await self._failed_retryably(current)
                    ):
                        # A continue turn took it over (or it ended) since it was read.
                        return await self._replay(current)
                    # Another replica got there first: follow it (and take over if it dies).
                    return self._follow(
                        record,
                        after_seq=0,
                        takeover=lambda: self.start(
                            request, credentials, legacy_fingerprint=legacy_fingerprint
                        ),
                    )
                prior_events = [
                    epb.RunEvent.FromString(e.body)
                    for e in await self.store.read_events(ctx.tenant, ctx.run_id, 0)
                ]
                if prior_events and not _is_terminal(prior_events[-1]):
                    # The execution before this one died mid-way (a crash, a kill, a lost
                    # replica): its end goes in the log first, so that every execution
                    # there ends in a terminal event, as the contract says.
                    prior_events.append(
                        await self._close_dead_execution(
                            record, prior_events[-1].seq, retryable=True, owner=self.owner
                        )
                    )
                # The log, not the registry, knows the last seq: a killed process never
                # wrote its final registry update.
                record.last_seq = prior_events[-1].seq if prior_events else 0
                record.status = RunStatus.RUNNING
                await self.store.update_run(record)
            live = LiveRun(
                request=request,
                record=record,
                buffer=self.limits.stream_buffer,
                max_streams=self.limits.max_streams_per_run,
            )
            self._per_tenant[ctx.tenant] += 1
            for event in prior_events:
                live.progress.observe(event)
            self._live[key] = live
            self._threads.setdefault(live.thread_key, []).append(live)
            # Every StartRun streams the run from seq 1: a resume hands on the earlier
            # executions' events first, so a gateway that lost them loses nothing.
            subscription = live.subscribe(0, head=prior_events)
            launch = Launch(
                credentials=credentials,
                directive=directive,
                resumed=bool(prior_events),
                wait_for=wait_for,
            )
            live.task = asyncio.create_task(
                self._execute(live, launch),
                name=f"run:{ctx.tenant}/{ctx.run_id}",
            )
            return subscription

    def _check_capacity(self, tenant: str) -> None:
        if len(self._live) >= self.limits.max_runs:
            raise TooManyRuns(f"{len(self._live)} runs in this process")
        if self._per_tenant[tenant] >= self.limits.max_runs_per_tenant:
            raise TooManyRuns(f"{self._per_tenant[tenant]} runs of this tenant")

    @staticmethod
    def _check_fingerprint(
        record: RunRecord, request: RunRequest, legacy: Callable[[], str] | None
    ) -> None:
        if record.fingerprint == request.fingerprint:
            return
        # A run recorded by an older version: compare with the fingerprint it computed
        # (only here, on a mismatch, so the common path never pays for a second hash).
        if (
            legacy is not None
            and not record.fingerprint.startswith(FINGERPRINT_PREFIX)
            and record.fingerprint == legacy()
        ):
            return
        raise RunAlreadyExists(f"run {record.run_id!r}")

    def _claim_thread(
        self, request: RunRequest, directive: Directive
    ) -> Callable[[], Awaitable[Any]] | None:
        """Applies the busy-thread policy to this process's runs; returns what to wait for."""
        ctx = request.context
        busy = [
            live
            for live in self._threads.get((ctx.tenant, ctx.thread_id), ())
            if not live.done.is_set()
        ]
        if not busy:
            return None
        if directive.kind is DirectiveKind.STOP:
            # A stop turn always stops the thread's live runs (the running one and any
            # waiting behind it), whatever the policy; nobody speaks.
            for live in busy:
                live.stop.request("stop_directive")
            return None
        policy = request.options.busy_thread_policy
        if policy is BusyThreadPolicy.REJECT:
            raise ThreadBusy(f"thread {ctx.thread_id!r} is running run {busy[0].record.run_id!r}")
        if policy is BusyThreadPolicy.INTERRUPT:
            for live in busy:
                live.stop.request("interrupted_by_new_run")

        async def wait() -> None:
            # Every one of them, a stop turn that ended at once included: a run stopping
            # gracefully still finishes its speaker.
            for live in busy:
                await live.done.wait()

        return wait

    async def _claim_thread_across_replicas(
        self, request: RunRequest, directive: Directive
    ) -> Callable[[], Awaitable[Any]] | None:
        """Applies the busy-thread policy to a run of the thread on another replica.

        Such a run is known from the shared registry (running or queued, under a live lease);
        it is stopped through a cancel recorded there, which its replica honours at its next
        speaker boundary, and waited for by polling its record.
        """
        ctx = request.context
        busy = await self.store.live_thread_runs(
            ctx.tenant, ctx.thread_id, exclude_run_id=ctx.run_id, owner=self.owner, now=time.time()
        )
        if not busy:
            return None
        if directive.kind is DirectiveKind.STOP:
            for run in busy:
                await self.store.request_cancel(
                    ctx.tenant, run.run_id, "graceful", "stop_directive"
                )
            return None
        policy = request.options.busy_thread_policy
        if policy is BusyThreadPolicy.REJECT:
            raise ThreadBusy(f"thread {ctx.thread_id!r} is running run {busy[0].run_id!r}")
        if policy is BusyThreadPolicy.INTERRUPT:
            for run in busy:
                await self.store.request_cancel(
                    ctx.tenant, run.run_id, "graceful", "interrupted_by_new_run"
                )
        return lambda: self._wait_for_remote(busy)

    async def _wait_for_remote(self, busy: list[RunRecord]) -> None:
        """Returns once other replicas' runs have ended, or their leases ran out (died)."""
        for run in busy:
            while True:
                current = await self.store.get_run(run.tenant, run.run_id)
                if (
                    current is None
                    or current.status not in ACTIVE
                    or not current.leased_by_other(self.owner, time.time())
                ):
                    break
                await asyncio.sleep(self.follow_poll_s)

    async def _continuation_of(self, record: RunRecord) -> Continuation | None:
        """The steps a continue turn takes over: what the thread's latest cancelled or
        interrupted run with steps left left, claimed for this run in the registry.

        The claim is atomic (two continue turns never take the same steps) and durable (a
        continue run that dies before its plan is logged finds its claim again on resume,
        and plans the same steps with the same reply ids). A run with nothing left (one
        stopped before it had a plan, say) is passed over, not claimed.
        """
        claimed = await self.store.continued_run(record.tenant, record.run_id)
        if claimed is not None:
            steps, _ = await self._steps_left(claimed)
            return Continuation(run_id=claimed.run_id, steps=steps) if steps else None
        candidates = await self.store.resumable_runs(
            record.tenant,
            record.thread_id,
            exclude_run_id=record.run_id,
            limit=CONTINUE_LOOKBACK,
        )
        for earlier in candidates:
            steps, last = await self._steps_left(earlier)
            if steps and await self.store.claim_continuation(
                record.tenant, earlier.run_id, record.run_id
            ):
                if last is not None and not _is_terminal(last):
                    # Killed mid-way, then continued: its log gets the end it never wrote.
                    # Not retryable: this run answers for it now. No owner fence: the
                    # claim made it ours, and nobody else writes a continued run.
                    await self._close_dead_execution(
                        earlier, last.seq, retryable=False, continued_by=record.run_id
                    )
                return Continuation(run_id=earlier.run_id, steps=steps)
        return None

    async def close_interrupted(self, runs: Iterable[tuple[str, str]]) -> None:
        """Closes the logs of runs that start-up marked interrupted (their process died):
        each gets the run_failed (RUN_INTERRUPTED, retryable) its execution never wrote, so
        a stream of one ends in a terminal event that says "send the same StartRun".

        Only for a store this process alone serves: on a shared one a replica may be
        resuming such a run at this very moment, and that resume closes the log itself.
        """
        if self.store.shared:
            return
        for tenant, run_id in runs:
            record = await self.store.get_run(tenant, run_id)
            stored = await self.store.read_events(tenant, run_id, 0)
            if record is None or not stored:
                continue  # queued and never started: it has no execution to close
            last = epb.RunEvent.FromString(stored[-1].body)
            if not _is_terminal(last):
                closed = await self._close_dead_execution(record, last.seq, retryable=True)
                record.last_seq = closed.seq
                await self.store.update_run(record)

    async def _close_dead_execution(
        self,
        record: RunRecord,
        last_seq: int,
        *,
        retryable: bool,
        owner: str | None = None,
        continued_by: str = "",
    ) -> epb.RunEvent:
        """Appends the run_failed (RUN_INTERRUPTED) that a dead execution never wrote."""
        why = (
            f"continued by run {continued_by}"
            if continued_by
            else "send the same StartRun to resume it (finished speakers are kept)"
        )
        failed = RunFailed(
            code=RUN_INTERRUPTED,
            message=f"the execution stopped before its end (its process ended); {why}",
            retryable=retryable,
        )
        proto = event_to_proto(record.run_id, last_seq + 1, time.time(), failed)
        stored = StoredEvent(last_seq + 1, "run_failed", proto.SerializeToString())
        await self.store.append_event(record.tenant, record.run_id, stored, owner=owner)
        return proto

    async def _failed_retryably(self, record: RunRecord) -> bool:
        """Whether the run failed with `retryable` set (an internal error, not a deadline):
        the same StartRun then resumes it, as `RunFailed.retryable` promises, like a run a
        crash interrupted, finished speakers kept."""
        if record.status is not RunStatus.FAILED:
            return False
        last = await self.store.read_events(record.tenant, record.run_id, record.last_seq - 1)
        if not last:
            return False
        event = epb.RunEvent.FromString(last[-1].body)
        return event.WhichOneof("payload") == "run_failed" and event.run_failed.retryable

    async def _steps_left(
        self, record: RunRecord
    ) -> tuple[tuple[PlanStep, ...], epb.RunEvent | None]:
        """The run's steps not yet finished, and the last event of its log (one read)."""
        progress = Progress()
        event: epb.RunEvent | None = None
        for stored in await self.store.read_events(record.tenant, record.run_id, 0):
            event = epb.RunEvent.FromString(stored.body)
            progress.observe(event)
        return tuple(progress.steps_left), event

    async def _replay(self, record: RunRecord) -> Subscription:
        events = await self.store.read_events(record.tenant, record.run_id, 0)
        decoded = [epb.RunEvent.FromString(e.body) for e in events]
        return _stored_stream(record, decoded, decoded[-1] if decoded else None)

    # -- executing --------------------------------------------------------------------------

    async def _execute(self, live: LiveRun, launch: Launch) -> None:
        """Runs the run in a span that continues the starting request's trace.

        A resumed run (perhaps in another process) links to the span that first ran it.
        """
        record = live.record
        started = time.perf_counter()
        try:
            if self.tracer is None:
                await self._run_owned(live, launch)
                return
            links = []
            first = _span_context(record.trace_context) if launch.resumed else None
            if first is not None:
                links.append(trace.Link(first, {"roundtable.link": "first_execution"}))
            attributes: dict[str, AttributeValue] = {
                **run_correlation(live.request.context, "run"),
                "roundtable.resumed": launch.resumed,
            }
            with self.tracer.start_as_current_span(
                "roundtable.run", attributes=attributes, links=links
            ):
                await self._run_owned(live, launch)
        finally:
            status = {"roundtable.status": record.status.value}
            self.metrics.runs.add(1, status)
            self.metrics.run_duration.record(time.perf_counter() - started, status)

    async def _run_owned(self, live: LiveRun, launch: Launch) -> None:
        """Runs the run; stops quietly when the store refuses an append because another
        replica took it over (its streams end with RunOrphaned: the same StartRun finds
        the new owner)."""
        try:
            await self._run(live, launch)
        except LeaseLost:
            log.error("run %s was taken over by another replica; stopping here", live.record.run_id)

    async def _run(self, live: LiveRun, launch: Launch) -> None:
        record = live.record
        sink = RunSink(live, self.store, first_seq=record.last_seq, owner=self.owner)
        request = live.request
        status = RunStatus.FAILED
        # Leases only matter where other replicas share the store; a SQLite file belongs to
        # one process (start-up marks a dead one's runs), so renewing would be a task and a
        # write every lease/3 per live run for nothing.
        keeper = (
            asyncio.create_task(self._keep_lease(live), name=f"lease:{record.run_id}")
            if self.store.shared
            else None
        )
        if self.store.shared:
            live.stop.poller = lambda: self._remote_cancel(record, sink=sink)
        # Every execution opens with run_started, even one cancelled while queued.
        started = RunStarted(
            route=Route.SINGLE
            if request.snapshot.session.kind is SessionKind.SINGLE
            else Route.GROUP,
            resumed=launch.resumed,
            thread_id=request.context.thread_id,
        )
        try:
            if launch.wait_for is not None:
                # Queued behind the thread's other runs, until they end or this one is
                # cancelled (which need not wait for them; a cancel recorded by another
                # replica reaches it by polling).
                watcher = (
                    asyncio.create_task(self._poll_stop(live.stop)) if self.store.shared else None
                )
                try:
                    await _until_stopped(launch.wait_for(), live.stop)
                finally:
                    if watcher is not None:
                        watcher.cancel()
                await live.stop.refresh()  # a cancel another replica recorded meanwhile
                if live.stop.requested:
                    await sink.emit(started)
                    raise Drained(live.stop.reason)
                record.status = RunStatus.RUNNING
                await self.store.update_run(record)
            continuation = None
            if launch.directive.kind is DirectiveKind.CONTINUE and not live.progress.steps:
                # Claimed only now, once the run may start: a continue turn queued behind
                # another run takes over whatever is left when its turn comes.
                continuation = await self._continuation_of(record)
            await sink.emit(started)
            context = GraphContext(
                request=request,
                directive=launch.directive,
                harness=self.harness,
                sink=sink,
                stop=live.stop,
                credentials=launch.credentials,
                prior=Prior(
                    steps=tuple(live.progress.steps),
                    finished=dict(live.progress.finished),
                    usage=dict(live.progress.usage),
                    rounds=live.progress.rounds,
                    memory_proposed=live.progress.memory_proposed,
                    verdicts=dict(live.progress.verdicts),
                ),
                continuation=continuation,
                settings=self.graph_settings,
                tracer=self.tracer,
                metrics=self.metrics,
            )
            thread = checkpoint_thread(record.tenant, record.run_id)
            config = {"configurable": {"thread_id": thread}, "recursion_limit": 10_000}
            graph_input: dict[str, Any] | None = {}
            if not launch.resumed and self.checkpoints is not None:
                # A run's first execution: its checkpoint thread is its own, and empty.
                self.checkpoints.expect_new(thread)
            if launch.resumed:
                # Continue from the last checkpoint when there is one; the event log (in
                # the context) still decides which speakers are finished.
                checkpoint = await self.graph.aget_state(config)
                if checkpoint.next:
                    graph_input = None
            if live.lease_lost:
                return  # taken over by another replica before the graph started
            live.in_graph = True
            try:
                async with asyncio.timeout(request.snapshot.session.budgets.run_timeout_s):
                    state: dict[str, Any] = await self.graph.ainvoke(
                        graph_input, config, context=context, durability=self.durability
                    )
            finally:
                live.in_graph = False
                live.take_back_interrupts()
            await sink.emit(_completed(state, live.progress))
            status = RunStatus.SUCCEEDED
        except Drained as stop:
            await sink.emit(_cancelled(stop.reason, live.progress))
            # A run stopped for a shutdown was not cancelled by anyone: it resumes when the
            # same StartRun comes again, on this server or the next.
            status = (
                RunStatus.INTERRUPTED if stop.reason == SHUTDOWN_REASON else RunStatus.CANCELLED
            )
        except asyncio.CancelledError:
            if live.lease_lost:
                return  # nothing more may be written for a run another replica owns
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # The process is stopping: the run is interrupted, not cancelled by anyone.
                status = RunStatus.INTERRUPTED
                raise
            await sink.emit(_cancelled(live.stop.reason or "cancel_requested", live.progress))
            status = RunStatus.CANCELLED
        except LeaseLost:
            raise  # nothing more may be written: not even run_failed
        except TimeoutError:
            await sink.emit(
                RunFailed(
                    code="RUN_DEADLINE_EXCEEDED",
                    message="the run took longer than its run_timeout_seconds",
                    retryable=False,
                )
            )
            status = RunStatus.FAILED
        except Exception as exc:
            # The run fails, the server does not: log the type only (a message could hold
            # prompt text), and tell the gateway it may retry.
            log.error("run %s failed: %s", record.run_id, type(exc).__name__)
            with contextlib.suppress(Exception):
                await sink.emit(
                    RunFailed(code="INTERNAL", message=type(exc).__name__, retryable=True)
                )
            status = RunStatus.FAILED
        finally:
            if keeper is not None:
                keeper.cancel()
            if self.checkpoints is not None:
                self.checkpoints.forget_new(checkpoint_thread(record.tenant, record.run_id))
            sink.flush()
            # With the lease lost, another replica owns the run: it writes the record, not us.
            if not live.lease_lost:
                record.status = status
                with contextlib.suppress(Exception):
                    if not await self.store.finish_run(record, self.owner):
                        # Another process owns the row now (e.g. a second server on the same
                        # SQLite file marked it interrupted): its record is left as it is.
                        log.warning(
                            "run %s ended %s here, but its registry row is not ours any more",
                            record.run_id,
                            status.value,
                        )
            self._forget(live)

    def _forget(self, live: LiveRun) -> None:
        if self._live.pop(live.key, None) is live:
            self._per_tenant[live.record.tenant] -= 1
        runs = self._threads.get(live.thread_key)
        if runs is not None and live in runs:
            runs.remove(live)
            if not runs:
                del self._threads[live.thread_key]
        live.finish()

    async def _poll_stop(self, stop: StopSignal) -> None:
        """Asks the store for a cancel recorded elsewhere every `follow_poll_s` until one
        is found (for a run that waits, and so passes no speaker boundary)."""
        while not stop.requested:
            await asyncio.sleep(self.follow_poll_s)
            await stop.refresh()

    async def _keep_lease(self, live: LiveRun) -> None:
        """Renews the run's lease while it runs; honours cancels recorded by other replicas.

        A lost lease means another replica took the run over (this one was presumed dead):
        stop at once, so one run never executes twice.
        """
        record = live.record
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                kept = await self.store.renew_lease(
                    record.tenant, record.run_id, self.owner, self.lease_s
                )
                if self.store.shared:
                    reason = await self._remote_cancel(record, immediate_only=True)
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

    async def _remote_cancel(
        self, record: RunRecord, *, immediate_only: bool = False, sink: RunSink | None = None
    ) -> str:
        """The reason of a cancel another replica recorded for this run, or "".

        With the run's sink: when it appended a durable event since it was last asked (a
        speaker boundary always follows the previous speaker's final), the row as that
        append saw it, read in the append's own round trip; else the row read now. A cancel
        committed in the moment between that append and the boundary (one `sleep(0)`) is
        honoured at the boundary after, one speaker later.
        """
        fresh, mark = sink.take_cancel_mark() if sink is not None else (False, None)
        if not fresh:
            current = await self.store.get_run(record.tenant, record.run_id)
            if current is not None and current.cancel_mode:
                mark = CancelMark(current.cancel_mode, current.cancel_reason)
        if mark is None or (immediate_only and mark.mode != "immediate"):
            return ""
        return mark.reason or "cancel_requested"

    def _follow(
        self,
        record: RunRecord,
        *,
        after_seq: int,
        takeover: Callable[[], Awaitable[Subscription]] | None = None,
    ) -> Subscription:
        """Follows a run another replica executes, through the event log, to its end.

        When that replica's lease runs out (it died), a StartRun follower takes the run
        over (`takeover` resumes it here); a StreamRun follower ends with RunOrphaned.
        """
        subscription = Subscription([], ended=False, buffer=self.limits.stream_buffer)
        subscription.follower = asyncio.create_task(
            self._pump(record.tenant, record.run_id, after_seq, subscription, takeover),
            name=f"follow:{record.run_id}",
        )
        return subscription

    async def _pump(
        self,
        tenant: str,
        run_id: str,
        after_seq: int,
        sub: Subscription,
        takeover: Callable[[], Awaitable[Subscription]] | None,
    ) -> None:
        seen = after_seq
        ended = False  # whether the last event read ends an execution of the run
        while True:
            stored = await self.store.read_events(tenant, run_id, seen)
            for item in stored:
                event = epb.RunEvent.FromString(item.body)
                # The log keeps the events: wait for a slow reader instead of buffering.
                while sub.full:  # noqa: ASYNC110 (polling a queue we do not own)
                    await asyncio.sleep(self.follow_poll_s)
                sub.push(event)
                seen = event.seq
                ended = event.WhichOneof("payload") in TERMINAL_KINDS
            if stored and not ended:
                await asyncio.sleep(self.follow_poll_s)
                continue
            # Nothing new, or an execution's end: only the registry says whether the run
            # goes on (a resumed run's log holds the end of an earlier execution).
            record = await self.store.get_run(tenant, run_id)
            if record is None or record.status not in ACTIVE:
                if await self.store.read_events(tenant, run_id, seen):
                    continue  # appended between the two reads: hand them on first
                sub.end()
                return
            if record.lease_until < time.time():
                if ended:
                    # Its replica died after the run's end, before recording it.
                    sub.end()
                    return
                if takeover is None:
                    sub.end(RunOrphaned(run_id))
                    return
                try:
                    source = await takeover()
                except RoundtableError as exc:
                    # E.g. Draining, TooManyRuns, ThreadBusy: the stream ends with it.
                    sub.end(exc)
                    return
                await self._forward(source, sub, seen)
                return
            await asyncio.sleep(self.follow_poll_s)

    @staticmethod
    async def _forward(source: Subscription, sink: Subscription, seen: int) -> None:
        """Hands on `source`'s events that `sink` has not had yet, then its end.

        Through `offer`, as a live run hands events to its streams: a slow reader loses
        deltas and, too far behind, gets StreamOverflow (it re-attaches), instead of this
        process buffering for it without bound.
        """
        async for event in source:
            durable = event.WhichOneof("payload") != "assistant_delta"
            if durable and event.seq <= seen:
                continue
            if not sink.offer(event, durable=durable):
                return  # the reader fell too far behind: its stream has ended
        sink.end(source.error)

    # -- following, cancelling, describing --------------------------------------------------

    async def stream(self, tenant: str, run_id: str, after_seq: int) -> Subscription:
        """Replays durable events after `after_seq`, then follows the live run.

        Raises:
            RunNotFound: no such run for this tenant.
        """
        live = self._live.get((tenant, run_id))
        if live is not None:
            if after_seq > live.record.last_seq:
                # As for a finished run: a seq the run never gave out is the caller's
                # mistake (another run's seq, say), not something to wait for.
                raise StreamGap(
                    f"after_seq {after_seq} is past the run's last seq {live.record.last_seq}"
                )
            return await self._subscribe(live, after_seq=after_seq)
        record = await self.store.get_run(tenant, run_id)
        if record is None:
            raise RunNotFound(run_id)
        if record.status in ACTIVE and record.leased_by_other(self.owner, time.time()):
            return self._follow(record, after_seq=after_seq)
        stored = await self.store.read_events(tenant, run_id, 0)
        last = stored[-1].seq if stored else 0
        if after_seq > last:
            raise StreamGap(f"after_seq {after_seq} is past the run's last seq {last}")
        if [e.seq for e in stored] != list(range(1, last + 1)):
            # Never skip silently: a gap means the log lost events the caller has not seen.
            raise StreamGap(f"the event log of run {run_id!r} is missing events")
        events = [epb.RunEvent.FromString(e.body) for e in stored if e.seq > after_seq]
        last_event = epb.RunEvent.FromString(stored[-1].body) if stored else None
        return _stored_stream(record, events, last_event)

    async def _subscribe(self, live: LiveRun, *, after_seq: int) -> Subscription:
        """A stream of a run this process executes: durable events after `after_seq`, then
        the live ones."""
        live.check_room()  # before reading the log for it
        first_in_memory = live.backlog[0].seq if live.backlog else live.record.last_seq + 1
        head: list[epb.RunEvent] = []
        if after_seq + 1 < first_in_memory:
            # Events of an earlier execution of the run are in the log, not in memory.
            record = live.record
            stored = await self.store.read_events(record.tenant, record.run_id, after_seq)
            head = [epb.RunEvent.FromString(e.body) for e in stored]
        return live.subscribe(after_seq, head=head)

    def unsubscribe(self, tenant: str, run_id: str, sub: Subscription) -> None:
        """Detaches a stream whose client went away."""
        if sub.follower is not None:
            sub.follower.cancel()
        live = self._live.get((tenant, run_id))
        if live is not None:
            live.unsubscribe(sub)

    async def cancel(
        self, tenant: str, run_id: str, *, immediate: bool, reason: str
    ) -> CancelResult:
        """Asks a run to stop (gracefully at the next speaker boundary, or now).

        Raises:
            RunNotFound: no such run for this tenant.
        """
        live = self._live.get((tenant, run_id))
        if live is not None:
            live.stop.request(reason or "cancel_requested")
            if immediate:
                live.interrupt_graph()
            return CancelResult(True, live.record, live.progress)
        record, progress = await self.describe(tenant, run_id)
        if record.status in ACTIVE and record.leased_by_other(self.owner, time.time()):
            # Another replica runs it: record the cancel there; it stops at its next
            # speaker boundary (an immediate cancel within a third of a lease).
            mode = "immediate" if immediate else "graceful"
            if await self.store.request_cancel(tenant, run_id, mode, reason or "cancel_requested"):
                return CancelResult(True, record, progress)
            # It ended between the read and the write: say so, with its end.
            record, progress = await self.describe(tenant, run_id)
        return CancelResult(False, record, progress)

    async def describe(self, tenant: str, run_id: str) -> tuple[RunRecord, Progress]:
        """The run's record and progress.

        Raises:
            RunNotFound: no such run for this tenant.
        """
        live = self._live.get((tenant, run_id))
        if live is not None:
            return live.record, live.progress
        record = await self.store.get_run(tenant, run_id)
        if record is None:
            raise RunNotFound(run_id)
        progress = Progress()
        for stored in await self.store.read_events(tenant, run_id, 0):
            progress.observe(epb.RunEvent.FromString(stored.body))
            record.last_seq = stored.seq
        return record, progress

    # -- shutting down ----------------------------------------------------------------------

    async def drain(self, grace_s: float) -> None:
        """Stops taking runs, lets live ones reach a speaker boundary, interrupts the rest."""
        self._draining = True
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

    @property
    def live_count(self) -> int:
        """Runs executing now."""
        return len(self._live)


def _completed(state: dict[str, Any], progress: Progress) -> RunCompleted:
    replies = [r for r in state.get("replies", []) if not r["failed"]]
    return RunCompleted(
        replies=tuple(
            ReplySummary(reply_id=r["reply_id"], member_id=r["member_id"], step=r["step"])
            for r in sorted(replies, key=lambda r: r["step"])
        ),
        usage=TokenUsage(state.get("input_tokens", 0), state.get("output_tokens", 0)),
        converged=bool(state.get("converged", True)),
        rounds=max(progress.rounds, int(state.get("round", 0))),
    )


def _cancelled(reason: str, progress: Progress) -> RunCancelled:
    return RunCancelled(
        reason=reason,
        finished_reply_ids=tuple(progress.finished_reply_ids),
        steps_left=tuple(progress.steps_left),
    )
