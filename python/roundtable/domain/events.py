"""Domain events: what nodes write to the event sink.

The runs layer numbers them (`seq`) in an `Envelope`, commits all but deltas to the event
log (encoded once by `roundtable.codec`) and streams them. Nothing here carries secrets or
prompt text.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from roundtable.domain.plan import DirectiveKind, PlanSource, PlanStep, Route
from roundtable.domain.tools import ToolCallSummary


class FinishReason(StrEnum):
    """Why a reply ended."""

    STOP = "stop"
    LENGTH = "length"
    REPLACED = "replaced"


class MemoryAction(StrEnum):
    """What a memory proposal wants done."""

    CREATE = "create"
    UPDATE = "update"
    FORGET = "forget"


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Token counts as reported (or estimated) by a provider."""

    input_tokens: int = 0
    output_tokens: int = 0
    counted: bool = False
    """True when the server reported no usage for (some of) these calls and the output
    tokens were counted by Roundtable instead, one streamed chunk as one token."""

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.counted or other.counted,
        )

    @property
    def source(self) -> str:
        """`counted` or `reported`: how the output tokens are known (audit records say it)."""
        return "counted" if self.counted else "reported"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted:
    """The run began or resumed."""

    route: Route
    resumed: bool
    thread_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanCreated:
    """The speakers of one round."""

    directive: DirectiveKind
    source: PlanSource
    steps: tuple[PlanStep, ...]
    round: int
    fallback_reason: str = ""
    continued_run_id: str = ""
    converged: bool = True
    """False when the supervisor asked for another round after this one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeakerStarted:
    """A speaker began an attempt."""

    step: int
    member_id: str
    reply_id: str
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AssistantDelta:
    """A chunk of a reply being written (live only)."""

    reply_id: str
    text: str
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AssistantFinal:
    """A finished reply."""

    reply_id: str
    member_id: str
    step: int
    content: str
    model: str
    usage: TokenUsage
    finish_reason: FinishReason
    attempts: int
    tool_calls: tuple[ToolCallSummary, ...] = ()
    """The reply's tool calls, in order: outcomes only, never arguments or results."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeakerFailed:
    """A speaker gave up after its retries; the plan goes on."""

    reply_id: str
    member_id: str
    step: int
    code: str
    message: str
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PermissionRequired:
    """A tool call waits for a person's decision (the run parks after it)."""

    permission_request_id: str
    """The call within its run, `<reply_id>/<n>` (its row key; `ToolCallRecord.call_key`)."""
    reply_id: str
    member_id: str
    step: int
    tool_name: str
    arguments_json: str
    """As the model gave them: gateway content, like a reply (never logged or traced)."""
    expires_at: float
    """Seconds since the epoch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryProposal:
    """A memory Roundtable suggests; the gateway decides."""

    proposal_id: str
    member_id: str
    action: MemoryAction
    content: str
    importance: float
    evidence_reply_ids: tuple[str, ...]
    target_memory_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryProposed:
    """The memory proposals of a turn."""

    proposals: tuple[MemoryProposal, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplySummary:
    """One finished reply of a run."""

    reply_id: str
    member_id: str
    step: int


SHUTDOWN_REASON = "server_shutdown"
"""The stop a draining server asks of its runs: the run is interrupted, to resume when the
same StartRun comes again; nobody cancelled it. Reserved: no CancelRun may give it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCancelled:
    """The run stopped before its plan was done."""

    reason: str
    finished_reply_ids: tuple[str, ...]
    steps_left: tuple[PlanStep, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompleted:
    """The run finished its plan."""

    replies: tuple[ReplySummary, ...]
    usage: TokenUsage
    converged: bool
    rounds: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailed:
    """The run could not go on."""

    code: str
    message: str
    retryable: bool


Event = (
    RunStarted
    | PlanCreated
    | SpeakerStarted
    | AssistantDelta
    | AssistantFinal
    | SpeakerFailed
    | MemoryProposed
    | PermissionRequired
    | RunCancelled
    | RunCompleted
    | RunFailed
)
"""Every event a run can emit."""

TERMINAL_EVENTS = (RunCancelled, RunCompleted, RunFailed)
"""The events that end an execution of a run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """An event in its run: what the event log holds and what streams carry."""

    run_id: str
    seq: int
    """The event's number in its run; a delta carries the seq of the last durable event."""
    emitted_at: float
    """Seconds since the epoch."""
    event: Event
    wire: bytes = b""
    """The event's encoding (a serialized RunEvent), made once by the codec when the event is
    logged and sent as is by every stream and replay; empty for a delta (never logged),
    which the edge encodes."""

    @property
    def durable(self) -> bool:
        """Whether the event is logged (every event but a delta)."""
        return not isinstance(self.event, AssistantDelta)

    @property
    def terminal(self) -> bool:
        """Whether the event ends an execution of its run."""
        return isinstance(self.event, TERMINAL_EVENTS)
