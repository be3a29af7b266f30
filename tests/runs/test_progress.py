"""A run's progress reads the same from the events it emits as from the event log."""

from __future__ import annotations

from roundtable.codec.events import decode, seal
from roundtable.domain.events import (
    AssistantFinal,
    Event,
    FinishReason,
    PlanCreated,
    SpeakerFailed,
    TokenUsage,
)
from roundtable.domain.plan import DirectiveKind, PlanSource, PlanStep
from roundtable.runs.progress import Progress


def step(i: int, round_: int = 1) -> PlanStep:
    return PlanStep(
        index=i,
        member_id=f"m{i}",
        reply_id=f"r#{i}",
        task=f"报数：你是第 {i + 1} 位",
        token_budget=64,
        round=round_,
        count_off_number=i + 1,
    )


EVENTS: list[Event] = [
    PlanCreated(
        directive=DirectiveKind.OPEN,
        source=PlanSource.SUPERVISOR,
        steps=(step(0), step(1)),
        round=1,
        converged=False,
    ),
    AssistantFinal(
        reply_id="r#0",
        member_id="m0",
        step=0,
        content="一！",
        model="offline/m",
        usage=TokenUsage(3, 2),
        finish_reason=FinishReason.STOP,
        attempts=1,
    ),
    SpeakerFailed(reply_id="r#1", member_id="m1", step=1, code="TIMEOUT", message="", attempts=3),
    # A resumed plan repeats known steps: they are not added twice.
    PlanCreated(
        directive=DirectiveKind.OPEN,
        source=PlanSource.SUPERVISOR,
        steps=(step(1), step(2, 2)),
        round=2,
    ),
]


def test_emitted_and_logged_events_give_the_same_progress() -> None:
    emitted = Progress()
    for event in EVENTS:
        emitted.observe(event)
    # Through the log: encoded as the store keeps them, decoded as a resume reads them.
    logged = Progress.of(
        decode(seal("run-1", seq, 0.0, event).wire) for seq, event in enumerate(EVENTS, start=1)
    )
    assert emitted == logged
    assert [s.reply_id for s in emitted.steps] == ["r#0", "r#1", "r#2"]
    assert emitted.finished == {"r#0": "一！", "r#1": None}
    assert emitted.verdicts == {
        1: (PlanSource.SUPERVISOR, False),
        2: (PlanSource.SUPERVISOR, True),
    }
    assert emitted.steps_left == [step(2, 2)]
