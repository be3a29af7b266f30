"""One table from our error family to gRPC status codes, with google.rpc details."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from roundtable.domain.errors import (
    Draining,
    InvalidRequest,
    RoundtableError,
    RunAlreadyExists,
    RunContinued,
    RunNotFound,
    RunOrphaned,
    StreamGap,
    StreamOverflow,
    TenantForbidden,
    ThreadBusy,
    TooManyCalls,
    TooManyRuns,
    TooManyStreams,
    Unauthenticated,
)

STATUS_OF: dict[type[RoundtableError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    RunAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    RunNotFound: grpc.StatusCode.NOT_FOUND,
    ThreadBusy: grpc.StatusCode.FAILED_PRECONDITION,
    StreamGap: grpc.StatusCode.FAILED_PRECONDITION,
    RunContinued: grpc.StatusCode.FAILED_PRECONDITION,
    TooManyRuns: grpc.StatusCode.RESOURCE_EXHAUSTED,
    TooManyCalls: grpc.StatusCode.RESOURCE_EXHAUSTED,
    TooManyStreams: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Draining: grpc.StatusCode.UNAVAILABLE,
    RunOrphaned: grpc.StatusCode.UNAVAILABLE,
    StreamOverflow: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    TenantForbidden: grpc.StatusCode.PERMISSION_DENIED,
}


RETRY_AFTER_S: dict[type[RoundtableError], int] = {
    TooManyRuns: 1,
    TooManyCalls: 1,
    TooManyStreams: 1,
    # Nothing to wait for: re-attach at once with StreamRun(after_seq).
    StreamOverflow: 0,
}
"""The RESOURCE_EXHAUSTED errors worth retrying, and the google.rpc.RetryInfo delay each
carries: one without a RetryInfo (the transport's size limit) is not worth retrying."""


def status_code_of(error: RoundtableError) -> grpc.StatusCode:
    """The status code of an error (its nearest mapped class; INTERNAL otherwise)."""
    for cls in type(error).__mro__:
        code = STATUS_OF.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


MAX_DETAILS_BYTES = 4096
"""Status details travel in a trailer; clients refuse metadata past 8 KiB (base64 adds a third)."""


def bad_request(error: InvalidRequest) -> error_details_pb2.BadRequest:
    """Every violation, while they fit the trailer; then one entry saying how many are left."""
    bad = error_details_pb2.BadRequest()
    for i, violation in enumerate(error.violations):
        entry = error_details_pb2.BadRequest.FieldViolation(
            field=violation.field[:256], description=violation.description[:256]
        )
        if bad.ByteSize() + entry.ByteSize() + 64 > MAX_DETAILS_BYTES:
            left = len(error.violations) - i
            bad.field_violations.add(
                field="", description=f"{left} more violation(s) not listed; fix these first"
            )
            break
        bad.field_violations.append(entry)
    return bad


def to_grpc_status(error: RoundtableError) -> grpc.Status:
    """The full status: code, message, and details a client can act on."""
    code = status_code_of(error)
    details: list[any_pb2.Any] = []
    if isinstance(error, InvalidRequest):
        details.append(_pack(bad_request(error)))
    retry_after_s = RETRY_AFTER_S.get(type(error))
    if retry_after_s is not None:
        delay = duration_pb2.Duration(seconds=retry_after_s)
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(
        code=getattr(code_pb2, code.name), message=str(error), details=details
    )
    return rpc_status.to_status(status)


def _pack(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed
