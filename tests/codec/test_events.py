"""The codec: every domain event survives the log (encoded once, decoded by a resume), and
the bytes a stream sends are a StartRunResponse / StreamRunResponse holding that event."""

from __future__ import annotations

import pytest
from roundtable.api.servicer import frame_event
from roundtable.codec.events import KINDS, UnknownEvent, decode, kind_of, seal
from roundtable.domain.events import (
    AssistantDelta,
    AssistantFinal,
    Event,
    FinishReason,
    MemoryAction,
    MemoryProposal,
    MemoryProposed,
    PermissionRequired,
    PlanCreated,
    ReplySummary,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    SpeakerFailed,
    SpeakerStarted,
    TokenUsage,
)
from roundtable.domain.plan import DirectiveKind, PlanSource, PlanStep, Route
from roundtable.domain.tools import ToolCallSummary, ToolOutcome
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb

STEP = PlanStep(
    index=2,
    member_id="mei",
    reply_id="run-1#2",
    task="报数：你是第 3 位",
    token_budget=64,
    round=2,
    count_off_number=3,
)

EVENTS: list[Event] = [
    RunStarted(route=Route.GROUP, resumed=True, thread_id="t-1"),
    PlanCreated(
        directive=DirectiveKind.COUNT_OFF,
        source=PlanSource.FALLBACK,
        steps=(STEP,),
        round=2,
        fallback_reason="supervisor_timeout",
        continued_run_id="run-0",
        converged=False,
    ),
    SpeakerStarted(step=2, member_id="mei", reply_id="run-1#2", attempt=3),
    AssistantDelta(reply_id="run-1#2", text="三", attempt=2),
    AssistantFinal(
        reply_id="run-1#2",
        member_id="mei",
        step=2,
        content="3！",
        model="openai/smollm2",
        usage=TokenUsage(120, 4, counted=True),
        finish_reason=FinishReason.REPLACED,
        attempts=3,
        tool_calls=(
            ToolCallSummary("run-1#2/1", "weather", ToolOutcome.OK),
            ToolCallSummary("run-1#2/2", "note", ToolOutcome.EXPIRED),
        ),
    ),
    PermissionRequired(
        permission_request_id="run-1#2/2",
        reply_id="run-1#2",
        member_id="mei",
        step=2,
        tool_name="note",
        arguments_json='{"text": "买牛奶", "n": 2}',
        expires_at=1_780_000_000.25,
    ),
    SpeakerFailed(
        reply_id="run-1#3",
        member_id="kai",
        step=3,
        code="MODEL_UNAVAILABLE",
        message="HTTP 500",
        attempts=3,
    ),
    MemoryProposed(
        proposals=(
            MemoryProposal(
                proposal_id="p-1",
                member_id="mei",
                action=MemoryAction.UPDATE,
                content="prefers short answers",
                importance=0.75,
                evidence_reply_ids=("run-1#2",),
                target_memory_id="mem-9",
            ),
        )
    ),
    RunCancelled(reason="stop_directive", finished_reply_ids=("run-1#0",), steps_left=(STEP,)),
    RunCompleted(
        replies=(ReplySummary(reply_id="run-1#2", member_id="mei", step=2),),
        usage=TokenUsage(300, 20),
        converged=True,
        rounds=2,
    ),
    RunFailed(code="RUN_INTERRUPTED", message="the execution stopped", retryable=True),
]


def test_every_kind_is_covered() -> None:
    assert {type(e) for e in EVENTS} == set(KINDS)


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_an_event_reads_back_as_it_was_logged(event: Event) -> None:
    sealed = seal("run-1", 7, 1_733_212_800.25, event)
    back = decode(sealed.wire)
    assert back.event == event
    assert (back.run_id, back.seq, back.wire) == ("run-1", 7, sealed.wire)
    assert back.emitted_at == pytest.approx(1_733_212_800.25)
    assert epb.RunEvent.FromString(sealed.wire).WhichOneof("payload") == kind_of(event)


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_a_stream_sends_the_logged_bytes_as_the_response_message(event: Event) -> None:
    wire = seal("run-1", 7, 0.0, event).wire
    for response in (pb.StartRunResponse, pb.StreamRunResponse):
        framed = frame_event(wire)
        assert framed.endswith(wire), "the logged bytes go out as they are"
        parsed = response.FromString(framed)
        # Compared as messages: re-serializing a map (a Struct's fields) may order it
        # differently from the bytes that were sent.
        assert parsed.event == epb.RunEvent.FromString(wire)


def test_a_big_event_is_framed_with_a_multi_byte_length() -> None:
    final = EVENTS[4]
    assert isinstance(final, AssistantFinal)
    big = seal("run-1", 1, 0.0, AssistantFinal(**{**_fields(final), "content": "x" * 300_000}))
    assert pb.StartRunResponse.FromString(frame_event(big.wire)).event.assistant_final.content == (
        "x" * 300_000
    )


def test_an_event_kind_this_version_does_not_know_is_refused() -> None:
    # Every kind of this version's oneof is known; a newer version's kind arrives as an
    # unknown field, which reads as no payload at all.
    newer = epb.RunEvent(run_id="run-1", seq=1).SerializeToString() + bytes([0xAA, 0x01, 0x00])
    with pytest.raises(UnknownEvent):
        decode(newer)


def _fields(event: AssistantFinal) -> dict[str, object]:
    return {name: getattr(event, name) for name in event.__dataclass_fields__}
