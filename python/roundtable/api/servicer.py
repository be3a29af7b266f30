"""The gRPC servicer: parse, validate, hand off, map errors. Nothing else happens here.

`add_to_server` registers it like the generated `add_OrchestratorServiceServicer_to_server`,
except that StartRun's request is deserialized into a `ReceivedStartRun` (api/wire.py), so
the request's size and fingerprint come from the bytes received.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection
from typing import NoReturn

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from roundtable.api import convert
from roundtable.api.auth import Authenticator
from roundtable.api.errors import to_grpc_status
from roundtable.api.limits import RequestLimits
from roundtable.api.validation import validate_cancel, validate_run_ids, validate_start_run
from roundtable.api.wire import ReceivedStartRun
from roundtable.domain.errors import InvalidRequest, RoundtableError
from roundtable.domain.snapshot import Budgets, DisconnectPolicy
from roundtable.runs.manager import RunManager
from roundtable.runs.progress import Progress
from roundtable.store.base import RunRecord, RunStatus
from roundtable.telemetry.attributes import (
    CALLER_NODE,
    CONVERSATION_ID,
    RUN_ID,
    TENANT,
    THREAD_ID,
    run_correlation,
)
from roundtable.telemetry.metrics import Metrics, no_metrics
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb

log = logging.getLogger(__name__)

_STATUS = {
    RunStatus.QUEUED: pb.RUN_STATUS_QUEUED,
    RunStatus.RUNNING: pb.RUN_STATUS_RUNNING,
    RunStatus.SUCCEEDED: pb.RUN_STATUS_SUCCEEDED,
    RunStatus.CANCELLED: pb.RUN_STATUS_CANCELLED,
    RunStatus.INTERRUPTED: pb.RUN_STATUS_INTERRUPTED,
    RunStatus.FAILED: pb.RUN_STATUS_FAILED,
    RunStatus.CONTINUED: pb.RUN_STATUS_CONTINUED,
}


async def _abort(context: grpc.aio.ServicerContext, error: RoundtableError) -> NoReturn:
    await context.abort_with_status(to_grpc_status(error))
    raise AssertionError("abort_with_status returns only by raising")


def run_to_proto(record: RunRecord, progress: Progress) -> pb.Run:
    """The contract's view of a run."""
    return pb.Run(
        run_id=record.run_id,
        thread_id=record.thread_id,
        tenant=record.tenant,
        status=_STATUS[record.status],
        plan=convert.plan_steps_to_proto(progress.steps),
        finished_reply_ids=progress.finished_reply_ids,
        last_seq=record.last_seq,
        created_at=convert.timestamp(record.created_at),
        updated_at=convert.timestamp(record.updated_at),
        continued_by_run_id=record.continued_by,
    )


_TRACE_KEYS = frozenset({"traceparent", "tracestate", "baggage"})


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


