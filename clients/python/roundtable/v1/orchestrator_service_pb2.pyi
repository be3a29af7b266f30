import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from roundtable.v1 import events_pb2 as _events_pb2
from roundtable.v1 import snapshot_pb2 as _snapshot_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DisconnectPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISCONNECT_POLICY_UNSPECIFIED: _ClassVar[DisconnectPolicy]
    DISCONNECT_POLICY_CONTINUE: _ClassVar[DisconnectPolicy]
    DISCONNECT_POLICY_CANCEL: _ClassVar[DisconnectPolicy]

class BusyThreadPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BUSY_THREAD_POLICY_UNSPECIFIED: _ClassVar[BusyThreadPolicy]
    BUSY_THREAD_POLICY_REJECT: _ClassVar[BusyThreadPolicy]
    BUSY_THREAD_POLICY_INTERRUPT: _ClassVar[BusyThreadPolicy]
    BUSY_THREAD_POLICY_ENQUEUE: _ClassVar[BusyThreadPolicy]

class CancelMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_MODE_UNSPECIFIED: _ClassVar[CancelMode]
    CANCEL_MODE_GRACEFUL: _ClassVar[CancelMode]
    CANCEL_MODE_IMMEDIATE: _ClassVar[CancelMode]

class CancelOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_OUTCOME_UNSPECIFIED: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_REQUESTED: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_ALREADY_ENDED: _ClassVar[CancelOutcome]

class PermissionDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PERMISSION_DECISION_UNSPECIFIED: _ClassVar[PermissionDecision]
    PERMISSION_DECISION_APPROVE: _ClassVar[PermissionDecision]
    PERMISSION_DECISION_DENY: _ClassVar[PermissionDecision]

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_QUEUED: _ClassVar[RunStatus]
    RUN_STATUS_RUNNING: _ClassVar[RunStatus]
    RUN_STATUS_SUCCEEDED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]
    RUN_STATUS_INTERRUPTED: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_CONTINUED: _ClassVar[RunStatus]
    RUN_STATUS_AWAITING_APPROVAL: _ClassVar[RunStatus]
DISCONNECT_POLICY_UNSPECIFIED: DisconnectPolicy
DISCONNECT_POLICY_CONTINUE: DisconnectPolicy
DISCONNECT_POLICY_CANCEL: DisconnectPolicy
BUSY_THREAD_POLICY_UNSPECIFIED: BusyThreadPolicy
BUSY_THREAD_POLICY_REJECT: BusyThreadPolicy
BUSY_THREAD_POLICY_INTERRUPT: BusyThreadPolicy
BUSY_THREAD_POLICY_ENQUEUE: BusyThreadPolicy
CANCEL_MODE_UNSPECIFIED: CancelMode
CANCEL_MODE_GRACEFUL: CancelMode
CANCEL_MODE_IMMEDIATE: CancelMode
CANCEL_OUTCOME_UNSPECIFIED: CancelOutcome
CANCEL_OUTCOME_REQUESTED: CancelOutcome
CANCEL_OUTCOME_ALREADY_ENDED: CancelOutcome
PERMISSION_DECISION_UNSPECIFIED: PermissionDecision
PERMISSION_DECISION_APPROVE: PermissionDecision
PERMISSION_DECISION_DENY: PermissionDecision
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_QUEUED: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_SUCCEEDED: RunStatus
RUN_STATUS_CANCELLED: RunStatus
RUN_STATUS_INTERRUPTED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_CONTINUED: RunStatus
RUN_STATUS_AWAITING_APPROVAL: RunStatus

