import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApprovalPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_POLICY_UNSPECIFIED: _ClassVar[ApprovalPolicy]
    APPROVAL_POLICY_NEVER: _ClassVar[ApprovalPolicy]
    APPROVAL_POLICY_ALWAYS: _ClassVar[ApprovalPolicy]

class SpeakerConcurrency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPEAKER_CONCURRENCY_UNSPECIFIED: _ClassVar[SpeakerConcurrency]
    SPEAKER_CONCURRENCY_SEQUENTIAL: _ClassVar[SpeakerConcurrency]
    SPEAKER_CONCURRENCY_PARALLEL: _ClassVar[SpeakerConcurrency]

class SessionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_KIND_UNSPECIFIED: _ClassVar[SessionKind]
    SESSION_KIND_SINGLE: _ClassVar[SessionKind]
    SESSION_KIND_GROUP: _ClassVar[SessionKind]

class MessageRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_ROLE_UNSPECIFIED: _ClassVar[MessageRole]
    MESSAGE_ROLE_USER: _ClassVar[MessageRole]
    MESSAGE_ROLE_ASSISTANT: _ClassVar[MessageRole]
APPROVAL_POLICY_UNSPECIFIED: ApprovalPolicy
APPROVAL_POLICY_NEVER: ApprovalPolicy
APPROVAL_POLICY_ALWAYS: ApprovalPolicy
SPEAKER_CONCURRENCY_UNSPECIFIED: SpeakerConcurrency
SPEAKER_CONCURRENCY_SEQUENTIAL: SpeakerConcurrency
SPEAKER_CONCURRENCY_PARALLEL: SpeakerConcurrency
SESSION_KIND_UNSPECIFIED: SessionKind
SESSION_KIND_SINGLE: SessionKind
SESSION_KIND_GROUP: SessionKind
MESSAGE_ROLE_UNSPECIFIED: MessageRole
MESSAGE_ROLE_USER: MessageRole
MESSAGE_ROLE_ASSISTANT: MessageRole

