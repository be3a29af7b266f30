"""Errors typed by the contract: the gRPC code, the google.rpc.ErrorInfo reason, RetryInfo, BadRequest."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2, status_pb2

ERROR_DOMAIN = "roundtable.v1"
"""The google.rpc.ErrorInfo domain of every error the sidecar sends on purpose."""


class Reason(enum.StrEnum):
    """The ErrorInfo reasons of the contract (orchestrator_service.proto's error table)."""

    UNDECODABLE_REQUEST = "UNDECODABLE_REQUEST"
    INVALID_REQUEST = "INVALID_REQUEST"
    RUN_ALREADY_EXISTS = "RUN_ALREADY_EXISTS"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    PERMISSION_NOT_FOUND = "PERMISSION_NOT_FOUND"
    """ResolvePermission: no such permission request in the tenant's run."""
    THREAD_BUSY = "THREAD_BUSY"
    STREAM_GAP = "STREAM_GAP"
    RUN_CONTINUED = "RUN_CONTINUED"
    PERMISSION_DECIDED = "PERMISSION_DECIDED"
    """ResolvePermission: another decision (or an expiry, a cancel) is recorded; the message
    names it."""
    TOO_MANY_RUNS = "TOO_MANY_RUNS"
    TOO_MANY_CALLS = "TOO_MANY_CALLS"
    TOO_MANY_STREAMS = "TOO_MANY_STREAMS"
    STREAM_OVERFLOW = "STREAM_OVERFLOW"
    DRAINING = "DRAINING"
    RUN_ORPHANED = "RUN_ORPHANED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    TENANT_FORBIDDEN = "TENANT_FORBIDDEN"
    INTERNAL = "INTERNAL"


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One entry of an INVALID_ARGUMENT's google.rpc.BadRequest."""

    field: str
    description: str


class RoundtableError(Exception):
    """An error status from the sidecar (or the transport), typed by the contract.

    Tell errors apart by `reason`, not by `code` alone: one code carries several reasons.
    """

    def __init__(
        self,
        code: grpc.StatusCode | None,
        message: str,
        *,
        reason: str = "",
        retry_delay: float | None = None,
        violations: tuple[FieldViolation, ...] = (),
        attempts: int = 0,
        retryable: bool | None = None,
    ) -> None:
        self.code = code
        """The gRPC status code (None only for an error that came from no call)."""
        self.reason = reason
        """google.rpc.ErrorInfo.reason in domain roundtable.v1; "" when the status had none."""
        self.message = message
        self.retry_delay = retry_delay
        """The google.rpc.RetryInfo delay in seconds, if the status carried one."""
        self.violations = violations
        """An INVALID_ARGUMENT's bad fields, each once."""
        self.attempts = attempts
        """Calls in a row that ended without progress, this one included (0 outside run_turn)."""
        self.retryable = retryable_of(code, reason) if retryable is None else retryable
        """Whether the same call may succeed (clients/conformance.md): by `reason` when there
        is one, else by `code` (a transport's failure)."""
        super().__init__(self._text())

    def _text(self) -> str:
        text = f"roundtable: {self.code.name if self.code else 'no status'}"
        if self.reason:
            text += f" [{self.reason}]"
        if self.message:
            text += f": {self.message}"
        for v in self.violations:
            text += f"; {v.field}: {v.description}"
        return text


class AttemptsExhausted(RoundtableError):
    """run_turn gave up after max_attempts calls in a row without progress: the fields are the
    last error's, which is also `__cause__`."""


def error_of(error: grpc.aio.AioRpcError | grpc.RpcError) -> RoundtableError:
    """Types an error from a Roundtable call, reading the status details in its trailers."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = error.details() if hasattr(error, "details") else str(error)
    reason, delay, violations = "", None, []
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == ERROR_DOMAIN:
                    reason = info.reason
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                delay = retry.retry_delay.ToTimedelta().total_seconds()
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations += [FieldViolation(v.field, v.description) for v in bad.field_violations]
    return RoundtableError(
        code, message or "", reason=reason, retry_delay=delay, violations=tuple(violations)
    )


_RETRYABLE_REASONS = frozenset(
    {
        Reason.TOO_MANY_RUNS,
        Reason.TOO_MANY_CALLS,
        Reason.TOO_MANY_STREAMS,
        Reason.STREAM_OVERFLOW,
        Reason.DRAINING,
        Reason.RUN_ORPHANED,
    }
)
"""The reasons worth the same call again; every other reason is the server's judgement."""

_TRANSPORT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    }
)
"""Without an ErrorInfo, the codes a transport gives a cut, refused or reset connection (a
RESOURCE_EXHAUSTED without one is the transport's size limit: not retryable)."""


def retryable_of(code: grpc.StatusCode | None, reason: str) -> bool:
    """The one rule of clients/conformance.md."""
    if reason:
        return reason in _RETRYABLE_REASONS
    return code in _TRANSPORT_CODES