class StartRunRequest(_message.Message):
    __slots__ = ("context", "snapshot", "credentials", "options")
    class CredentialsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    context: _snapshot_pb2.RunContext
    snapshot: _snapshot_pb2.Snapshot
    credentials: _containers.ScalarMap[str, str]
    options: RunOptions
    def __init__(self, context: _Optional[_Union[_snapshot_pb2.RunContext, _Mapping]] = ..., snapshot: _Optional[_Union[_snapshot_pb2.Snapshot, _Mapping]] = ..., credentials: _Optional[_Mapping[str, str]] = ..., options: _Optional[_Union[RunOptions, _Mapping]] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _events_pb2.RunEvent
    def __init__(self, event: _Optional[_Union[_events_pb2.RunEvent, _Mapping]] = ...) -> None: ...

class RunOptions(_message.Message):
    __slots__ = ("stream_deltas", "delta_window_ms", "delta_max_bytes", "disconnect_policy", "busy_thread_policy", "budget_overrides")
    STREAM_DELTAS_FIELD_NUMBER: _ClassVar[int]
    DELTA_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    DELTA_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISCONNECT_POLICY_FIELD_NUMBER: _ClassVar[int]
    BUSY_THREAD_POLICY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    stream_deltas: bool
    delta_window_ms: int
    delta_max_bytes: int
    disconnect_policy: DisconnectPolicy
    busy_thread_policy: BusyThreadPolicy
    budget_overrides: _snapshot_pb2.Budgets
    def __init__(self, stream_deltas: _Optional[bool] = ..., delta_window_ms: _Optional[int] = ..., delta_max_bytes: _Optional[int] = ..., disconnect_policy: _Optional[_Union[DisconnectPolicy, str]] = ..., busy_thread_policy: _Optional[_Union[BusyThreadPolicy, str]] = ..., budget_overrides: _Optional[_Union[_snapshot_pb2.Budgets, _Mapping]] = ...) -> None: ...

class StreamRunRequest(_message.Message):
    __slots__ = ("run_id", "tenant", "after_seq")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant: str
    after_seq: int
    def __init__(self, run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., after_seq: _Optional[int] = ...) -> None: ...

class StreamRunResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _events_pb2.RunEvent
    def __init__(self, event: _Optional[_Union[_events_pb2.RunEvent, _Mapping]] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "tenant", "mode", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant: str
    mode: CancelMode
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., mode: _Optional[_Union[CancelMode, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("outcome", "run")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    outcome: CancelOutcome
    run: Run
    def __init__(self, outcome: _Optional[_Union[CancelOutcome, str]] = ..., run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id", "tenant")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant: str
    def __init__(self, run_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class ResolvePermissionRequest(_message.Message):
    __slots__ = ("run_id", "tenant", "permission_request_id", "decision", "edited_arguments_json", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    EDITED_ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant: str
    permission_request_id: str
    decision: PermissionDecision
    edited_arguments_json: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., permission_request_id: _Optional[str] = ..., decision: _Optional[_Union[PermissionDecision, str]] = ..., edited_arguments_json: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResolvePermissionResponse(_message.Message):
    __slots__ = ("decision", "decided_at", "run", "resumed")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    decision: PermissionDecision
    decided_at: _timestamp_pb2.Timestamp
    run: Run
    resumed: bool
    def __init__(self, decision: _Optional[_Union[PermissionDecision, str]] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run: _Optional[_Union[Run, _Mapping]] = ..., resumed: _Optional[bool] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "thread_id", "tenant", "status", "plan", "finished_reply_ids", "last_seq", "created_at", "updated_at", "continued_by_run_id", "pending_permissions")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REPLY_IDS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    CONTINUED_BY_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PENDING_PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    thread_id: str
    tenant: str
    status: RunStatus
    plan: _containers.RepeatedCompositeFieldContainer[_events_pb2.PlanStep]
    finished_reply_ids: _containers.RepeatedScalarFieldContainer[str]
    last_seq: int
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    continued_by_run_id: str
    pending_permissions: _containers.RepeatedCompositeFieldContainer[_events_pb2.PermissionRequired]
    def __init__(self, run_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., tenant: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., plan: _Optional[_Iterable[_Union[_events_pb2.PlanStep, _Mapping]]] = ..., finished_reply_ids: _Optional[_Iterable[str]] = ..., last_seq: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., continued_by_run_id: _Optional[str] = ..., pending_permissions: _Optional[_Iterable[_Union[_events_pb2.PermissionRequired, _Mapping]]] = ...) -> None: ...
