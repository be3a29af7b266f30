"""One error family for the whole project.

Each error says what went wrong in words an operator understands, and whether trying
again may help. The edge maps each class to one gRPC status code (api/errors.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from roundtable.domain.events import TokenUsage


class RoundtableError(Exception):
    """Base of every error Roundtable raises on purpose."""

    message: ClassVar[str] = "roundtable error"
    retryable: ClassVar[bool] = False
    thread_id: str = ""
    """The thread of the run the error is about, where the code raising it knows it: the
    failed RPC's span carries it (a StreamRun past the run's last seq, say)."""

    def __init__(self, detail: str = "") -> None:
        self.detail = detail
        super().__init__(f"{self.message}: {detail}" if detail else self.message)


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One bad field of a request: its path (`snapshot.members[2].member_id`) and why."""

    field: str
    description: str


class InvalidRequest(RoundtableError):
    """The request is malformed; `violations` names every bad field."""

    message = "invalid request"

    def __init__(self, violations: list[FieldViolation]) -> None:
        self.violations = tuple(violations)
        named = ", ".join(v.field[:128] for v in violations[:10])
        more = f" and {len(violations) - 10} more" if len(violations) > 10 else ""
        super().__init__(f"{len(violations)} bad field(s): {named}{more}")

    @staticmethod
    def violation(field: str, description: str) -> FieldViolation:
        """Shorthand for one field violation."""
        return FieldViolation(field, description)


class UndecodableRequest(InvalidRequest):
    """The request's bytes are not its protobuf message (INVALID_ARGUMENT, no field named)."""

    def __init__(self, method: str, why: str) -> None:
        self.violations = (FieldViolation("", f"{method}: {why}"),)
        # Its message says what happened, not "1 bad field(s)": no field can be named.
        RoundtableError.__init__(self, f"{method}: {why}")


class RunAlreadyExists(RoundtableError):
    """The run id is known with a different snapshot."""

    message = "run_id already used with a different snapshot"


class RunNotFound(RoundtableError):
    """No such run for this tenant."""

    message = "run not found"


class PermissionNotFound(RoundtableError):
    """No such permission request in this tenant's run (another tenant's looks the same)."""

    message = "permission request not found"


class PermissionDecided(RoundtableError):
    """A different decision is already recorded for the permission request."""

    message = "permission request already decided"


class ThreadBusy(RoundtableError):
    """The thread has a live run and the busy-thread policy is REJECT."""

    message = "thread has a live run"
    retryable = True


class StreamGap(RoundtableError):
    """Events the caller asked for are no longer available."""

    message = "events after after_seq are not available"


class RunOrphaned(RoundtableError):
    """The replica executing the run stopped; the same StartRun resumes it elsewhere."""

    message = "the replica running this run stopped; send the same StartRun to resume it"
    retryable = True


class RunContinued(RoundtableError):
    """The run's last execution stopped before its end and a later run continued it: its
    log has no terminal event, and never will (the continuing run answers for it)."""

    message = "the run stopped before its end and was continued by another run"


class StreamOverflow(RoundtableError):
    """A stream's reader fell too far behind; the run goes on."""

    message = "stream reader too slow: re-attach with StreamRun(after_seq = the last seq received)"
    retryable = True


class TooManyRuns(RoundtableError):
    """The server is at its limit of concurrent runs."""

    message = "too many concurrent runs"
    retryable = True


class TooManyCalls(RoundtableError):
    """A caller has as many calls in flight as one caller may; retry after some end."""

    message = "too many calls in flight for this caller"
    retryable = True


class TooManyStreams(RoundtableError):
    """A run has as many streams attached as one run may; retry after some end."""

    message = "too many streams attached to this run"
    retryable = True


class Draining(RoundtableError):
    """The server is shutting down and takes no new runs."""

    message = "server is draining"
    retryable = True


class Unauthenticated(RoundtableError):
    """The caller sent no credentials, or credentials this server does not accept."""

    message = "missing or invalid caller credentials"


class TenantForbidden(RoundtableError):
    """The caller proved who it is, but may not act for the tenant it named."""

    message = "caller may not act for this tenant"


