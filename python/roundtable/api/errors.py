"""One table from our error family to gRPC status codes, with google.rpc details."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from roundtable.domain.errors import (
    Draining,
    InvalidRequest,
    PermissionDecided,
    PermissionNotFound,
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
    UndecodableRequest,
)

ERROR_DOMAIN = "roundtable.v1"
"""The `google.rpc.ErrorInfo.domain` of every error the server sends."""


@dataclass(frozen=True, slots=True)
class WireError:
    """How one error class goes on the wire."""

    code: grpc.StatusCode
    reason: str
    """The `google.rpc.ErrorInfo.reason`: stable, for a client to tell errors of one code apart."""
    retry_after_s: int | None = None
    """The `google.rpc.RetryInfo` delay, for the RESOURCE_EXHAUSTED worth retrying (one
    without a RetryInfo, the transport's size limit, is not)."""


WIRE: dict[type[RoundtableError], WireError] = {
    UndecodableRequest: WireError(grpc.StatusCode.INVALID_ARGUMENT, "UNDECODABLE_REQUEST"),
    InvalidRequest: WireError(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
    RunAlreadyExists: WireError(grpc.StatusCode.ALREADY_EXISTS, "RUN_ALREADY_EXISTS"),
    RunNotFound: WireError(grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND"),
    PermissionNotFound: WireError(grpc.StatusCode.NOT_FOUND, "PERMISSION_NOT_FOUND"),
    PermissionDecided: WireError(grpc.StatusCode.FAILED_PRECONDITION, "PERMISSION_DECIDED"),
    ThreadBusy: WireError(grpc.StatusCode.FAILED_PRECONDITION, "THREAD_BUSY"),
    StreamGap: WireError(grpc.StatusCode.FAILED_PRECONDITION, "STREAM_GAP"),
    RunContinued: WireError(grpc.StatusCode.FAILED_PRECONDITION, "RUN_CONTINUED"),
    TooManyRuns: WireError(grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_RUNS", 1),
    TooManyCalls: WireError(grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_CALLS", 1),
    TooManyStreams: WireError(grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS", 1),
    # Nothing to wait for: re-attach at once with StreamRun(after_seq).
    StreamOverflow: WireError(grpc.StatusCode.RESOURCE_EXHAUSTED, "STREAM_OVERFLOW", 0),
    Draining: WireError(grpc.StatusCode.UNAVAILABLE, "DRAINING"),
    RunOrphaned: WireError(grpc.StatusCode.UNAVAILABLE, "RUN_ORPHANED"),
    Unauthenticated: WireError(grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"),
    TenantForbidden: WireError(grpc.StatusCode.PERMISSION_DENIED, "TENANT_FORBIDDEN"),
}
"""Every error the server sends on purpose: its status code, ErrorInfo reason and RetryInfo.
The proto's error table (orchestrator_service.proto) lists the same; a test holds them
together."""

_INTERNAL = WireError(grpc.StatusCode.INTERNAL, "INTERNAL")
"""Any other error: InternalError, the edge's answer to a bug."""


def wire_error_of(error: RoundtableError) -> WireError:
    """How an error goes on the wire (its nearest mapped class; INTERNAL otherwise)."""
    for cls in type(error).__mro__:
        found = WIRE.get(cls)
        if found is not None:
            return found
    return _INTERNAL


def status_code_of(error: RoundtableError) -> grpc.StatusCode:
    """The status code of an error (its nearest mapped class; INTERNAL otherwise)."""
    return wire_error_of(error).code


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
    wire = wire_error_of(error)
    code = wire.code
    details: list[any_pb2.Any] = [
        _pack(error_details_pb2.ErrorInfo(reason=wire.reason, domain=ERROR_DOMAIN))
    ]
    if isinstance(error, InvalidRequest):
        details.append(_pack(bad_request(error)))
    if wire.retry_after_s is not None:
        delay = duration_pb2.Duration(seconds=wire.retry_after_s)
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(
        code=getattr(code_pb2, code.name), message=str(error), details=details
    )
    return rpc_status.to_status(status)


def _pack(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed
