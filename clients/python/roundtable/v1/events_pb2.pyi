import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Route(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUTE_UNSPECIFIED: _ClassVar[Route]
    ROUTE_SINGLE: _ClassVar[Route]
    ROUTE_GROUP: _ClassVar[Route]

class DirectiveKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIRECTIVE_KIND_UNSPECIFIED: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_SINGLE: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_OPEN: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_MENTION: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_ALL: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_COUNT_OFF: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_STOP: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_CONTINUE: _ClassVar[DirectiveKind]

class PlanSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_SOURCE_UNSPECIFIED: _ClassVar[PlanSource]
    PLAN_SOURCE_DETERMINISTIC: _ClassVar[PlanSource]
    PLAN_SOURCE_SUPERVISOR: _ClassVar[PlanSource]
    PLAN_SOURCE_FALLBACK: _ClassVar[PlanSource]
    PLAN_SOURCE_CONTINUED: _ClassVar[PlanSource]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_REPLACED: _ClassVar[FinishReason]

class ToolCallOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CALL_OUTCOME_UNSPECIFIED: _ClassVar[ToolCallOutcome]
    TOOL_CALL_OUTCOME_OK: _ClassVar[ToolCallOutcome]
    TOOL_CALL_OUTCOME_DENIED: _ClassVar[ToolCallOutcome]
    TOOL_CALL_OUTCOME_EXPIRED: _ClassVar[ToolCallOutcome]
    TOOL_CALL_OUTCOME_FAILED: _ClassVar[ToolCallOutcome]

class MemoryAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_ACTION_UNSPECIFIED: _ClassVar[MemoryAction]
    MEMORY_ACTION_CREATE: _ClassVar[MemoryAction]
    MEMORY_ACTION_UPDATE: _ClassVar[MemoryAction]
    MEMORY_ACTION_FORGET: _ClassVar[MemoryAction]
ROUTE_UNSPECIFIED: Route
ROUTE_SINGLE: Route
ROUTE_GROUP: Route
DIRECTIVE_KIND_UNSPECIFIED: DirectiveKind
DIRECTIVE_KIND_SINGLE: DirectiveKind
DIRECTIVE_KIND_OPEN: DirectiveKind
DIRECTIVE_KIND_MENTION: DirectiveKind
DIRECTIVE_KIND_ALL: DirectiveKind
DIRECTIVE_KIND_COUNT_OFF: DirectiveKind
DIRECTIVE_KIND_STOP: DirectiveKind
DIRECTIVE_KIND_CONTINUE: DirectiveKind
PLAN_SOURCE_UNSPECIFIED: PlanSource
PLAN_SOURCE_DETERMINISTIC: PlanSource
PLAN_SOURCE_SUPERVISOR: PlanSource
PLAN_SOURCE_FALLBACK: PlanSource
PLAN_SOURCE_CONTINUED: PlanSource
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_REPLACED: FinishReason
TOOL_CALL_OUTCOME_UNSPECIFIED: ToolCallOutcome
TOOL_CALL_OUTCOME_OK: ToolCallOutcome
TOOL_CALL_OUTCOME_DENIED: ToolCallOutcome
TOOL_CALL_OUTCOME_EXPIRED: ToolCallOutcome
TOOL_CALL_OUTCOME_FAILED: ToolCallOutcome
MEMORY_ACTION_UNSPECIFIED: MemoryAction
MEMORY_ACTION_CREATE: MemoryAction
MEMORY_ACTION_UPDATE: MemoryAction
MEMORY_ACTION_FORGET: MemoryAction

class RunEvent(_message.Message):
    __slots__ = ("run_id", "seq", "emitted_at", "run_started", "plan_created", "speaker_started", "assistant_delta", "assistant_final", "speaker_failed", "memory_proposed", "permission_required", "run_cancelled", "run_completed", "run_failed")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    RUN_STARTED_FIELD_NUMBER: _ClassVar[int]
    PLAN_CREATED_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_STARTED_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_DELTA_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_FINAL_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FAILED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PROPOSED_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    RUN_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    RUN_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    RUN_FAILED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    seq: int
    emitted_at: _timestamp_pb2.Timestamp
    run_started: RunStarted
    plan_created: PlanCreated
    speaker_started: SpeakerStarted
    assistant_delta: AssistantDelta
    assistant_final: AssistantFinal
    speaker_failed: SpeakerFailed
    memory_proposed: MemoryProposed
    permission_required: PermissionRequired
    run_cancelled: RunCancelled
    run_completed: RunCompleted
    run_failed: RunFailed
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[int] = ..., emitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run_started: _Optional[_Union[RunStarted, _Mapping]] = ..., plan_created: _Optional[_Union[PlanCreated, _Mapping]] = ..., speaker_started: _Optional[_Union[SpeakerStarted, _Mapping]] = ..., assistant_delta: _Optional[_Union[AssistantDelta, _Mapping]] = ..., assistant_final: _Optional[_Union[AssistantFinal, _Mapping]] = ..., speaker_failed: _Optional[_Union[SpeakerFailed, _Mapping]] = ..., memory_proposed: _Optional[_Union[MemoryProposed, _Mapping]] = ..., permission_required: _Optional[_Union[PermissionRequired, _Mapping]] = ..., run_cancelled: _Optional[_Union[RunCancelled, _Mapping]] = ..., run_completed: _Optional[_Union[RunCompleted, _Mapping]] = ..., run_failed: _Optional[_Union[RunFailed, _Mapping]] = ...) -> None: ...

