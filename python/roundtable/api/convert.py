"""Converts the requests' protobuf to domain types, and a run's view back.

Inbound conversion happens once per request, after validation. Events go out through
`roundtable.codec` (encoded once, when they are logged); this module only builds what
the unary RPCs answer: the contract's `Run`.
"""

from __future__ import annotations

from collections.abc import Sequence

from roundtable.api.limits import RequestLimits
from roundtable.api.wire import ReceivedStartRun
from roundtable.codec.events import plan_steps_to_proto
from roundtable.codec.fingerprint import fingerprint, legacy_fingerprint
from roundtable.codec.timestamps import seconds_of, timestamp
from roundtable.codec.tool_events import permission_to_proto
from roundtable.domain.events import PermissionRequired
from roundtable.domain.snapshot import (
    OFFLINE_MODEL,
    Budgets,
    BusyThreadPolicy,
    DisconnectPolicy,
    HistoryMessage,
    Member,
    Memory,
    MessageRole,
    ModelRef,
    ModelTarget,
    RunContext,
    RunOptions,
    RunRequest,
    Session,
    SessionKind,
    Skill,
    Snapshot,
    SpeakerConcurrency,
    UserTurn,
)
from roundtable.domain.tools import ApprovalPolicy, Tool, ToolServer
from roundtable.runs.progress import Progress
from roundtable.store.base import RunRecord, RunStatus
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb

__all__ = ["fingerprint", "legacy_fingerprint", "run_request_from_proto", "run_to_proto"]

# -- inbound ------------------------------------------------------------------------------


def run_request_from_proto(
    received: ReceivedStartRun | pb.StartRunRequest, *, limits: RequestLimits, defaults: Budgets
) -> RunRequest:
    """Builds the domain request from a validated StartRunRequest (credentials stay out)."""
    if isinstance(received, pb.StartRunRequest):
        received = ReceivedStartRun.of(received)
    request = received.message
    context = RunContext(
        run_id=request.context.run_id,
        thread_id=request.context.thread_id,
        request_id=request.context.request_id,
        tenant=request.context.tenant,
    )
    overrides = (
        request.options.budget_overrides if request.options.HasField("budget_overrides") else None
    )
    return RunRequest(
        context=context,
        snapshot=snapshot_from_proto(
            request.snapshot,
            limits=limits,
            defaults=defaults,
            overrides=overrides,
            history=received.history,
        ),
        options=options_from_proto(request.options),
        fingerprint=fingerprint(request.context.thread_id, received.snapshot_bytes()),
    )


def snapshot_from_proto(
    snapshot: spb.Snapshot,
    *,
    limits: RequestLimits,
    defaults: Budgets,
    overrides: spb.Budgets | None = None,
    history: Sequence[spb.HistoryMessage] | None = None,
) -> Snapshot:
    """Converts a validated snapshot; keeps only the history window a prompt can use.

    `history` is the snapshot's history as received (`api.wire.ReceivedStartRun.history`);
    without it, `snapshot.history`.
    """
    session = snapshot.session
    if history is None:
        history = snapshot.history
    window = history[max(0, len(history) - limits.history_window) :]
    budgets = _budgets(session.budgets, defaults)
    if overrides is not None:
        budgets = _budgets(overrides, budgets)
    return Snapshot(
        session=Session(
            kind=SessionKind.SINGLE
            if session.kind == spb.SESSION_KIND_SINGLE
            else SessionKind.GROUP,
            primary_member_id=session.primary_member_id,
            default_model=_model_ref(session.default_model)
            if session.HasField("default_model")
            else OFFLINE_MODEL,
            budgets=budgets,
            session_id=session.session_id,
            speaker_concurrency=SpeakerConcurrency.PARALLEL
            if session.speaker_concurrency == spb.SPEAKER_CONCURRENCY_PARALLEL
            else SpeakerConcurrency.SEQUENTIAL,
            tool_servers=tuple(
                ToolServer(server_id=s.server_id, url=s.url, credential_ref=s.credential_ref)
                for s in session.tool_servers
            ),
            tools=tuple(_tool(t) for t in session.tools),
        ),
        members=tuple(_member(m) for m in snapshot.members),
        history=tuple(
            HistoryMessage(
                role=MessageRole.USER if m.role == spb.MESSAGE_ROLE_USER else MessageRole.ASSISTANT,
                content=m.content,
                member_id=m.member_id,
                message_id=m.message_id,
            )
            for m in window
        ),
        user_turn=UserTurn(
            text=snapshot.user_turn.text,
            mentions=tuple(snapshot.user_turn.mentions),
            mention_all=snapshot.user_turn.mention_all,
            message_id=snapshot.user_turn.message_id,
        ),
        history_total=len(history),
    )


