"""A member's prompt, as it reaches a real OpenAI-compatible server over HTTP."""

from __future__ import annotations

import json

from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, member, of_kind, start_request
from support.openai_server import OpenAITestServer, Reply

CANARY_KEY = "sk-canary-7f3a9c0e51"


async def test_openai_member_prompt_has_persona_skills_memories_and_no_key(stub) -> None:
    async with OpenAITestServer(token_delay_s=0.01) as model_server:
        model_server.script(Reply(text="Green tea, brewed at eighty degrees, is my advice."))
        ref = spb.ModelRef(
            target=spb.ModelTarget(
                provider="openai",
                model="qwen-test",
                base_url=model_server.base_url,
                credential_ref="tea-key",
            )
        )
        tea_master = member(
            "lin",
            "Lin",
            "PERSONA-MARKER: a calm tea master who speaks in proverbs.",
            style_rules=["Answer in one sentence."],
            skills=[
                spb.Skill(skill_id="s1", name="tea ceremony", instructions="Explain the steps.")
            ],
            memories=[
                spb.Memory(memory_id="m1", content="The user loves green tea.", importance=0.9),
                spb.Memory(memory_id="m2", content="The user owns a red bicycle.", importance=0.1),
            ],
            model=ref,
        )
        request = start_request(
            "How should I brew green tea?",
            kind=spb.SESSION_KIND_SINGLE,
            members=[tea_master],
            credentials={"tea-key": CANARY_KEY},
        )
        events = await collect(stub.StartRun(request))

    (final,) = finals(events)
    assert final.content == "Green tea, brewed at eighty degrees, is my advice."
    assert final.model == "openai/qwen-test"
    assert len(of_kind(events, "assistant_delta")) >= 1

    (sent,) = model_server.requests
    assert sent.authorization == f"Bearer {CANARY_KEY}"
    body = json.dumps(sent.body, ensure_ascii=False)
    system = sent.body["messages"][0]["content"]
    assert "PERSONA-MARKER" in system
    assert "tea ceremony: Explain the steps." in system
    assert "Answer in one sentence." in system
    assert "The user loves green tea." in system  # relevant to the turn: selected
    assert "How should I brew green tea?" in sent.body["messages"][-1]["content"]
    assert CANARY_KEY not in body
    assert all(CANARY_KEY not in e.SerializeToString().decode("utf-8", "replace") for e in events)