class RunContext(_message.Message):
    __slots__ = ("run_id", "thread_id", "request_id", "tenant")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    thread_id: str
    request_id: str
    tenant: str
    def __init__(self, run_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., request_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("session", "members", "history", "user_turn")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    USER_TURN_FIELD_NUMBER: _ClassVar[int]
    session: Session
    members: _containers.RepeatedCompositeFieldContainer[Member]
    history: _containers.RepeatedCompositeFieldContainer[HistoryMessage]
    user_turn: UserTurn
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., history: _Optional[_Iterable[_Union[HistoryMessage, _Mapping]]] = ..., user_turn: _Optional[_Union[UserTurn, _Mapping]] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "kind", "primary_member_id", "default_model", "budgets", "speaker_concurrency", "tool_servers", "tools")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MODEL_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    TOOL_SERVERS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    kind: SessionKind
    primary_member_id: str
    default_model: ModelRef
    budgets: Budgets
    speaker_concurrency: SpeakerConcurrency
    tool_servers: _containers.RepeatedCompositeFieldContainer[ToolServer]
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    def __init__(self, session_id: _Optional[str] = ..., kind: _Optional[_Union[SessionKind, str]] = ..., primary_member_id: _Optional[str] = ..., default_model: _Optional[_Union[ModelRef, _Mapping]] = ..., budgets: _Optional[_Union[Budgets, _Mapping]] = ..., speaker_concurrency: _Optional[_Union[SpeakerConcurrency, str]] = ..., tool_servers: _Optional[_Iterable[_Union[ToolServer, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ...) -> None: ...

class ToolServer(_message.Message):
    __slots__ = ("server_id", "url", "credential_ref")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_REF_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    url: str
    credential_ref: str
    def __init__(self, server_id: _Optional[str] = ..., url: _Optional[str] = ..., credential_ref: _Optional[str] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "input_schema_json", "server_id", "approval", "read_only", "timeout_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    server_id: str
    approval: ApprovalPolicy
    read_only: bool
    timeout_ms: int
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., server_id: _Optional[str] = ..., approval: _Optional[_Union[ApprovalPolicy, str]] = ..., read_only: _Optional[bool] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class Budgets(_message.Message):
    __slots__ = ("max_speakers", "max_rounds", "max_output_tokens", "run_timeout_seconds", "max_parallel_speakers", "max_tool_calls_per_speaker", "approval_timeout_seconds")
    MAX_SPEAKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUN_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_PARALLEL_SPEAKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_PER_SPEAKER_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_speakers: int
    max_rounds: int
    max_output_tokens: int
    run_timeout_seconds: int
    max_parallel_speakers: int
    max_tool_calls_per_speaker: int
    approval_timeout_seconds: int
    def __init__(self, max_speakers: _Optional[int] = ..., max_rounds: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., run_timeout_seconds: _Optional[int] = ..., max_parallel_speakers: _Optional[int] = ..., max_tool_calls_per_speaker: _Optional[int] = ..., approval_timeout_seconds: _Optional[int] = ...) -> None: ...

class ModelRef(_message.Message):
    __slots__ = ("target", "fallbacks", "temperature", "timeout_ms")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    target: ModelTarget
    fallbacks: _containers.RepeatedCompositeFieldContainer[ModelTarget]
    temperature: float
    timeout_ms: int
    def __init__(self, target: _Optional[_Union[ModelTarget, _Mapping]] = ..., fallbacks: _Optional[_Iterable[_Union[ModelTarget, _Mapping]]] = ..., temperature: _Optional[float] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ModelTarget(_message.Message):
    __slots__ = ("provider", "model", "base_url", "credential_ref")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_REF_FIELD_NUMBER: _ClassVar[int]
    provider: str
    model: str
    base_url: str
    credential_ref: str
    def __init__(self, provider: _Optional[str] = ..., model: _Optional[str] = ..., base_url: _Optional[str] = ..., credential_ref: _Optional[str] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("member_id", "display_name", "aliases", "persona", "style_rules", "model", "skills", "memories", "tool_names")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    PERSONA_FIELD_NUMBER: _ClassVar[int]
    STYLE_RULES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    display_name: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    persona: str
    style_rules: _containers.RepeatedScalarFieldContainer[str]
    model: ModelRef
    skills: _containers.RepeatedCompositeFieldContainer[Skill]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, member_id: _Optional[str] = ..., display_name: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., persona: _Optional[str] = ..., style_rules: _Optional[_Iterable[str]] = ..., model: _Optional[_Union[ModelRef, _Mapping]] = ..., skills: _Optional[_Iterable[_Union[Skill, _Mapping]]] = ..., memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., tool_names: _Optional[_Iterable[str]] = ...) -> None: ...

class Skill(_message.Message):
    __slots__ = ("skill_id", "name", "instructions")
    SKILL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    skill_id: str
    name: str
    instructions: str
    def __init__(self, skill_id: _Optional[str] = ..., name: _Optional[str] = ..., instructions: _Optional[str] = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ("memory_id", "content", "importance", "updated_at")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    content: str
    importance: float
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, memory_id: _Optional[str] = ..., content: _Optional[str] = ..., importance: _Optional[float] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class HistoryMessage(_message.Message):
    __slots__ = ("message_id", "role", "member_id", "content", "created_at")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    role: MessageRole
    member_id: str
    content: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, message_id: _Optional[str] = ..., role: _Optional[_Union[MessageRole, str]] = ..., member_id: _Optional[str] = ..., content: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UserTurn(_message.Message):
    __slots__ = ("message_id", "text", "mentions", "mention_all")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MENTIONS_FIELD_NUMBER: _ClassVar[int]
    MENTION_ALL_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    text: str
    mentions: _containers.RepeatedScalarFieldContainer[str]
    mention_all: bool
    def __init__(self, message_id: _Optional[str] = ..., text: _Optional[str] = ..., mentions: _Optional[_Iterable[str]] = ..., mention_all: _Optional[bool] = ...) -> None: ...
