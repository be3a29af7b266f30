"""Structured output (supervisor plans, memory proposals) through a real gRPC server against
an OpenAI-compatible server that refuses JSON schemas, as llama.cpp's does for a schema its
grammar cannot take (HTTP 500 "failed to parse grammar")."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from roundtable.graph.nodes.supervisor import SupervisorPlan
from roundtable.models.structured import portable_schema
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, member, of_kind, start_request
from support.openai_server import OpenAITestServer, Reply


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    """SQLite only: what is tested here is the model edge, not the store."""
    yield f"sqlite:///{tmp_path / 'roundtable.db'}"


def refusing_ref(base_url: str) -> spb.ModelRef:
    return spb.ModelRef(target=spb.ModelTarget(provider="openai", model="llama", base_url=base_url))


def group_turn(text: str, server: OpenAITestServer, run_id: str) -> pb.StartRunRequest:
    """A group turn of Alice and Bob whose every model call goes to `server`."""
    return start_request(
        text,
        members=[member("a", "Alice"), member("b", "Bob")],
        default_model=refusing_ref(server.base_url),
        run_id=run_id,
    )


def formats(server: OpenAITestServer) -> list[str]:
    """Each request's response format type ("text" for a plain speaker call)."""
    return [(r.body.get("response_format") or {}).get("type", "text") for r in server.requests]


def audit(caplog: pytest.LogCaptureFixture, caller_node: str) -> list[dict[str, object]]:
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "roundtable.audit"]
    return [r for r in records if r["caller_node"] == caller_node]


async def test_memory_is_proposed_when_the_server_refuses_the_schema(
    stub: pb_grpc.OrchestratorServiceStub, caplog: pytest.LogCaptureFixture
) -> None:
    # Before the fix the schema went as a forced tool call, the refusal was MODEL_UNAVAILABLE
    # (retried, then skipped): no memory_proposed, ever, against such a server.
    caplog.set_level(logging.INFO, logger="roundtable.audit")
    proposal = {
        "member_id": "a",
        "action": "create",
        "content": "The user prefers short answers.",
        "importance": 0.8,
        "evidence_reply_ids": ["user"],
    }
    async with OpenAITestServer(refuse_schema=500) as model_server:
        model_server.script(
            Reply(text="Noted: short answers."), Reply(text=json.dumps({"proposals": [proposal]}))
        )
        ref = refusing_ref(model_server.base_url)
        request = start_request(
            "Remember that I prefer short answers.",
            kind=spb.SESSION_KIND_SINGLE,
            members=[member("a", "Alice")],
            default_model=ref,
            run_id="sm-1",
        )
        events = await collect(stub.StartRun(request))

    (proposed,) = of_kind(events, "memory_proposed")
    (got,) = proposed.memory_proposed.proposals
    assert (got.member_id, got.content) == ("a", "The user prefers short answers.")
    assert formats(model_server) == ["text", "json_schema", "json_object"]
    assert [r["status"] for r in audit(caplog, "propose_memory")] == ["success"]