class InternalError(RoundtableError):
    """A bug: the edge logs it whole and tells the client no more than where."""

    message = "internal error"


class InvalidSettings(RoundtableError):
    """The settings are contradictory or unsafe, or name unreadable files or a store that
    cannot be opened: no server starts."""

    message = "invalid settings"


class ModelError(RoundtableError):
    """A model call failed. `code` is the stable code put on speaker_failed events."""

    message = "model call failed"
    code: ClassVar[str] = "MODEL_ERROR"
    attempts: int = 1
    """Attempts this error ended (the harness's retry layer sets it when it gives up), so
    the next target's attempts are numbered on from there."""
    http_status: int = 0
    """The HTTP status the model server answered with, when it answered with an error."""
    spent: TokenUsage = TokenUsage()
    """Tokens the failed attempts used, as far as known: reported with an answer that did
    not fit, or counted from the text an attempt streamed before it broke (the harness
    adds them up, so the reply or the run that goes on counts every attempt)."""


class ModelTimeout(ModelError):
    """The model did not answer within its per-attempt timeout."""

    message = "model call timed out"
    code = "MODEL_TIMEOUT"
    retryable = True
    callers_deadline: bool = False
    """The attempt ran out of a time the model ref set shorter than the server's default:
    the caller's choice, not a sign of the target's health (no breaker counts it)."""


class ModelUnavailable(ModelError):
    """The model server failed (5xx) or could not be reached."""

    message = "model server unavailable"
    code = "MODEL_UNAVAILABLE"
    retryable = True


class ModelRateLimited(ModelError):
    """The model server said 429."""

    message = "model rate limited"
    code = "MODEL_RATE_LIMITED"
    retryable = True
    retry_after_s: float | None = None
    """How long the server asked to wait (its Retry-After), when it said."""


class ModelRejected(ModelError):
    """The model server rejected the request (4xx other than 429); retrying cannot help."""

    message = "model rejected the request"
    code = "MODEL_REJECTED"


class CircuitOpen(ModelError):
    """The target's circuit breaker is open and no fallback could be tried."""

    message = "circuit breaker open"
    code = "CIRCUIT_OPEN"
    retryable = True
    attempts = 0
    """The open breaker refused the call: no model call was made."""


class InvalidModelOutput(ModelError):
    """The model answered, but not in the required shape."""

    message = "model output failed validation"
    code = "INVALID_OUTPUT"


class ToolError(RoundtableError):
    """A tool call failed before the tool could answer (the tool's own error is a result,
    `ToolResult.is_error`, not this). `code` is what the audit record says."""

    message = "tool call failed"
    code: ClassVar[str] = "TOOL_ERROR"
    attempts: int = 1
    """Attempts this error ended (the retry layer sets it when it gives up)."""


class ToolTimeout(ToolError):
    """The tool did not answer within its timeout."""

    message = "tool call timed out"
    code = "TOOL_TIMEOUT"
    retryable = True
    callers_deadline: bool = False
    """The attempt ran out of a timeout the gateway declared for the tool, shorter than the
    server's default: not counted by the tool server's breaker (see `ModelTimeout`)."""


class ToolUnavailable(ToolError):
    """The tool server could not be reached, failed (5xx), or dropped the session."""

    message = "tool server unavailable"
    code = "TOOL_UNAVAILABLE"
    retryable = True


class ToolRateLimited(ToolUnavailable):
    """The tool server said 429: about the caller's credential or quota (one tenant's),
    not the server's health, so no breaker counts it (`harness.policies.is_system_failure`)."""

    message = "tool rate limited"
    code = "TOOL_RATE_LIMITED"


class ToolRejected(ToolError):
    """The tool server refused the call (unknown tool, bad arguments, 4xx, no auth)."""

    message = "tool server rejected the call"
    code = "TOOL_REJECTED"


class ToolCircuitOpen(ToolError):
    """The tool server's circuit breaker is open."""

    message = "tool server circuit breaker open"
    code = "TOOL_CIRCUIT_OPEN"
    retryable = True
