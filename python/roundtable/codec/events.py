"""Domain events to RunEvent bytes and back: the one place that knows both.

`seal` is on the hot path of every turn: it builds one protobuf message per durable event
and serializes it once; the store logs those bytes and every stream sends them as they are
(`Envelope.wire`). `decode` reads a logged event back into a domain event for the runs
layer (resume, continue, GetRun), keeping its bytes for replay: a replay sends exactly the
bytes that were sent live, with the same seq.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roundtable.codec.timestamps import seconds_of, set_timestamp
from roundtable.codec.tool_events import (
    decode_permission,
    encode_permission,
    tool_calls_from_proto,
    tool_calls_to_proto,
)
from roundtable.domain import events as ev
from roundtable.domain.plan import DirectiveKind, PlanSource, PlanStep, Route
from roundtable.v1 import events_pb2 as epb

_ROUTE = {Route.SINGLE: epb.ROUTE_SINGLE, Route.GROUP: epb.ROUTE_GROUP}
_DIRECTIVE = {
    DirectiveKind.SINGLE: epb.DIRECTIVE_KIND_SINGLE,
    DirectiveKind.OPEN: epb.DIRECTIVE_KIND_OPEN,
    DirectiveKind.MENTION: epb.DIRECTIVE_KIND_MENTION,
    DirectiveKind.ALL: epb.DIRECTIVE_KIND_ALL,
    DirectiveKind.COUNT_OFF: epb.DIRECTIVE_KIND_COUNT_OFF,
    DirectiveKind.STOP: epb.DIRECTIVE_KIND_STOP,
    DirectiveKind.CONTINUE: epb.DIRECTIVE_KIND_CONTINUE,
}
_SOURCE = {
    PlanSource.DETERMINISTIC: epb.PLAN_SOURCE_DETERMINISTIC,
    PlanSource.SUPERVISOR: epb.PLAN_SOURCE_SUPERVISOR,
    PlanSource.FALLBACK: epb.PLAN_SOURCE_FALLBACK,
    PlanSource.CONTINUED: epb.PLAN_SOURCE_CONTINUED,
}
_FINISH = {
    ev.FinishReason.STOP: epb.FINISH_REASON_STOP,
    ev.FinishReason.LENGTH: epb.FINISH_REASON_LENGTH,
    ev.FinishReason.REPLACED: epb.FINISH_REASON_REPLACED,
}
_ACTION = {
    ev.MemoryAction.CREATE: epb.MEMORY_ACTION_CREATE,
    ev.MemoryAction.UPDATE: epb.MEMORY_ACTION_UPDATE,
    ev.MemoryAction.FORGET: epb.MEMORY_ACTION_FORGET,
}


def _inverse(table: Mapping[Any, Any]) -> dict[int, Any]:
    return {int(wire): domain for domain, wire in table.items()}


_ROUTE_IN = _inverse(_ROUTE)
_DIRECTIVE_IN = _inverse(_DIRECTIVE)
_SOURCE_IN = _inverse(_SOURCE)
_FINISH_IN = _inverse(_FINISH)
_ACTION_IN = _inverse(_ACTION)

KINDS: dict[type, str] = {
    ev.RunStarted: "run_started",
    ev.PlanCreated: "plan_created",
    ev.SpeakerStarted: "speaker_started",
    ev.AssistantDelta: "assistant_delta",
    ev.AssistantFinal: "assistant_final",
    ev.SpeakerFailed: "speaker_failed",
    ev.MemoryProposed: "memory_proposed",
    ev.PermissionRequired: "permission_required",
    ev.RunCancelled: "run_cancelled",
    ev.RunCompleted: "run_completed",
    ev.RunFailed: "run_failed",
}
"""Each event type's name in the RunEvent oneof (the log's `kind` column, metrics labels)."""


def kind_of(event: ev.Event) -> str:
    """The RunEvent oneof name of a domain event."""
    return KINDS[type(event)]


# -- domain -> protobuf --------------------------------------------------------------------


def plan_steps_to_proto(steps: Sequence[PlanStep]) -> list[epb.PlanStep]:
    """Plan steps as protobuf."""
    return [
        epb.PlanStep(
            index=s.index,
            member_id=s.member_id,
            reply_id=s.reply_id,
            task=s.task,
            token_budget=s.token_budget,
            round=s.round,
            count_off_number=s.count_off_number,
            parallel_group=s.parallel_group,
        )
        for s in steps
    ]


def _usage(out: epb.TokenUsage, usage: ev.TokenUsage) -> None:
    out.input_tokens, out.output_tokens = usage.input_tokens, usage.output_tokens


def _run_started(e: ev.RunStarted, out: epb.RunEvent) -> None:
    s = out.run_started
    s.route, s.resumed, s.thread_id = _ROUTE[e.route], e.resumed, e.thread_id


def _plan_created(e: ev.PlanCreated, out: epb.RunEvent) -> None:
    p = out.plan_created
    p.directive, p.source = _DIRECTIVE[e.directive], _SOURCE[e.source]
    p.fallback_reason = e.fallback_reason
    p.steps.extend(plan_steps_to_proto(e.steps))
    p.round, p.continued_run_id, p.converged = e.round, e.continued_run_id, e.converged


def _speaker_started(e: ev.SpeakerStarted, out: epb.RunEvent) -> None:
    s = out.speaker_started
    s.step, s.member_id, s.reply_id, s.attempt = e.step, e.member_id, e.reply_id, e.attempt


def _assistant_delta(e: ev.AssistantDelta, out: epb.RunEvent) -> None:
    d = out.assistant_delta
    d.reply_id, d.text, d.attempt = e.reply_id, e.text, e.attempt


def _assistant_final(e: ev.AssistantFinal, out: epb.RunEvent) -> None:
    f = out.assistant_final
    f.reply_id, f.member_id, f.step, f.content, f.model = (
        e.reply_id,
        e.member_id,
        e.step,
        e.content,
        e.model,
    )
    _usage(f.usage, e.usage)
    f.finish_reason, f.attempts = _FINISH[e.finish_reason], e.attempts
    f.output_tokens_counted = e.usage.counted
    if e.tool_calls:
        f.tool_calls.extend(tool_calls_to_proto(e.tool_calls))


def _speaker_failed(e: ev.SpeakerFailed, out: epb.RunEvent) -> None:
    f = out.speaker_failed
    f.reply_id, f.member_id, f.step, f.code, f.message, f.attempts = (
        e.reply_id,
        e.member_id,
        e.step,
        e.code,
        e.message,
        e.attempts,
    )


def _memory_proposed(e: ev.MemoryProposed, out: epb.RunEvent) -> None:
    out.memory_proposed.proposals.extend(
        epb.MemoryProposal(
            proposal_id=p.proposal_id,
            member_id=p.member_id,
            action=_ACTION[p.action],
            target_memory_id=p.target_memory_id,
            content=p.content,
            importance=p.importance,
            evidence_reply_ids=p.evidence_reply_ids,
        )
        for p in e.proposals
    )


def _run_cancelled(e: ev.RunCancelled, out: epb.RunEvent) -> None:
    c = out.run_cancelled
    c.reason = e.reason
    c.finished_reply_ids.extend(e.finished_reply_ids)
    c.steps_left.extend(plan_steps_to_proto(e.steps_left))


def _run_completed(e: ev.RunCompleted, out: epb.RunEvent) -> None:
    c = out.run_completed
    c.replies.extend(
        epb.ReplySummary(reply_id=r.reply_id, member_id=r.member_id, step=r.step) for r in e.replies
    )
    _usage(c.usage, e.usage)
    c.converged, c.rounds = e.converged, e.rounds


def _run_failed(e: ev.RunFailed, out: epb.RunEvent) -> None:
    f = out.run_failed
    f.code, f.message, f.retryable = e.code, e.message, e.retryable


_ENCODE: dict[type, Callable[[Any, epb.RunEvent], None]] = {
    ev.RunStarted: _run_started,
    ev.PlanCreated: _plan_created,
    ev.SpeakerStarted: _speaker_started,
    ev.AssistantDelta: _assistant_delta,
    ev.AssistantFinal: _assistant_final,
    ev.SpeakerFailed: _speaker_failed,
    ev.MemoryProposed: _memory_proposed,
    ev.PermissionRequired: lambda e, out: encode_permission(e, out.permission_required),
    ev.RunCancelled: _run_cancelled,
    ev.RunCompleted: _run_completed,
    ev.RunFailed: _run_failed,
}


def to_proto(run_id: str, seq: int, emitted_at: float, event: ev.Event) -> epb.RunEvent:
    """The RunEvent envelope of a domain event."""
    out = epb.RunEvent(run_id=run_id, seq=seq)
    set_timestamp(out.emitted_at, emitted_at)
    _ENCODE[type(event)](event, out)
    return out


def encode(envelope: ev.Envelope) -> bytes:
    """The envelope's RunEvent bytes (its `wire`, made now when it has none yet)."""
    if envelope.wire:
        return envelope.wire
    return to_proto(
        envelope.run_id, envelope.seq, envelope.emitted_at, envelope.event
    ).SerializeToString()