class OrchestratorServicer:
    """Implements roundtable.v1.OrchestratorService over a RunManager."""

    def __init__(
        self,
        manager: RunManager,
        *,
        limits: RequestLimits,
        providers: Collection[str],
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
        self.budgets = budgets

    def _count(self, event: epb.RunEvent) -> None:
        self.metrics.events_streamed.add(1, {"roundtable.event": event.WhichOneof("payload") or ""})

    async def StartRun(
        self, received: ReceivedStartRun, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StartRunResponse]:
        """Validates the turn, then streams its events (see the proto for semantics)."""
        request = received.message
        violations = validate_start_run(
            request,
            limits=self.limits,
            providers=self.providers,
            wire_size=received.wire_size,
            history=received.history,
        )
        if violations:
            await _abort(context, InvalidRequest(violations))
        run_request = convert.run_request_from_proto(
            received, limits=self.limits, defaults=self.budgets
        )
        credentials = dict(request.credentials)
        thread_id = request.context.thread_id
        del request
        # The RPC span (made by the OpenTelemetry interceptor before the request was parsed)
        # gets the correlation attributes too.
        trace.get_current_span().set_attributes(run_correlation(run_request.context, "StartRun"))
        try:
            self.auth.authorize_start(context, run_request.context.tenant)
            # The legacy fingerprint hashes the bytes received, so it can only be computed
            # before they are released below (a later takeover of a followed run recorded by
            # an older version then answers ALREADY_EXISTS; the run stays reachable by
            # StreamRun).
            caller = _caller_trace(context)
            token = otel_context.attach(caller) if caller is not None else None
            try:
                subscription = await self.manager.start(
                    run_request,
                    credentials,
                    legacy_fingerprint=lambda: convert.legacy_fingerprint(
                        thread_id, received.snapshot_bytes()
                    ),
                )
            finally:
                if token is not None:
                    otel_context.detach(token)
        except RoundtableError as exc:
            await _abort(context, exc)
        finally:
            received.release()
        tenant, run_id = run_request.context.tenant, run_request.context.run_id
        try:
            async for event in subscription:
                self._count(event)
                yield pb.StartRunResponse(event=event)
            if subscription.error is not None:
                await _abort(context, subscription.error)
        finally:
            if not subscription.reached_end:
                self.manager.unsubscribe(tenant, run_id, subscription)
                # Only a client that went away is a dropped stream: one the server ended
                # with an error (a reader too slow for its buffer, told to re-attach) must
                # find its run going on when it does.
                if (
                    subscription.error is None
                    and run_request.options.disconnect_policy is DisconnectPolicy.CANCEL
                ):
                    await self.manager.cancel(
                        tenant, run_id, immediate=False, reason="stream_dropped"
                    )

    async def StreamRun(
        self, request: pb.StreamRunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamRunResponse]:
        """Replays durable events after after_seq, then follows the live run."""
        violations = validate_run_ids(request.run_id, request.tenant, self.limits)
        if violations:
            await _abort(context, InvalidRequest(violations))
        _mark_span(request.tenant, request.run_id, "StreamRun")
        try:
            self.auth.authorize_access(context, request.tenant, request.run_id)
            subscription = await self.manager.stream(
                request.tenant, request.run_id, request.after_seq
            )
        except RoundtableError as exc:
            await _abort(context, exc)
        try:
            async for event in subscription:
                self._count(event)
                yield pb.StreamRunResponse(event=event)
            if subscription.error is not None:
                await _abort(context, subscription.error)
        finally:
            if not subscription.reached_end:
                self.manager.unsubscribe(request.tenant, request.run_id, subscription)

    async def CancelRun(
        self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelRunResponse:
        """Asks a run to stop; says so when it had already ended."""
        violations = validate_cancel(request, self.limits)
        if violations:
            await _abort(context, InvalidRequest(violations))
        _mark_span(request.tenant, request.run_id, "CancelRun")
        try:
            self.auth.authorize_access(context, request.tenant, request.run_id)
            result = await self.manager.cancel(
                request.tenant,
                request.run_id,
                immediate=request.mode == pb.CANCEL_MODE_IMMEDIATE,
                reason=request.reason or "cancel_requested",
            )
        except RoundtableError as exc:
            await _abort(context, exc)
        _mark_span(request.tenant, request.run_id, "CancelRun", result.record.thread_id)
        return pb.CancelRunResponse(
            outcome=pb.CANCEL_OUTCOME_REQUESTED
            if result.accepted
            else pb.CANCEL_OUTCOME_ALREADY_ENDED,
            run=run_to_proto(result.record, result.progress),
        )

    async def GetRun(
        self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRunResponse:
        """The run's status, plan, finished replies and last seq."""
        violations = validate_run_ids(request.run_id, request.tenant, self.limits)
        if violations:
            await _abort(context, InvalidRequest(violations))
        _mark_span(request.tenant, request.run_id, "GetRun")
        try:
            self.auth.authorize_access(context, request.tenant, request.run_id)
            record, progress = await self.manager.describe(request.tenant, request.run_id)
        except RoundtableError as exc:
            await _abort(context, exc)
        _mark_span(request.tenant, request.run_id, "GetRun", record.thread_id)
        return pb.GetRunResponse(run=run_to_proto(record, progress))


def _mark_span(tenant: str, run_id: str, rpc: str, thread_id: str = "") -> None:
    """Puts what this RPC knows of the run's correlation on its span (the gRPC
    interceptor's, when spans are exported): an operator finds a cancel or a re-attach by
    its run id, tenant or thread like every other span of the run."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    attributes = {RUN_ID: run_id, TENANT: tenant, CALLER_NODE: rpc}
    if thread_id:
        attributes |= {THREAD_ID: thread_id, CONVERSATION_ID: thread_id}
    span.set_attributes(attributes)


def add_to_server(servicer: OrchestratorServicer, server: grpc.aio.Server) -> None:
    """Registers the servicer's RPCs under roundtable.v1.OrchestratorService.

    Built from the service descriptor, like the generated registration, except that
    StartRun's request is deserialized into a `ReceivedStartRun`.
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
            response_serializer=response_type.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)
