"""Errors typed from the wire, and the policy for every row of the contract's error table."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from roundtable_client import ERROR_DOMAIN, Reason, error_of
from roundtable_client.errors import Action, action_of


def wire_error(
    code: grpc.StatusCode,
    reason: str = "",
    delay: float | None = None,
    violations: tuple[tuple[str, str], ...] = (),
    domain: str = ERROR_DOMAIN,
) -> grpc.aio.AioRpcError:
    details = []
    if reason:
        details.append(error_details_pb2.ErrorInfo(reason=reason, domain=domain))
    if delay is not None:
        retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration())
        retry.retry_delay.FromNanoseconds(int(delay * 1e9))
        details.append(retry)
    if violations:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                    for f, d in violations
                ]
            )
        )
    packed = []
    for detail in details:
        entry = any_pb2.Any()
        entry.Pack(detail)
        packed.append(entry)
    status = status_pb2.Status(code=code.value[0], message="msg", details=packed)
    trailers = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailers, details="msg")


S = grpc.StatusCode


@pytest.mark.parametrize(
    ("code", "reason", "delay", "action"),
    [
        (S.INVALID_ARGUMENT, Reason.INVALID_REQUEST, None, Action.STOP),
        (S.INVALID_ARGUMENT, Reason.UNDECODABLE_REQUEST, None, Action.STOP),
        (S.ALREADY_EXISTS, Reason.RUN_ALREADY_EXISTS, None, Action.STOP),
        (S.NOT_FOUND, Reason.RUN_NOT_FOUND, None, Action.STOP),
        (S.FAILED_PRECONDITION, Reason.THREAD_BUSY, None, Action.STOP),
        (S.FAILED_PRECONDITION, Reason.STREAM_GAP, None, Action.RESEND),
        (S.FAILED_PRECONDITION, Reason.RUN_CONTINUED, None, Action.STOP),
        (S.RESOURCE_EXHAUSTED, Reason.TOO_MANY_RUNS, 1.0, Action.NEXT),
        (S.RESOURCE_EXHAUSTED, Reason.TOO_MANY_CALLS, 1.0, Action.NEXT),
        (S.RESOURCE_EXHAUSTED, Reason.TOO_MANY_STREAMS, 1.0, Action.NEXT),
        (S.RESOURCE_EXHAUSTED, Reason.STREAM_OVERFLOW, 0.0, Action.NEXT),
        (S.RESOURCE_EXHAUSTED, "", None, Action.STOP),  # the transport's size limit
        (S.UNAUTHENTICATED, Reason.UNAUTHENTICATED, None, Action.STOP),
        (S.PERMISSION_DENIED, Reason.TENANT_FORBIDDEN, None, Action.STOP),
        (S.UNAVAILABLE, Reason.DRAINING, None, Action.RESEND),
        (S.UNAVAILABLE, Reason.RUN_ORPHANED, None, Action.RESEND),
        (S.UNAVAILABLE, "", None, Action.NEXT),  # the transport
        (S.INTERNAL, Reason.INTERNAL, None, Action.NEXT),
        (S.UNKNOWN, "", None, Action.NEXT),
    ],
)
def test_policy_of_every_reason(
    code: grpc.StatusCode, reason: str, delay: float | None, action: Action
) -> None:
    error = error_of(wire_error(code, reason, delay))
    assert (error.code, error.reason, error.retry_delay) == (code, reason, delay)
    assert action_of(error) is action
    assert error.retryable == (action is not Action.STOP)


def test_bad_request_violations() -> None:
    error = error_of(
        wire_error(
            S.INVALID_ARGUMENT,
            Reason.INVALID_REQUEST,
            violations=(("a.b", "is required"), ("c[0]", "too long")),
        )
    )
    assert [(v.field, v.description) for v in error.violations] == [
        ("a.b", "is required"),
        ("c[0]", "too long"),
    ]
    assert "c[0]: too long" in str(error)


def test_a_foreign_domain_is_not_ours() -> None:
    error = error_of(wire_error(S.UNAVAILABLE, Reason.DRAINING, domain="elsewhere"))
    assert error.reason == "" and action_of(error) is Action.NEXT
