"""The gRPC servicer: validate, authorize, mark the span, hand off, map errors.

Each RPC is a few lines over one of two wrappers: `_unary` for the unary calls and
`_streaming` for the two that stream a run's events. A wrapper turns the project's own
errors into their status (api/errors.py) and, for a stream, sends each event's bytes as
the codec made them when the event was logged (`Envelope.wire`): nothing is encoded again
on the way out, only framed as the response's one field.

`add_to_server` registers it like the generated `add_OrchestratorServiceServicer_to_server`,
except that StartRun's request is deserialized into a `ReceivedStartRun` (api/wire.py), so
the request's size and fingerprint come from the bytes received.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from roundtable.api import convert
from roundtable.api.auth import Authenticator
from roundtable.api.errors import to_grpc_status
from roundtable.api.limits import RequestLimits
from roundtable.api.validate_tools import validate_resolve
from roundtable.api.validation import validate_cancel, validate_run_ids, validate_start_run
from roundtable.api.wire import ReceivedStartRun
from roundtable.codec.events import encode, kind_of
from roundtable.codec.timestamps import timestamp
from roundtable.domain.errors import InvalidRequest, RoundtableError
from roundtable.domain.snapshot import BaseUrlRule, Budgets, DisconnectPolicy
from roundtable.domain.tools import Verdict
from roundtable.runs.live import Subscription
from roundtable.runs.manager import RunManager
from roundtable.telemetry.attributes import rpc_correlation, run_correlation
from roundtable.telemetry.metrics import Metrics, no_metrics
from roundtable.v1 import orchestrator_service_pb2 as pb

log = logging.getLogger(__name__)

T = TypeVar("T")

_TRACE_KEYS = frozenset({"traceparent", "tracestate", "baggage"})
_EVENT_FIELD_TAG = b"\x0a"  # field 1 (`event`), length-delimited: both response messages


async def _abort(context: grpc.aio.ServicerContext, error: RoundtableError) -> NoReturn:
    status = to_grpc_status(error)
    # The OpenTelemetry interceptor's span learns the code from set_code or abort, never
    # from abort_with_status (outside testing: every failed RPC's span said OK).
    context.set_code(status.code)
    context.set_details(status.details)
    await context.abort_with_status(status)
    raise AssertionError("abort_with_status returns only by raising")


def _mark_span(attributes: dict[str, str]) -> None:
    """Puts the RPC's correlation on its span (the gRPC interceptor's, when spans are
    exported): an operator finds a cancel or a re-attach by its run id, tenant or thread
    like every other span of the run."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(attributes)


def _caller_trace(context: grpc.aio.ServicerContext) -> otel_context.Context | None:
    """The gateway's W3C trace context, where no tracing interceptor took it in already.

    `serve` leaves the OpenTelemetry interceptor out when no spans are exported; the run's
    record still keeps the caller's span (`RunRecord.trace_context`), so a replica that
    does export spans links a resumed run to it.
    """
    if trace.get_current_span().get_span_context().is_valid:
        return None
    carrier = {k: v for k, v in context.invocation_metadata() or () if k in _TRACE_KEYS}
    if "traceparent" not in carrier:
        return None
    return propagate.extract(carrier)


def frame_event(wire: bytes) -> bytes:
    """A StartRunResponse or StreamRunResponse holding the RunEvent `wire`, as bytes:
    both are a message with the event as field 1, so the event's bytes are sent as they
    are, behind their tag and length."""
    size, prefix = len(wire), bytearray(_EVENT_FIELD_TAG)
    while size >= 0x80:
        prefix.append((size & 0x7F) | 0x80)
        size >>= 7
    prefix.append(size)
    return bytes(prefix) + wire


@dataclass(frozen=True, slots=True)
class _Opened:
    """A stream of a run, opened for an RPC."""

    subscription: Subscription
    tenant: str
    run_id: str
    cancel_on_drop: bool = False
    """Whether a client that goes away cancels the run (DisconnectPolicy.CANCEL)."""


