"""The runtime context: everything live a node needs, never checkpointed.

LangGraph passes it to nodes as `runtime.context` and does not write it to checkpoints
(unlike `config["configurable"]`), so credentials, the harness and the event sink live
here. The snapshot lives here too: it is immutable and re-sent by the gateway on every
resume (the run's fingerprint proves it is the same), so checkpoints stay as small as
the run's results instead of growing with the history.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry import trace

from roundtable.domain.events import SHUTDOWN_REASON, Event, TokenUsage
from roundtable.domain.plan import PlanSource, PlanStep
from roundtable.domain.snapshot import RunRequest
from roundtable.domain.tools import ToolCallStore, ToolResult
from roundtable.graph.directives import Directive
from roundtable.harness.chain import Harness
from roundtable.harness.request import ToolRequest
from roundtable.telemetry.metrics import Metrics, no_metrics


class EventSink(Protocol):
    """Where nodes write events. The runs layer numbers, stores and streams them."""

    async def emit(self, event: Event) -> None:
        """Emits a durable event; returns once it is committed to the event log."""
        ...

    def delta(self, reply_id: str, text: str, attempt: int) -> None:
        """Emits streamed reply text (live only, coalesced, never stored)."""
        ...


class StopSignal:
    """A graceful stop request, checked at every speaker boundary: by dispatch before each
    speaker, and by the supervisor before a later round.

    With a shared store, `poller` also asks the store whether another replica recorded a
    cancel for this run (one query per speaker boundary).
    """

    def __init__(self) -> None:
        self.reason = ""
        self.poller: Callable[[bool], Awaitable[str]] | None = None
        """Reads a stop recorded elsewhere; given True, from the store now, not as the
        run's last append saw it."""
        self._waiter: asyncio.Future[None] | None = None
        """Made only when something waits (`wait`): most runs never do, and a parked
        run's memory counts."""

    async def refresh(self, *, now: bool = False) -> None:
        """Picks up a stop recorded elsewhere (no-op without a poller); `now`: read now,
        not as the run's last append saw it (a speaker boundary follows an append, a new
        turn on the thread does not)."""
        if self.poller is not None and not self.denies:
            reason = await self.poller(now)
            if reason:
                self.request(reason)

    @property
    def requested(self) -> bool:
        """Whether a stop was requested."""
        return bool(self.reason)

    @property
    def denies(self) -> bool:
        """Whether the stop denies the tool calls waiting for a person (recorded
        `cancelled`): any stop someone asked for (a cancel, 停止, a new run's interrupt), not
        a server's shutdown, which leaves them to be decided when the run resumes."""
        return bool(self.reason) and self.reason != SHUTDOWN_REASON

    def request(self, reason: str) -> None:
        """Asks the run to stop before its next speaker. The first reason wins, but one
        someone asked for (a cancel, 停止) replaces a shutdown's: it denies the calls still
        waiting, and the run ends cancelled, not interrupted (review: a cancel during the
        drain's grace was dropped, and the next server asked the person anyway)."""
        if not self.reason or (self.reason == SHUTDOWN_REASON and reason != SHUTDOWN_REASON):
            self.reason = reason
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        """Returns once a stop is requested (at once if one was)."""
        if self.reason:
            return
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._waiter)


class Parked(Exception):
    """Raised when speakers wait for a person's decision on tool calls: the run's execution
    ends here, holding nothing in memory, and resumes from those calls once decided."""

    def __init__(self, call_keys: tuple[str, ...], expires_at: float) -> None:
        super().__init__(", ".join(call_keys))
        self.call_keys = call_keys
        self.expires_at = expires_at
        """When the first of the waiting calls expires (seconds since the epoch): the run
        goes on then, with that call denied as `expired`."""


class ToolCaller(Protocol):
    """Runs one tool call through the tool harness (`harness.tool_chain.ToolHarness`:
    breaker, retry, audit, span, timeout)."""

    async def call(self, request: ToolRequest) -> ToolResult:
        """Calls the tool once it is allowed to run.

        Raises:
            ToolError: the call failed before the tool answered (after its retries).
        """
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolRuntime:
    """What a member's tool calls need: the harness that sends them and the store that
    records each one before it is sent and its result before the model sees it."""

    caller: ToolCaller
    store: ToolCallStore
    clock: Callable[[], float] = time.time


class Drained(Exception):
    """Raised at a speaker boundary when a graceful stop was requested."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Prior:
    """What earlier executions of this run (or the run a continue turn takes over) left."""

    steps: tuple[PlanStep, ...] = ()
    """Steps already planned, in order."""
    finished: Mapping[str, str | None] = field(default_factory=dict)
    """reply_id -> content of replies already final, or None for speakers that failed."""
    usage: Mapping[str, TokenUsage] = field(default_factory=dict)
    """reply_id -> the tokens a final in the log reports."""
    rounds: int = 0
    memory_proposed: bool = False
    """Whether memory_proposed is already in the log (it is not emitted twice)."""
    verdicts: Mapping[int, tuple[PlanSource, bool]] = field(default_factory=dict)
    """round -> (who planned it, whether the discussion was finished after it)."""
    announced: frozenset[str] = frozenset()
    """Permission requests already in the log (permission_required is not emitted twice)."""
    started: Mapping[str, int] = field(default_factory=dict)
    """reply_id -> the attempt the reply's last logged speaker_started began."""

    def usage_of(self, reply_ids: Iterable[str]) -> TokenUsage:
        """The tokens the logged finals of these replies report, summed."""
        total = TokenUsage()
        for reply_id in reply_ids:
            total = total + self.usage.get(reply_id, TokenUsage())
        return total

    def planned(self, round_no: int) -> list[PlanStep] | None:
        """The steps of a round already planned (and announced) by an earlier execution, or
        None when its plan is not in the log (a logged plan may have no step: a stop turn's,
        an empty round's, and is not made or announced again either)."""
        if round_no not in self.verdicts:
            return None
        return [s for s in self.steps if s.round == round_no]

    def verdict(self, round_no: int) -> tuple[PlanSource, bool]:
        """Who planned a logged round and whether more rounds were wanted after it."""
        return self.verdicts.get(round_no, (PlanSource.DETERMINISTIC, True))


@dataclass(frozen=True, slots=True, kw_only=True)
class Continuation:
    """The steps an earlier cancelled or interrupted run of the thread left (for "continue")."""

    run_id: str
    steps: tuple[PlanStep, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphContext:
    """The runtime context of one run."""

    request: RunRequest
    directive: Directive
    harness: Harness
    sink: EventSink
    stop: StopSignal
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    prior: Prior = Prior()
    continuation: Continuation | None = None
    continued_words: str = ""
    """The user's words the steps a continue turn took over answer ("": none taken)."""
    tracer: trace.Tracer | None = None
    """Spans for nodes and speakers; None when nothing is traced (no span is even made)."""
    metrics: Metrics = field(default_factory=no_metrics)
    tools: ToolRuntime | None = None
    """None where no tool can run (a server built without one, unit tests)."""