def seal(run_id: str, seq: int, emitted_at: float, event: ev.Event) -> ev.Envelope:
    """An envelope with its bytes: what the log stores and every stream sends."""
    wire = to_proto(run_id, seq, emitted_at, event).SerializeToString()
    return ev.Envelope(run_id=run_id, seq=seq, emitted_at=emitted_at, event=event, wire=wire)


# -- protobuf -> domain --------------------------------------------------------------------


def plan_step_from_proto(step: epb.PlanStep) -> PlanStep:
    """A plan step read back from the event log."""
    return PlanStep(
        index=step.index,
        member_id=step.member_id,
        reply_id=step.reply_id,
        task=step.task,
        token_budget=step.token_budget,
        round=step.round,
        count_off_number=step.count_off_number,
        parallel_group=step.parallel_group,
    )


def _steps(steps: Sequence[epb.PlanStep]) -> tuple[PlanStep, ...]:
    return tuple(plan_step_from_proto(s) for s in steps)


def _usage_in(usage: epb.TokenUsage, counted: bool = False) -> ev.TokenUsage:
    return ev.TokenUsage(usage.input_tokens, usage.output_tokens, counted)


def _decode_plan(p: epb.PlanCreated) -> ev.PlanCreated:
    return ev.PlanCreated(
        directive=_DIRECTIVE_IN.get(p.directive, DirectiveKind.OPEN),
        # An unknown source reads as deterministic: a plan that asks for no further round.
        source=_SOURCE_IN.get(p.source, PlanSource.DETERMINISTIC),
        steps=_steps(p.steps),
        round=p.round,
        fallback_reason=p.fallback_reason,
        continued_run_id=p.continued_run_id,
        converged=p.converged,
    )


