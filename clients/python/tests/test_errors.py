"""Errors typed from the wire, and the policy for every row of the contract's error table."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from roundtable_client import ERROR_DOMAIN, Reason, error_of
from roundtable_client.client import TurnOptions, _backoff


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
    ("code", "reason", "delay", "retryable"),
    [
        (S.INVALID_ARGUMENT, Reason.INVALID_REQUEST, None, False),
        (S.INVALID_ARGUMENT, Reason.UNDECODABLE_REQUEST, None, False),
        (S.ALREADY_EXISTS, Reason.RUN_ALREADY_EXISTS, None, False),
        (S.NOT_FOUND, Reason.RUN_NOT_FOUND, None, False),
        (S.NOT_FOUND, Reason.PERMISSION_NOT_FOUND, None, False),
        (S.FAILED_PRECONDITION, Reason.THREAD_BUSY, None, False),
        (S.FAILED_PRECONDITION, Reason.STREAM_GAP, None, False),
        (S.FAILED_PRECONDITION, Reason.RUN_CONTINUED, None, False),
        (S.FAILED_PRECONDITION, Reason.PERMISSION_DECIDED, None, False),
        (S.RESOURCE_EXHAUSTED, Reason.TOO_MANY_RUNS, 1.0, True),
        (S.RESOURCE_EXHAUSTED, Reason.TOO_MANY_CALLS, 1.0, True),
        (S.RESOURCE_EXHAUSTED, Reason.TOO_MANY_STREAMS, 1.0, True),
        (S.RESOURCE_EXHAUSTED, Reason.STREAM_OVERFLOW, 0.0, True),
        (S.RESOURCE_EXHAUSTED, "", None, False),  # the transport's size limit
        (S.UNAUTHENTICATED, Reason.UNAUTHENTICATED, None, False),
        (S.PERMISSION_DENIED, Reason.TENANT_FORBIDDEN, None, False),
        (S.UNAVAILABLE, Reason.DRAINING, None, True),
        (S.UNAVAILABLE, Reason.RUN_ORPHANED, None, True),
        (S.UNAVAILABLE, "", None, True),  # the transport
        (S.INTERNAL, Reason.INTERNAL, None, False),  # the server judged: a bug
        (S.INTERNAL, "", None, True),  # a reset stream
        (S.UNKNOWN, "", None, True),
    ],
)
def test_policy_of_every_reason(
    code: grpc.StatusCode, reason: str, delay: float | None, retryable: bool
) -> None:
    error = error_of(wire_error(code, reason, delay))
    assert (error.code, error.reason, error.retry_delay) == (code, reason, delay)
    assert error.retryable is retryable


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
    assert error.reason == "" and error.retryable  # judged as a bare UNAVAILABLE


def test_backoff_doubles_to_the_max_jittered_into_the_upper_half() -> None:
    o = TurnOptions(initial_backoff=0.1, max_backoff=1.0)
    assert _backoff(o, 0) == 0
    for unanswered, full in {1: 0.1, 2: 0.2, 3: 0.4, 4: 0.8, 5: 1.0, 9: 1.0}.items():
        for _ in range(50):
            assert full / 2 <= _backoff(o, unanswered) <= full