class RunStarted(_message.Message):
    __slots__ = ("route", "resumed", "thread_id")
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    route: Route
    resumed: bool
    thread_id: str
    def __init__(self, route: _Optional[_Union[Route, str]] = ..., resumed: _Optional[bool] = ..., thread_id: _Optional[str] = ...) -> None: ...

class PlanCreated(_message.Message):
    __slots__ = ("directive", "source", "fallback_reason", "steps", "round", "continued_run_id", "converged")
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CONTINUED_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERGED_FIELD_NUMBER: _ClassVar[int]
    directive: DirectiveKind
    source: PlanSource
    fallback_reason: str
    steps: _containers.RepeatedCompositeFieldContainer[PlanStep]
    round: int
    continued_run_id: str
    converged: bool
    def __init__(self, directive: _Optional[_Union[DirectiveKind, str]] = ..., source: _Optional[_Union[PlanSource, str]] = ..., fallback_reason: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[PlanStep, _Mapping]]] = ..., round: _Optional[int] = ..., continued_run_id: _Optional[str] = ..., converged: _Optional[bool] = ...) -> None: ...

class PlanStep(_message.Message):
    __slots__ = ("index", "member_id", "reply_id", "task", "token_budget", "round", "count_off_number", "parallel_group")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    REPLY_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    COUNT_OFF_NUMBER_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_GROUP_FIELD_NUMBER: _ClassVar[int]
    index: int
    member_id: str
    reply_id: str
    task: str
    token_budget: int
    round: int
    count_off_number: int
    parallel_group: int
    def __init__(self, index: _Optional[int] = ..., member_id: _Optional[str] = ..., reply_id: _Optional[str] = ..., task: _Optional[str] = ..., token_budget: _Optional[int] = ..., round: _Optional[int] = ..., count_off_number: _Optional[int] = ..., parallel_group: _Optional[int] = ...) -> None: ...

class SpeakerStarted(_message.Message):
    __slots__ = ("step", "member_id", "reply_id", "attempt")
    STEP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    REPLY_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    step: int
    member_id: str
    reply_id: str
    attempt: int
    def __init__(self, step: _Optional[int] = ..., member_id: _Optional[str] = ..., reply_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class AssistantDelta(_message.Message):
    __slots__ = ("reply_id", "text", "attempt")
    REPLY_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    reply_id: str
    text: str
    attempt: int
    def __init__(self, reply_id: _Optional[str] = ..., text: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class TokenUsage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class AssistantFinal(_message.Message):
    __slots__ = ("reply_id", "member_id", "step", "content", "model", "usage", "finish_reason", "attempts", "output_tokens_counted", "tool_calls")
    REPLY_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_COUNTED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    reply_id: str
    member_id: str
    step: int
    content: str
    model: str
    usage: TokenUsage
    finish_reason: FinishReason
    attempts: int
    output_tokens_counted: bool
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallSummary]
    def __init__(self, reply_id: _Optional[str] = ..., member_id: _Optional[str] = ..., step: _Optional[int] = ..., content: _Optional[str] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., attempts: _Optional[int] = ..., output_tokens_counted: _Optional[bool] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallSummary, _Mapping]]] = ...) -> None: ...

