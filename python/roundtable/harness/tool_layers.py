"""The tool harness's layers. Each holds the next handler and takes one `ToolRequest`.

Outermost first: Breaker -> Retry -> Audit -> Telemetry -> Timeout -> tool server. As for
model calls (layers.py): the breaker is consulted once per call, every attempt gets one
audit record and one span, and the timeout bounds one attempt. There is no failover: a
tool lives on one server.

These are small layers of their own rather than the model layers made generic: those
carry what only model calls have (failover targets, streamed text to restart, a 429's
Retry-After), and typing them over two request kinds would cost the model path for
nothing. What is shared is shared as classes: the policies, the breakers and the auditor.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from roundtable.domain.errors import ToolCircuitOpen, ToolError, ToolTimeout
from roundtable.domain.snapshot import server_of
from roundtable.domain.tools import ToolResult, ToolServer
from roundtable.harness.audit import Auditor, ToolAuditRecord
from roundtable.harness.breaker import BreakerBoard
from roundtable.harness.policies import RetryPolicy, ToolTimeoutPolicy, backoff_s, is_transient
from roundtable.harness.request import ToolHandler, ToolRequest
from roundtable.telemetry.attributes import correlation

TOOL_ERROR = "tool_error"
"""The span's error.type when the tool ran and reported an error (MCP semantic conventions)."""


def breaker_key(server: ToolServer) -> str:
    """The breaker of a tool server: its URL without user info or query (which may hold a
    key; the breaker's key is also a metric label). Not the `server_id`, a name each
    session gives its servers: two tenants' "search" servers are two servers, and one
    being down must not refuse calls to the other (model targets' keys start `llm:`)."""
    return f"mcp:{server_of(server.url)}"


class ToolTimeoutLayer:
    """Bounds one attempt: the tool's own timeout, else the policy's default."""

    def __init__(self, next_handler: ToolHandler, policy: ToolTimeoutPolicy) -> None:
        self.next = next_handler
        self.policy = policy

    async def __call__(self, request: ToolRequest) -> ToolResult:
        seconds = self.policy.seconds_for(request.ref.tool.timeout_s)
        try:
            async with asyncio.timeout(seconds):
                return await self.next(request)
        except TimeoutError:
            error = ToolTimeout(f"no answer within {seconds:g}s")
            error.callers_deadline = seconds < self.policy.default_s
            raise error from None


class ToolTelemetryLayer:
    """Wraps one attempt in an `execute_tool <name>` span (GenAI semantic conventions),
    with the call's correlation attributes and never its arguments or result."""

    def __init__(self, next_handler: ToolHandler, tracer: trace.Tracer | None) -> None:
        self.next = next_handler
        self.tracer = tracer
        """None: nothing is traced, and no span is made."""

    async def __call__(self, request: ToolRequest) -> ToolResult:
        if self.tracer is None:
            return await self.next(request)
        ref = request.ref
        meta = request.meta
        attributes: dict[str, AttributeValue] = {
            **correlation(
                thread_id=meta.thread_id,
                run_id=meta.run_id,
                request_id=meta.request_id,
                tenant=meta.tenant,
                caller_node=meta.caller_node,
            ),
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": ref.tool.name,
            "gen_ai.tool.call.id": ref.key,
            # Called by the agent (here, Roundtable) on an external service.
            "gen_ai.tool.type": "extension",
            "roundtable.tool.server_id": ref.server.server_id,
            "roundtable.attempt": request.attempt,
        }
        # The span is current while the MCP SDK sends the request: its own client span is
        # a child of this one, and the trace context it puts in `_meta` continues the
        # trace into the tool server.
        with self.tracer.start_as_current_span(
            f"execute_tool {ref.tool.name}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                result = await self.next(request)
            except ToolError as exc:
                # The code, never the message.
                span.set_attribute("error.type", exc.code)
                span.set_status(Status(StatusCode.ERROR, exc.code))
                raise
            except asyncio.CancelledError:
                span.set_attribute("error.type", "cancelled")
                raise
            if result.is_error:
                span.set_attribute("error.type", TOOL_ERROR)
                span.set_status(Status(StatusCode.ERROR, TOOL_ERROR))
            return result


class ToolAuditLayer:
    """Writes one audit record per attempt: which tool, how it ended, how long."""

    def __init__(self, next_handler: ToolHandler, auditor: Auditor) -> None:
        self.next = next_handler
        self.auditor = auditor

    async def __call__(self, request: ToolRequest) -> ToolResult:
        started = time.perf_counter()
        try:
            result = await self.next(request)
        except ToolError as exc:
            status = "timeout" if isinstance(exc, ToolTimeout) else "error"
            self.auditor.record(ToolAuditRecord.of(request, status, started, error_code=exc.code))
            raise
        except asyncio.CancelledError:
            # The run was stopped mid-attempt: the tool may have run, so it is on record.
            self.auditor.record(ToolAuditRecord.of(request, "cancelled", started))
            raise
        self.auditor.record(
            ToolAuditRecord.of(request, "success", started, is_error=result.is_error)
        )
        return result


class ToolRetryLayer:
    """Retries transient errors (timeout, server unavailable) of read-only tools, with the
    model retries' backoff. A write tool is never sent twice from here: after a timeout or
    a dropped connection nobody knows whether it ran (its key lets the server tell)."""

    def __init__(
        self,
        next_handler: ToolHandler,
        policy: RetryPolicy,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], object] = asyncio.sleep,
    ) -> None:
        self.next = next_handler
        self.policy = policy
        self._rng = rng or random.Random()
        self._sleep = sleep

    async def __call__(self, request: ToolRequest) -> ToolResult:
        retries = self.policy.max_retries if request.ref.tool.read_only else 0
        retry = 0
        while True:
            attempt = request if not retry else request.with_attempt(request.attempt + retry)
            try:
                return await self.next(attempt)
            except ToolError as exc:
                if not is_transient(exc) or retry >= retries:
                    exc.attempts = retry + 1
                    raise
            retry += 1
            await self._sleep(backoff_s(self.policy, retry, self._rng))  # type: ignore[misc]


class ToolBreakerLayer:
    """Refuses calls to a tool server whose breaker is open; counts its system failures.

    A result with `is_error` is a success here: the server answered, so it is healthy.
    """

    def __init__(self, next_handler: ToolHandler, board: BreakerBoard, auditor: Auditor) -> None:
        self.next = next_handler
        self.board = board
        self.auditor = auditor

    async def __call__(self, request: ToolRequest) -> ToolResult:
        server_id = request.ref.server.server_id
        breaker = self.board.get(breaker_key(request.ref.server))
        if not breaker.allow():
            self.auditor.record(
                ToolAuditRecord.of(
                    request, "breaker_open", time.perf_counter(), error_code=ToolCircuitOpen.code
                )
            )
            raise ToolCircuitOpen(server_id)
        probe = breaker.probe_id
        try:
            result = await self.next(request)
        except ToolError as exc:
            breaker.on_failure(exc, probe=probe)
            raise
        except BaseException:
            breaker.on_abandon(probe=probe)
            raise
        breaker.on_success()
        return result
