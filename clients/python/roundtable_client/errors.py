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
    THREAD_BUSY = "THREAD_BUSY"
    STREAM_GAP = "STREAM_GAP"
    RUN_CONTINUED = "RUN_CONTINUED"
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


class Action(enum.Enum):
    """What run_turn does after a failed call (clients/conformance.md)."""

    STOP = "stop"
    NEXT = "next"
    """StartRun before any event or when a resend is due, else StreamRun(after_seq)."""
    RESEND = "resend"
    """The same StartRun again: it resumes the run."""


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
    ) -> None:
        self.code = code
        """The gRPC status code (None only for AttemptsExhausted after resumable ends)."""
        self.reason = reason
        """google.rpc.ErrorInfo.reason in domain roundtable.v1; "" when the status had none."""
        self.message = message
        self.retry_delay = retry_delay
        """The google.rpc.RetryInfo delay in seconds, if the status carried one."""
        self.violations = violations
        """An INVALID_ARGUMENT's bad fields, each once."""
        self.attempts = attempts
        """Calls in a row that ended without progress, this one included (0 outside run_turn)."""
        super().__init__(self._text())

    @property
    def retryable(self) -> bool:
        """Whether run_turn's policy retries this error."""
        return action_of(self) is not Action.STOP

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
    """run_turn gave up: max_attempts calls in a row without progress (the fields are the
    last error's, which is also `__cause__`), or as many resends after resumable ends (code None)."""


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


def action_of(error: RoundtableError) -> Action:
    """The one retry policy of clients/conformance.md."""
    code, reason = error.code, error.reason
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        # Without a RetryInfo: the transport's size limit; the same request fails the same way.
        return Action.NEXT if error.retry_delay is not None else Action.STOP
    if code is grpc.StatusCode.UNAVAILABLE:
        return Action.RESEND if reason in (Reason.DRAINING, Reason.RUN_ORPHANED) else Action.NEXT
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        # StartRun streams the log from seq 1: what was yielded is skipped.
        return Action.RESEND if reason == Reason.STREAM_GAP else Action.STOP
    if code in (
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    ):
        return Action.NEXT
    return Action.STOP