class ToolCallSummary(_message.Message):
    __slots__ = ("call_id", "tool_name", "outcome")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    tool_name: str
    outcome: ToolCallOutcome
    def __init__(self, call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., outcome: _Optional[_Union[ToolCallOutcome, str]] = ...) -> None: ...

class SpeakerFailed(_message.Message):
    __slots__ = ("reply_id", "member_id", "step", "code", "message", "attempts")
    REPLY_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    reply_id: str
    member_id: str
    step: int
    code: str
    message: str
    attempts: int
    def __init__(self, reply_id: _Optional[str] = ..., member_id: _Optional[str] = ..., step: _Optional[int] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., attempts: _Optional[int] = ...) -> None: ...

class MemoryProposal(_message.Message):
    __slots__ = ("proposal_id", "member_id", "action", "target_memory_id", "content", "importance", "evidence_reply_ids")
    PROPOSAL_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_REPLY_IDS_FIELD_NUMBER: _ClassVar[int]
    proposal_id: str
    member_id: str
    action: MemoryAction
    target_memory_id: str
    content: str
    importance: float
    evidence_reply_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, proposal_id: _Optional[str] = ..., member_id: _Optional[str] = ..., action: _Optional[_Union[MemoryAction, str]] = ..., target_memory_id: _Optional[str] = ..., content: _Optional[str] = ..., importance: _Optional[float] = ..., evidence_reply_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class MemoryProposed(_message.Message):
    __slots__ = ("proposals",)
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    proposals: _containers.RepeatedCompositeFieldContainer[MemoryProposal]
    def __init__(self, proposals: _Optional[_Iterable[_Union[MemoryProposal, _Mapping]]] = ...) -> None: ...

class PermissionRequired(_message.Message):
    __slots__ = ("permission_request_id", "member_id", "action", "arguments", "reply_id", "step", "tool_name", "arguments_json", "expires_at")
    PERMISSION_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    REPLY_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    permission_request_id: str
    member_id: str
    action: str
    arguments: _struct_pb2.Struct
    reply_id: str
    step: int
    tool_name: str
    arguments_json: str
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, permission_request_id: _Optional[str] = ..., member_id: _Optional[str] = ..., action: _Optional[str] = ..., arguments: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., reply_id: _Optional[str] = ..., step: _Optional[int] = ..., tool_name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RunCancelled(_message.Message):
    __slots__ = ("reason", "finished_reply_ids", "steps_left")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REPLY_IDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_LEFT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    finished_reply_ids: _containers.RepeatedScalarFieldContainer[str]
    steps_left: _containers.RepeatedCompositeFieldContainer[PlanStep]
    def __init__(self, reason: _Optional[str] = ..., finished_reply_ids: _Optional[_Iterable[str]] = ..., steps_left: _Optional[_Iterable[_Union[PlanStep, _Mapping]]] = ...) -> None: ...

class ReplySummary(_message.Message):
    __slots__ = ("reply_id", "member_id", "step")
    REPLY_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    reply_id: str
    member_id: str
    step: int
    def __init__(self, reply_id: _Optional[str] = ..., member_id: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class RunCompleted(_message.Message):
    __slots__ = ("replies", "usage", "converged", "rounds")
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CONVERGED_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[ReplySummary]
    usage: TokenUsage
    converged: bool
    rounds: int
    def __init__(self, replies: _Optional[_Iterable[_Union[ReplySummary, _Mapping]]] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., converged: _Optional[bool] = ..., rounds: _Optional[int] = ...) -> None: ...

class RunFailed(_message.Message):
    __slots__ = ("code", "message", "retryable")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retryable: bool
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ...) -> None: ...