def options_from_proto(options: pb.RunOptions) -> RunOptions:
    """Applies defaults to the run options."""
    base = RunOptions()
    return RunOptions(
        stream_deltas=options.stream_deltas
        if options.HasField("stream_deltas")
        else base.stream_deltas,
        delta_window_s=options.delta_window_ms / 1000
        if options.delta_window_ms
        else base.delta_window_s,
        delta_max_bytes=options.delta_max_bytes or base.delta_max_bytes,
        disconnect_policy=(
            DisconnectPolicy.CANCEL
            if options.disconnect_policy == pb.DISCONNECT_POLICY_CANCEL
            else DisconnectPolicy.CONTINUE
        ),
        busy_thread_policy={
            pb.BUSY_THREAD_POLICY_INTERRUPT: BusyThreadPolicy.INTERRUPT,
            pb.BUSY_THREAD_POLICY_ENQUEUE: BusyThreadPolicy.ENQUEUE,
        }.get(options.busy_thread_policy, BusyThreadPolicy.REJECT),
    )


def _budgets(budgets: spb.Budgets, base: Budgets) -> Budgets:
    return Budgets(
        max_speakers=budgets.max_speakers or base.max_speakers,
        max_rounds=budgets.max_rounds or base.max_rounds,
        max_output_tokens=budgets.max_output_tokens or base.max_output_tokens,
        run_timeout_s=float(budgets.run_timeout_seconds or base.run_timeout_s),
        max_parallel_speakers=budgets.max_parallel_speakers or base.max_parallel_speakers,
        max_tool_calls_per_speaker=budgets.max_tool_calls_per_speaker
        or base.max_tool_calls_per_speaker,
        approval_timeout_s=float(budgets.approval_timeout_seconds or base.approval_timeout_s),
    )


def _tool(tool: spb.Tool) -> Tool:
    return Tool(
        name=tool.name,
        description=tool.description,
        input_schema_json=tool.input_schema_json,
        server_id=tool.server_id,
        approval=ApprovalPolicy.ALWAYS
        if tool.approval == spb.APPROVAL_POLICY_ALWAYS
        else ApprovalPolicy.NEVER,
        read_only=tool.read_only,
        timeout_s=tool.timeout_ms / 1000 if tool.timeout_ms else None,
    )


def _target(target: spb.ModelTarget) -> ModelTarget:
    return ModelTarget(
        provider=target.provider,
        model=target.model,
        base_url=target.base_url,
        credential_ref=target.credential_ref,
    )


def _model_ref(ref: spb.ModelRef) -> ModelRef:
    return ModelRef(
        target=_target(ref.target),
        fallbacks=tuple(_target(t) for t in ref.fallbacks),
        temperature=ref.temperature if ref.HasField("temperature") else None,
        timeout_s=ref.timeout_ms / 1000 if ref.timeout_ms else None,
    )


def _member(member: spb.Member) -> Member:
    return Member(
        member_id=member.member_id,
        display_name=member.display_name,
        aliases=tuple(member.aliases),
        persona=member.persona,
        style_rules=tuple(member.style_rules),
        model=_model_ref(member.model) if member.HasField("model") else None,
        skills=tuple(
            Skill(skill_id=s.skill_id, name=s.name, instructions=s.instructions)
            for s in member.skills
        ),
        memories=tuple(
            Memory(
                memory_id=m.memory_id,
                content=m.content,
                importance=m.importance,
                updated_at=seconds_of(m.updated_at),
            )
            for m in member.memories
        ),
        tool_names=tuple(member.tool_names),
    )


# -- outbound -----------------------------------------------------------------------------

_STATUS = {
    RunStatus.QUEUED: pb.RUN_STATUS_QUEUED,
    RunStatus.RUNNING: pb.RUN_STATUS_RUNNING,
    RunStatus.SUCCEEDED: pb.RUN_STATUS_SUCCEEDED,
    RunStatus.CANCELLED: pb.RUN_STATUS_CANCELLED,
    RunStatus.INTERRUPTED: pb.RUN_STATUS_INTERRUPTED,
    RunStatus.FAILED: pb.RUN_STATUS_FAILED,
    RunStatus.CONTINUED: pb.RUN_STATUS_CONTINUED,
    RunStatus.AWAITING_APPROVAL: pb.RUN_STATUS_AWAITING_APPROVAL,
}


def run_to_proto(
    record: RunRecord, progress: Progress, pending: Sequence[PermissionRequired] = ()
) -> pb.Run:
    """The contract's view of a run (with the permission requests still waiting)."""
    run = pb.Run(
        run_id=record.run_id,
        thread_id=record.thread_id,
        tenant=record.tenant,
        status=_STATUS[record.status],
        plan=plan_steps_to_proto(progress.steps),
        finished_reply_ids=progress.finished_reply_ids,
        last_seq=record.last_seq,
        created_at=timestamp(record.created_at),
        updated_at=timestamp(record.updated_at),
        continued_by_run_id=record.continued_by,
    )
    for request in pending:
        run.pending_permissions.append(permission_to_proto(request))
    return run
