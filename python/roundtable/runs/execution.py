"""The execution of one run in this process: from its queue to its terminal event.

An execution waits for the thread's earlier runs when it has to, emits run_started, runs
the conversation graph (the event sink commits every durable event before any stream sees
it), and always ends in one terminal event: run_completed, run_cancelled (a graceful or
immediate stop; a shutdown's stop leaves the run interrupted, to resume), or run_failed.
The terminal event and the run's final registry row are committed together (one commit on
the path of the stream's end, and no log that ended under a row still running); a run
that parks, or ends without its event, gets its row written on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from roundtable.domain.events import SHUTDOWN_REASON, RunFailed, RunStarted
from roundtable.domain.plan import DirectiveKind, Route
from roundtable.domain.snapshot import SessionKind
from roundtable.graph.context import (
    Continuation,
    Drained,
    GraphContext,
    Parked,
    Prior,
    ToolRuntime,
)
from roundtable.graph.directives import Directive
from roundtable.harness.chain import Harness
from roundtable.runs.approvals import decided_meanwhile, deny_waiting
from roundtable.runs.continuation import claim_continuation, continued_words
from roundtable.runs.coordination import Coordination
from roundtable.runs.identity import span_context
from roundtable.runs.live import LiveRun
from roundtable.runs.log import EventLog
from roundtable.runs.progress import cancelled_event, completed_event
from roundtable.runs.registry import LiveRegistry
from roundtable.runs.sink import RunSink
from roundtable.runs.threads import until_stopped
from roundtable.store.base import LeaseLost, RunRecord, RunStatus
from roundtable.telemetry.attributes import run_correlation
from roundtable.telemetry.metrics import Metrics, no_metrics

log = logging.getLogger(__name__)


def checkpoint_thread(tenant: str, run_id: str) -> str:
    """The LangGraph checkpoint thread of a run: one per (tenant, run)."""
    return f"{tenant}/{run_id}"


class RunDeadline(Exception):
    """The run's own run_timeout_seconds ran out (a TimeoutError from below is no deadline:
    review found a store's or a library's reported as RUN_DEADLINE_EXCEEDED, not retryable)."""


class NewThreads(Protocol):
    """The checkpoint saver's side of "this run has no checkpoint yet" (BoundarySaver)."""

    def expect_new(self, thread_id: str) -> None:
        """The thread's next checkpoint read may answer None without a database read."""

    def forget_new(self, thread_id: str) -> None:
        """Drops the mark if the run ended before reading."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """How one execution of a run starts. `credentials` stays in memory only."""

    credentials: dict[str, str] = field(repr=False)
    directive: Directive
    resumed: bool
    wait_for: Callable[[], Awaitable[Any]] | None
    """Waits until the thread's busy runs (here or on other replicas) have ended."""
    unparks: bool = False
    """The run waited for approval: this execution goes on with the one that parked it
    (no run_started: the log's last execution has not ended)."""