def _decode_final(f: epb.AssistantFinal) -> ev.AssistantFinal:
    return ev.AssistantFinal(
        reply_id=f.reply_id,
        member_id=f.member_id,
        step=f.step,
        content=f.content,
        model=f.model,
        usage=_usage_in(f.usage, f.output_tokens_counted),
        finish_reason=_FINISH_IN.get(f.finish_reason, ev.FinishReason.STOP),
        attempts=f.attempts,
        tool_calls=tool_calls_from_proto(f.tool_calls),
    )


def _decode_memory(m: epb.MemoryProposed) -> ev.MemoryProposed:
    return ev.MemoryProposed(
        proposals=tuple(
            ev.MemoryProposal(
                proposal_id=p.proposal_id,
                member_id=p.member_id,
                action=_ACTION_IN.get(p.action, ev.MemoryAction.CREATE),
                content=p.content,
                importance=p.importance,
                evidence_reply_ids=tuple(p.evidence_reply_ids),
                target_memory_id=p.target_memory_id,
            )
            for p in m.proposals
        )
    )


_DECODE: dict[str, Callable[[Any], ev.Event]] = {
    "run_started": lambda s: ev.RunStarted(
        route=_ROUTE_IN.get(s.route, Route.GROUP), resumed=s.resumed, thread_id=s.thread_id
    ),
    "plan_created": _decode_plan,
    "speaker_started": lambda s: ev.SpeakerStarted(
        step=s.step, member_id=s.member_id, reply_id=s.reply_id, attempt=s.attempt
    ),
    "assistant_delta": lambda d: ev.AssistantDelta(
        reply_id=d.reply_id, text=d.text, attempt=d.attempt
    ),
    "assistant_final": _decode_final,
    "speaker_failed": lambda f: ev.SpeakerFailed(
        reply_id=f.reply_id,
        member_id=f.member_id,
        step=f.step,
        code=f.code,
        message=f.message,
        attempts=f.attempts,
    ),
    "memory_proposed": _decode_memory,
    "permission_required": decode_permission,
    "run_cancelled": lambda c: ev.RunCancelled(
        reason=c.reason,
        finished_reply_ids=tuple(c.finished_reply_ids),
        steps_left=_steps(c.steps_left),
    ),
    "run_completed": lambda c: ev.RunCompleted(
        replies=tuple(
            ev.ReplySummary(reply_id=r.reply_id, member_id=r.member_id, step=r.step)
            for r in c.replies
        ),
        usage=_usage_in(c.usage),
        converged=c.converged,
        rounds=c.rounds,
    ),
    "run_failed": lambda f: ev.RunFailed(code=f.code, message=f.message, retryable=f.retryable),
}


class UnknownEvent(ValueError):
    """A logged event of a kind this version does not know (written by a newer one)."""


def decode(wire: bytes) -> ev.Envelope:
    """A logged event as a domain event, with its bytes kept for replay.

    Raises:
        UnknownEvent: the bytes hold no event kind this version knows.
    """
    message = epb.RunEvent.FromString(wire)
    kind = message.WhichOneof("payload")
    decoder = _DECODE.get(kind or "")
    if decoder is None:
        raise UnknownEvent(f"event {message.seq} of run {message.run_id!r}: {kind!r}")
    return ev.Envelope(
        run_id=message.run_id,
        seq=message.seq,
        emitted_at=seconds_of(message.emitted_at),
        event=decoder(getattr(message, kind or "")),
        wire=wire,
    )
