"""`roundtable chat` prints a turn as a person reads it: each reply once."""

from __future__ import annotations

import io

from roundtable.chat import ChatRenderer
from roundtable.v1 import events_pb2 as epb


def started(member: str, attempt: int = 1) -> epb.RunEvent:
    return epb.RunEvent(
        speaker_started=epb.SpeakerStarted(member_id=member, reply_id="r#0", attempt=attempt)
    )


def delta(text: str, attempt: int = 1) -> epb.RunEvent:
    return epb.RunEvent(
        assistant_delta=epb.AssistantDelta(reply_id="r#0", text=text, attempt=attempt)
    )


def final(content: str) -> epb.RunEvent:
    return epb.RunEvent(
        assistant_final=epb.AssistantFinal(reply_id="r#0", member_id="m", content=content)
    )


def shown(*events: epb.RunEvent) -> str:
    out = io.StringIO()
    render = ChatRenderer({"m": "Mei"}, out)
    for event in events:
        render(event)
    return out.getvalue()


def test_the_final_adds_only_what_the_deltas_did_not_show() -> None:
    # The server drops the last buffered delta when the final follows it at once.
    assert shown(started("m"), delta("Hello, "), final("Hello, world.")) == "Mei: Hello, world.\n"


def test_a_reply_without_deltas_is_shown_from_its_final() -> None:
    assert shown(started("m"), final("1!")) == "Mei: 1!\n"


def test_a_retried_attempt_starts_its_text_over_and_a_different_final_stands_alone() -> None:
    text = shown(started("m"), delta("The answer is fo"), delta("Hi", attempt=2), final("Hi."))
    assert text == "Mei: The answer is fo\n   (again) Hi.\n"
    replaced = shown(started("m"), delta("seven"), final("3!"))
    assert replaced == "Mei: seven\n   ✓ 3!\n"


def test_a_second_attempt_starts_a_line_of_its_own() -> None:
    # A count-off reply that failed its check is asked again as attempt 2.
    second = epb.RunEvent(
        speaker_started=epb.SpeakerStarted(member_id="m", reply_id="r#0", attempt=2)
    )
    text = shown(started("m"), delta("you are number 1"), second, final("2"))
    assert text == "Mei: you are number 1\nMei (attempt 2): 2\n"


def test_a_failed_speaker_is_shown_with_its_cause() -> None:
    failed = epb.RunEvent(
        speaker_failed=epb.SpeakerFailed(
            member_id="m",
            code="MODEL_UNAVAILABLE",
            message="model server unavailable: connection refused (ECONNREFUSED)",
        )
    )
    assert shown(started("m"), failed) == (
        "Mei: \n   ✗ Mei failed: MODEL_UNAVAILABLE"
        " (model server unavailable: connection refused (ECONNREFUSED))\n"
    )


def test_speakers_answering_at_once_show_each_reply_whole_as_it_is_final() -> None:
    steps = [
        epb.PlanStep(index=i, member_id=m, reply_id=f"r#{i}", round=1, parallel_group=1)
        for i, m in enumerate(("a", "b"))
    ]
    plan = epb.RunEvent(plan_created=epb.PlanCreated(steps=steps, round=1))

    def event(kind: str, i: int, **fields: object) -> epb.RunEvent:
        payload = {
            "speaker_started": epb.SpeakerStarted,
            "assistant_delta": epb.AssistantDelta,
            "assistant_final": epb.AssistantFinal,
        }[kind](reply_id=f"r#{i}", **fields)
        return epb.RunEvent(**{kind: payload})

    out = io.StringIO()
    render = ChatRenderer({"a": "Ann", "b": "Bo"}, out)
    for e in (
        plan,
        event("speaker_started", 0, member_id="a", attempt=1),
        event("speaker_started", 1, member_id="b", attempt=1),
        event("assistant_delta", 0, text="Hel", attempt=1),
        event("assistant_delta", 1, text="Yo", attempt=1),
        event("assistant_final", 1, member_id="b", content="Yo!"),
        event("assistant_final", 0, member_id="a", content="Hello."),
    ):
        render(e)
    assert out.getvalue().splitlines()[1:] == [
        "── answering at once: Ann, Bo",
        "Bo: Yo!",
        "Ann: Hello.",
    ]


def test_a_speaker_that_first_asks_for_a_tool_gets_no_empty_line() -> None:
    asked = epb.RunEvent(
        permission_required=epb.PermissionRequired(
            member_id="m", tool_name="note", arguments_json='{"text": "milk"}'
        )
    )
    text = shown(started("m"), asked, delta("noted."), final("noted."))
    assert text == '── Mei asks to run note({"text": "milk"})\nMei: noted.\n'


async def test_asking_at_the_terminal_takes_end_of_input_for_a_no(monkeypatch) -> None:
    # `roundtable chat --tools ... < /dev/null`: a traceback before, and the run waited.
    from roundtable.chat import Approver
    from roundtable.v1 import orchestrator_service_pb2 as pb

    def no_terminal(prompt: str) -> str:
        raise EOFError

    asked = epb.PermissionRequired(member_id="m", tool_name="note")
    monkeypatch.setattr("builtins.input", no_terminal)
    assert await Approver("ask", {"m": "Mei"}).decide(asked) == (
        pb.PERMISSION_DECISION_DENY,
        "nobody answered",
    )
    monkeypatch.setattr("builtins.input", lambda prompt: "好")
    assert await Approver("ask", {}).decide(asked) == (pb.PERMISSION_DECISION_APPROVE, "")