class OrchestratorServicer:
    """Implements roundtable.v1.OrchestratorService over a RunManager."""

    def __init__(
        self,
        manager: RunManager,
        *,
        limits: RequestLimits,
        providers: Collection[str],
        base_url_rules: Mapping[str, BaseUrlRule] | None = None,
        budgets: Budgets,
        metrics: Metrics | None = None,
        auth: Authenticator | None = None,
    ) -> None:
        self.manager = manager
        # Which tenants each caller may act for (default: no caller auth, any tenant).
        self.auth = auth or Authenticator()
        self.metrics = metrics or no_metrics()
        self.limits = limits
        self.providers = frozenset(providers)
        self.base_url_rules = dict(base_url_rules or {})
        self.budgets = budgets

    # -- the two wrappers ---------------------------------------------------------------------

    @staticmethod
    async def _unary(context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[T]]) -> T:
        """Runs a unary call, its errors sent as their status."""
        try:
            return await call()
        except RoundtableError as exc:
            await _abort(context, exc)

    async def _streaming(
        self, context: grpc.aio.ServicerContext, open_stream: Callable[[], Awaitable[_Opened]]
    ) -> AsyncIterator[bytes]:
        """Opens a stream of a run's events and sends them until the run's end (or the
        stream's: its error as a status); detaches it if the client goes away."""
        try:
            opened = await open_stream()
        except RoundtableError as exc:
            await _abort(context, exc)
        sub = opened.subscription
        count = self.metrics.events_streamed.add
        try:
            async for envelope in sub:
                count(1, {"roundtable.event": kind_of(envelope.event)})
                yield encode(envelope)
            if sub.error is not None:
                await _abort(context, sub.error)
        finally:
            if not sub.reached_end:
                self.manager.unsubscribe(opened.tenant, opened.run_id, sub)
                # Only a client that went away is a dropped stream: one the server ended
                # with an error (a reader too slow for its buffer, told to re-attach) must
                # find its run going on when it does.
                if sub.error is None and opened.cancel_on_drop:
                    await self.manager.cancel(
                        opened.tenant, opened.run_id, immediate=False, reason="stream_dropped"
                    )

    # -- the RPCs -----------------------------------------------------------------------------

    async def StartRun(
        self, received: ReceivedStartRun, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Validates the turn, then streams its events (see the proto for semantics)."""
        async for wire in self._streaming(context, lambda: self._start(received, context)):
            yield wire

    async def _start(
        self, received: ReceivedStartRun, context: grpc.aio.ServicerContext
    ) -> _Opened:
        request = received.message
        violations = validate_start_run(
            request,
            limits=self.limits,
            providers=self.providers,
            base_url_rules=self.base_url_rules,
            wire_size=received.wire_size,
            history=received.history,
        )
        if violations:
            raise InvalidRequest(violations)
        run_request = convert.run_request_from_proto(
            received, limits=self.limits, defaults=self.budgets
        )
        credentials = dict(request.credentials)
        thread_id = request.context.thread_id
        del request
        ctx = run_request.context
        _mark_span(run_correlation(ctx, "StartRun"))
        try:
            self.auth.authorize_start(context, ctx.tenant)
            caller = _caller_trace(context)
            token = otel_context.attach(caller) if caller is not None else None
            try:
                subscription = await self.manager.start(
                    run_request,
                    credentials,
                    # Hashes the bytes received, so it can only be computed before they
                    # are released below (a later takeover of a followed run recorded by an
                    # older version then answers ALREADY_EXISTS; StreamRun still reaches it).
                    legacy_fingerprint=lambda: convert.legacy_fingerprint(
                        thread_id, received.snapshot_bytes()
                    ),
                )
            finally:
                if token is not None:
                    otel_context.detach(token)
        finally:
            received.release()
        cancel = run_request.options.disconnect_policy is DisconnectPolicy.CANCEL
        return _Opened(subscription, ctx.tenant, ctx.run_id, cancel_on_drop=cancel)

    async def StreamRun(
        self, request: pb.StreamRunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Replays durable events after after_seq, then follows the live run."""

        async def open_stream() -> _Opened:
            self._admit_run(context, request.tenant, request.run_id, "StreamRun")
            try:
                subscription = await self.manager.stream(
                    request.tenant, request.run_id, request.after_seq
                )
            except RoundtableError as exc:
                self._mark_run(request.tenant, request.run_id, "StreamRun", exc.thread_id)
                raise
            self._mark_run(request.tenant, request.run_id, "StreamRun", subscription.thread_id)
            return _Opened(subscription, request.tenant, request.run_id)

        async for wire in self._streaming(context, open_stream):
            yield wire

    async def CancelRun(
        self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelRunResponse:
        """Asks a run to stop; says so when it had already ended."""

        async def call() -> pb.CancelRunResponse:
            violations = validate_cancel(request, self.limits)
            if violations:
                raise InvalidRequest(violations)
            self._admit_run(context, request.tenant, request.run_id, "CancelRun", validated=True)
            result = await self.manager.cancel(
                request.tenant,
                request.run_id,
                immediate=request.mode == pb.CANCEL_MODE_IMMEDIATE,
                reason=request.reason or "cancel_requested",
            )
            self._mark_run(request.tenant, request.run_id, "CancelRun", result.record.thread_id)
            return pb.CancelRunResponse(
                outcome=pb.CANCEL_OUTCOME_REQUESTED
                if result.accepted
                else pb.CANCEL_OUTCOME_ALREADY_ENDED,
                run=convert.run_to_proto(result.record, result.progress),
            )

        return await self._unary(context, call)

    async def GetRun(
        self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRunResponse:
        """The run's status, plan, finished replies and last seq."""

        async def call() -> pb.GetRunResponse:
            self._admit_run(context, request.tenant, request.run_id, "GetRun")
            record, progress = await self.manager.describe(request.tenant, request.run_id)
            self._mark_run(request.tenant, request.run_id, "GetRun", record.thread_id)
            pending = await self.manager.approvals.pending(record, progress)
            return pb.GetRunResponse(run=convert.run_to_proto(record, progress, pending))

        return await self._unary(context, call)

    async def ResolvePermission(
        self, request: pb.ResolvePermissionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolvePermissionResponse:
        """Records a decision on a permission request; the run goes on."""

        async def call() -> pb.ResolvePermissionResponse:
            violations = validate_resolve(request, self.limits)
            if violations:
                raise InvalidRequest(violations)
            tenant, run_id = request.tenant, request.run_id
            self._admit_run(context, tenant, run_id, "ResolvePermission", validated=True)
            approve = request.decision == pb.PERMISSION_DECISION_APPROVE
            result = await self.manager.approvals.resolve(
                tenant,
                run_id,
                request.permission_request_id,
                Verdict.APPROVE if approve else Verdict.DENY,
                reason=request.reason,
                edited_arguments_json=request.edited_arguments_json,
            )
            self._mark_run(tenant, run_id, "ResolvePermission", result.record.thread_id)
            pending = await self.manager.approvals.pending(result.record, result.progress)
            return pb.ResolvePermissionResponse(
                decision=request.decision,
                decided_at=timestamp(result.call.decided_at),
                run=convert.run_to_proto(result.record, result.progress, pending),
                resumed=result.resumed,
            )

        return await self._unary(context, call)

    def _admit_run(
        self,
        context: grpc.aio.ServicerContext,
        tenant: str,
        run_id: str,
        rpc: str,
        *,
        validated: bool = False,
    ) -> None:
        """Validates a run's ids (unless the caller validated the whole request), marks the
        span, and checks that the caller may see the run.

        Raises:
            InvalidRequest: bad ids.
            RunNotFound: the caller may not act for `tenant` (the answer a missing run gets).
        """
        if not validated:
            violations = validate_run_ids(run_id, tenant, self.limits)
            if violations:
                raise InvalidRequest(violations)
        self._mark_run(tenant, run_id, rpc)
        self.auth.authorize_access(context, tenant, run_id)

    @staticmethod
    def _mark_run(tenant: str, run_id: str, rpc: str, thread_id: str = "") -> None:
        _mark_span(
            rpc_correlation(tenant=tenant, run_id=run_id, caller_node=rpc, thread_id=thread_id)
        )


def add_to_server(servicer: OrchestratorServicer, server: grpc.aio.Server) -> None:
    """Registers the servicer's RPCs under roundtable.v1.OrchestratorService.

    Built from the service descriptor, like the generated registration, except that
    StartRun's request is deserialized into a `ReceivedStartRun` and the two streaming
    RPCs send events as the bytes the codec made (`frame_event`).
    """
    service = pb.DESCRIPTOR.services_by_name["OrchestratorService"]
    handlers = {}
    for method in service.methods:
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),  # an RPC the servicer lacks fails here, at start-up
            request_deserializer=(
                ReceivedStartRun.parse if method.name == "StartRun" else request_type.FromString
            ),
            response_serializer=(
                frame_event if method.server_streaming else response_type.SerializeToString
            ),
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)