class Executor:
    """Executes runs of this process: the graph, with its context, to a terminal event."""

    def __init__(
        self,
        *,
        graph: Any,
        harness: Harness,
        log: EventLog,
        coordination: Coordination,
        registry: LiveRegistry,
        checkpoints: NewThreads | None = None,
        durability: str = "exit",
        tracer: trace.Tracer | None = None,
        metrics: Metrics | None = None,
        tools: ToolRuntime | None = None,
    ) -> None:
        self.graph = graph
        self.tools = tools
        """How members' tool calls run and are recorded; None: no member calls a tool."""
        self.harness = harness
        self.log = log
        self.coordination = coordination
        self.registry = registry
        self.checkpoints = checkpoints
        self.durability = durability
        self.tracer = tracer
        """Spans of runs, nodes and speakers; None: nothing is traced, no span is made."""
        self.metrics = metrics or no_metrics()

    def launch(self, live: LiveRun, launch: Launch) -> None:
        """Starts the run's execution in a task of its own."""
        ctx = live.request.context
        live.task = asyncio.create_task(
            self._execute(live, launch), name=f"run:{ctx.tenant}/{ctx.run_id}"
        )

    async def _execute(self, live: LiveRun, launch: Launch) -> None:
        """Runs the run in a span that continues the starting request's trace; a resumed
        run (perhaps in another process) links to the span that first ran it."""
        started = time.perf_counter()
        try:
            if self.tracer is None:
                await self._run_owned(live, launch)
                return
            first = span_context(live.record.trace_context) if launch.resumed else None
            links = [trace.Link(first, {"roundtable.link": "first_execution"})] if first else []
            attributes: dict[str, AttributeValue] = {
                **run_correlation(live.request.context, "run"),
                "roundtable.resumed": launch.resumed,
            }
            with self.tracer.start_as_current_span(
                "roundtable.run", attributes=attributes, links=links
            ):
                await self._run_owned(live, launch)
        finally:
            status = {"roundtable.status": live.record.status.value}
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

    async def _stopped(self, live: LiveRun, sink: RunSink, reason: str) -> RunStatus:
        """Ends a stopped execution with run_cancelled: interrupted for a shutdown, which
        nobody asked for (the same StartRun resumes it, its calls still wait for their
        person), else cancelled, the calls still waiting denied, as every cancel does."""
        if reason == SHUTDOWN_REASON:
            status = RunStatus.INTERRUPTED
        else:
            status = RunStatus.CANCELLED
            await deny_waiting(self.log.store, live)
        await sink.end(cancelled_event(reason, live.progress), status)
        return status

    async def _run(self, live: LiveRun, launch: Launch) -> None:
        """The execution, mapped to its terminal event and final status."""
        record = live.record
        sink = RunSink(live, self.log.store, self.coordination, first_seq=record.last_seq)
        sink.keeper = self.coordination.attend(live, sink)
        status = RunStatus.FAILED
        wake_at = 0.0
        waiting: tuple[str, ...] = ()
        try:
            state = await self._through_graph(live, launch, sink)
            if state is None:
                return  # taken over by another replica before the graph started
            status = RunStatus.SUCCEEDED
            await sink.end(completed_event(state, live.progress), status)
        except Parked as parked:
            # LangGraph keeps the exception in its task's writes: with its traceback it
            # holds the whole torn-down graph run in a cycle until a full collection
            # (measured: 18.9 -> 12.0 KB of RSS per waiting run, bench B8).
            traceback.clear_frames(parked.__traceback__)
            parked.with_traceback(None)
            if live.stop.denies:
                # Cancelled while its speakers waited for a person: it ends here, as a parked
                # run's cancel ends it (outside testing: parked during a drain instead, the
                # next server completed a run its user had cancelled).
                status = await self._stopped(live, sink, live.stop.reason)
            else:
                # Waiting for a person: no terminal event (the execution goes on once a
                # decision is recorded); the checkpoint is written, nothing of the graph stays.
                status = RunStatus.AWAITING_APPROVAL
                wake_at = parked.expires_at
                waiting = parked.call_keys
        except Drained as stop:
            status = await self._stopped(live, sink, stop.reason)
        except asyncio.CancelledError:
            if live.lease_lost:
                return  # nothing more may be written for a run another replica owns
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # The process is stopping: the run is interrupted, not cancelled by anyone.
                status = RunStatus.INTERRUPTED
                raise
            status = await self._stopped(live, sink, live.stop.reason or "cancel_requested")
        except LeaseLost:
            raise  # nothing more may be written: not even run_failed
        except RunDeadline:
            message = "the run took longer than its run_timeout_seconds"
            status = RunStatus.FAILED
            await sink.end(
                RunFailed(code="RUN_DEADLINE_EXCEEDED", message=message, retryable=False), status
            )
        except Exception as exc:
            # The run fails, the server does not: log the type only (a message could hold
            # prompt text), and tell the gateway it may retry.
            log.error("run %s failed: %s", record.run_id, type(exc).__name__)
            status = RunStatus.FAILED
            with contextlib.suppress(Exception):
                await sink.end(
                    RunFailed(code="INTERNAL", message=type(exc).__name__, retryable=True), status
                )
        finally:
            if sink.keeper is not None:
                sink.keeper.cancel()
            sink.flush()
            await self._finish(live, status, launch, wake_at, row_written=live.ended)
            if waiting and await decided_meanwhile(self.log.store, live, waiting):
                # A decision or a cancel came between permission_required and the park
                # (it found the run still executing): it goes on now.
                self.registry.wake(live)

    async def _through_graph(
        self, live: LiveRun, launch: Launch, sink: RunSink
    ) -> dict[str, Any] | None:
        """Waits its turn, emits run_started and runs the graph; None when the run was
        taken over before the graph started."""
        request = live.request
        # Every execution opens with run_started, even one cancelled while queued.
        started = RunStarted(
            route=Route.SINGLE
            if request.snapshot.session.kind is SessionKind.SINGLE
            else Route.GROUP,
            resumed=launch.resumed,
            thread_id=request.context.thread_id,
        )
        if launch.wait_for is not None:
            await self._wait_turn(live, launch.wait_for, sink, started)
        continuation = None
        if launch.unparks:
            return await self._invoke(live, launch, await self._context(live, launch, sink, None))
        if launch.directive.kind is DirectiveKind.CONTINUE and not live.progress.steps:
            # Claimed only now, once the run may start: a continue turn queued behind
            # another run takes over whatever is left when its turn comes.
            continuation = await claim_continuation(live.record, self.log)
        await sink.emit(started)
        context = await self._context(live, launch, sink, continuation)
        return await self._invoke(live, launch, context)

    async def _wait_turn(
        self,
        live: LiveRun,
        wait_for: Callable[[], Awaitable[Any]],
        sink: RunSink,
        started: RunStarted,
    ) -> None:
        """Queued behind the thread's other runs, until they end or this one is cancelled
        (which need not wait for them; a cancel recorded by another replica reaches it by
        polling)."""
        watcher = self.coordination.watch_queued(live.stop)
        try:
            await until_stopped(wait_for(), live.stop)
        finally:
            if watcher is not None:
                watcher.cancel()
        await live.stop.refresh()  # a cancel another replica recorded meanwhile
        if live.stop.requested:
            await sink.emit(started)
            raise Drained(live.stop.reason)
        live.record.status = RunStatus.RUNNING
        await self.log.store.update_run(live.record)

    async def _context(
        self, live: LiveRun, launch: Launch, sink: RunSink, continuation: Continuation | None
    ) -> GraphContext:
        progress, continues = live.progress, launch.directive.kind is DirectiveKind.CONTINUE
        words = await continued_words(live, self.log, continuation) if continues else ""
        return GraphContext(
            request=live.request,
            directive=launch.directive,
            harness=self.harness,
            sink=sink,
            stop=live.stop,
            credentials=launch.credentials,
            prior=Prior(
                steps=tuple(progress.steps),
                finished=dict(progress.finished),
                usage=dict(progress.usage),
                rounds=progress.rounds,
                memory_proposed=progress.memory_proposed,
                verdicts=dict(progress.verdicts),
                announced=frozenset(progress.permissions),
                started=dict(progress.started),
            ),
            tools=self.tools,
            continuation=continuation,
            continued_words=words,
            tracer=self.tracer,
            metrics=self.metrics,
        )

    async def _invoke(
        self, live: LiveRun, launch: Launch, context: GraphContext
    ) -> dict[str, Any] | None:
        record = live.record
        thread = checkpoint_thread(record.tenant, record.run_id)
        config = {"configurable": {"thread_id": thread}, "recursion_limit": 10_000}
        graph_input: dict[str, Any] | None = {}
        if not launch.resumed and self.checkpoints is not None:
            # A run's first execution: its checkpoint thread is its own, and empty.
            self.checkpoints.expect_new(thread)
        if launch.resumed:
            # Continue from the last checkpoint when there is one; the event log (in the
            # context) still decides which speakers are finished.
            checkpoint = await self.graph.aget_state(config)
            if checkpoint.next:
                graph_input = None
        if live.lease_lost:
            return None
        live.in_graph = True
        budgets = live.request.snapshot.session.budgets
        try:
            async with asyncio.timeout(budgets.run_timeout_s) as limit:
                state: dict[str, Any] = await self.graph.ainvoke(
                    graph_input, config, context=context, durability=self.durability
                )
        except TimeoutError:
            if limit.expired():
                raise RunDeadline from None
            raise
        finally:
            live.in_graph = False
            live.take_back_interrupts()
        return state

    async def _write_end(self, record: RunRecord, status: RunStatus) -> bool:
        """The run's row at the end of this execution: finished, or parked for approval
        (kept by this replica where replicas share the store). A parked run's record says
        so only once its row does: until `registry.park` it still holds its place, and a
        caller told it waits could start another run and be refused for want of room."""
        store, holder = self.log.store, self.coordination.owner
        if status is RunStatus.AWAITING_APPROVAL:
            owner, lease_until = self.coordination.park_holder()
            try:
                return await store.park_run(record, holder, owner, lease_until)
            finally:
                record.status, record.owner, record.lease_until = status, owner, lease_until
        record.status = status
        return await store.finish_run(record, holder)

    async def _finish(
        self,
        live: LiveRun,
        status: RunStatus,
        launch: Launch,
        wake_at: float,
        *,
        row_written: bool,
    ) -> None:
        """Writes the run's final row, unless its terminal event wrote it already
        (`row_written`) or another replica owns it now, and lets the run go."""
        record = live.record
        if self.checkpoints is not None:
            self.checkpoints.forget_new(checkpoint_thread(record.tenant, record.run_id))
        # With the lease lost, another replica owns the run: it writes the record, not us.
        if not live.lease_lost and not row_written:
            with contextlib.suppress(Exception):
                if not await self._write_end(record, status):
                    # Another process owns the row now (e.g. a second server on the same
                    # SQLite file marked it interrupted): its record is left as it is.
                    log.warning(
                        "run %s ended %s here, but its registry row is not ours any more",
                        record.run_id,
                        status.value,
                    )
        if status is RunStatus.AWAITING_APPROVAL and not live.lease_lost:
            self.registry.park(live, launch, wake_at)
        else:
            self.registry.forget(live)