async def test_the_supervisor_plans_in_json_mode_and_a_bad_answer_falls_back_with_its_reason(
    start_server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="roundtable.audit")
    plan = {"steps": [{"member_id": "b", "task": "Say which tea."}], "converged": True}
    async with (
        OpenAITestServer(refuse_schema=500) as model_server,
        start_server() as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        model_server.script(
            Reply(text=json.dumps(plan)),  # the plan, in JSON mode after the refusal
            Reply(text="Green tea."),  # Bob
            Reply(text='{"proposals": []}'),  # memory: JSON mode at once
            Reply(text="Let me think about who should speak."),  # the next turn's supervisor
            Reply(text="I would say oolong."),  # the fallback speaker (the primary, Alice)
        )
        ref = refusing_ref(model_server.base_url)
        planned = await collect(
            stub.StartRun(start_request("which tea?", default_model=ref, run_id="sp-1"))
        )
        fallen = await collect(
            stub.StartRun(start_request("and after?", default_model=ref, run_id="sp-2"))
        )

    first = of_kind(planned, "plan_created")[0].plan_created
    assert first.source == epb.PLAN_SOURCE_SUPERVISOR
    assert [s.member_id for s in first.steps] == ["b"]
    assert [f.content for f in finals(planned)] == ["Green tea."]
    second = of_kind(fallen, "plan_created")[0].plan_created
    assert second.source == epb.PLAN_SOURCE_FALLBACK
    assert second.fallback_reason == (
        "supervisor_invalid_output: json_object: answer is not JSON; "
        "the server refused the JSON schema (HTTP 500 Internal Server Error)"
    )
    assert [f.member_id for f in finals(fallen)] == ["a"]
    assert formats(model_server) == [
        "json_schema",
        "json_object",
        "text",
        "json_object",
        "json_object",
        "text",
        "json_object",  # its memory proposals (the echo: invalid, skipped)
    ]
    supervisor = audit(caplog, "supervisor")
    assert [(r["status"], r["error_code"]) for r in supervisor] == [
        ("success", ""),
        ("error", "INVALID_OUTPUT"),
    ], "a refusal is a model error, neither retried nor counted as unavailability"


async def test_the_runs_usage_counts_a_plan_that_did_not_fit_and_a_failed_proposal(
    stub: pb_grpc.OrchestratorServiceStub,
) -> None:
    # Review: tokens of an answer that failed validation were dropped (the supervisor's,
    # the memory proposer's), so the run's usage under-counted what the server billed.
    async with OpenAITestServer() as model_server:
        model_server.script(
            Reply(text="not a plan", usage=(100, 20)),
            Reply(text="Tea.", usage=(10, 5)),
            Reply(text="no proposals either", usage=(7, 2)),
        )
        request = group_turn("Remember that I like tea.", model_server, "usage-1")
        events = await collect(stub.StartRun(request))
    plan = of_kind(events, "plan_created")[0].plan_created
    assert plan.source == epb.PLAN_SOURCE_FALLBACK
    completed = of_kind(events, "run_completed")[0].run_completed
    assert (completed.usage.input_tokens, completed.usage.output_tokens) == (117, 27)


async def test_the_schemas_sent_hold_member_and_reply_ids_to_the_snapshots(
    stub: pb_grpc.OrchestratorServiceStub,
) -> None:
    # Outside testing (SmolLM2 on llama-server): under a grammar that let any string
    # through, plans named "Kai, Lin", "user" or 64-digit numbers, and memory proposals
    # listed reply ids "#1" to "#53" until the token cap, failing every turn.
    plan = {"steps": [{"member_id": "b", "task": "Say which tea."}], "converged": True}
    async with OpenAITestServer() as model_server:
        model_server.script(
            Reply(text=json.dumps(plan)),
            Reply(text="Oolong."),
            Reply(text=json.dumps({"proposals": []})),
        )
        request = group_turn("Remember that I like tea. Which one?", model_server, "enum-1")
        events = await collect(stub.StartRun(request))
    assert [f.member_id for f in finals(events)] == ["b"]
    schemas = [
        r.body["response_format"]["json_schema"]["schema"]
        for r in model_server.requests
        if (r.body.get("response_format") or {}).get("type") == "json_schema"
    ]
    planned, proposed = schemas
    step = planned["properties"]["steps"]["items"]["properties"]
    assert step["member_id"]["enum"] == ["a", "b"]
    proposal = proposed["properties"]["proposals"]["items"]["properties"]
    assert proposal["member_id"]["enum"] == ["a", "b"]
    assert proposal["evidence_reply_ids"]["items"]["enum"] == ["enum-1#0", "user"]
    # Each at most once: held to real ids, SmolLM2 still wrote them over and over.
    assert proposal["evidence_reply_ids"]["maxItems"] == 2
    assert "maxItems" not in planned["properties"]["steps"], "steps are bounded elsewhere"
    # The schema said in the prompt is the same, and the cached one is left as it was.
    assert '"enum": ["a", "b"]' in str(model_server.requests[0].messages[0]["content"])
    cached = portable_schema(SupervisorPlan)["properties"]["steps"]["items"]["properties"]
    assert "enum" not in cached["member_id"]


async def test_a_plan_streamed_at_a_steady_pace_longer_than_its_timeout_is_not_cut(
    stub: pb_grpc.OrchestratorServiceStub,
) -> None:
    # Outside testing: structured calls were sent streamed but timed whole, so a plan at 40
    # tokens a second past timeout_ms was cut three times and the discussion fell back.
    plan = json.dumps({"steps": [{"member_id": "b", "task": "Say which tea."}], "converged": True})
    pieces = [plan[i : i + 2] for i in range(0, len(plan), 2)]
    async with OpenAITestServer() as model_server:
        model_server.script(
            Reply(text=plan, chunks=pieces, token_delay_s=0.025),
            Reply(text="Oolong."),
            Reply(text=json.dumps({"proposals": []})),
        )
        ref = refusing_ref(model_server.base_url)
        ref.timeout_ms = 300
        request = start_request(
            "Which tea?",
            members=[member("a", "Alice"), member("b", "Bob")],
            default_model=ref,
            run_id="paced-1",
        )
        began = time.monotonic()
        events = await collect(stub.StartRun(request))
        took = time.monotonic() - began
    assert len(pieces) * 0.025 > 0.6, "the plan takes more than twice its timeout"
    assert took > 0.6, "the plan streamed past its timeout and was not cut"
    created = of_kind(events, "plan_created")[0].plan_created
    assert created.source == epb.PLAN_SOURCE_SUPERVISOR, created.fallback_reason
    assert [f.member_id for f in finals(events)] == ["b"]
