"""Speakers and plans at their edges: attempts counted, count-off replacement after a
failure, supervisor plans that cannot be followed, single chat (found by review)."""

from __future__ import annotations

import grpc
from roundtable.domain.errors import ModelUnavailable
from roundtable.domain.events import TokenUsage
from roundtable.graph.nodes.propose_memory import MemoryProposals
from roundtable.graph.nodes.supervisor import SupervisorPlan, SupervisorStep
from roundtable.models.base import ChatResult
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, member, model_ref, of_kind, start_request
from support.scripted import ScriptedProvider


async def run(address: str, request) -> list[epb.RunEvent]:
    async with grpc.aio.insecure_channel(address) as channel:
        return await collect(pb_grpc.OrchestratorServiceStub(channel).StartRun(request))


class Flaky:
    """Fails the first `fails` calls with a 5xx, then answers; `first` is said first."""

    def __init__(self, fails: int, *, first: str = "") -> None:
        self.fails, self.first, self.calls = fails, first, 0

    async def complete(self, target, call, *, api_key, on_text) -> ChatResult:
        self.calls += 1
        if self.first and self.calls == 1:
            return ChatResult(text=self.first, usage=TokenUsage(10, 1), model="flaky/m")
        if self.calls <= self.fails:
            raise ModelUnavailable("503")
        return ChatResult(text="fine", usage=TokenUsage(10, 1), model="flaky/m")


async def test_attempts_count_every_model_call(start_server) -> None:
    down, flaky = Flaky(fails=100), Flaky(fails=2)
    async with start_server(providers={"down": down, "flaky": flaky}) as server:
        failed_events = await run(
            server.address,
            start_request("@Alice hi", members=[member("a", "Alice", model=model_ref("down"))]),
        )
        final_events = await run(
            server.address,
            start_request("@Alice hi", members=[member("a", "Alice", model=model_ref("flaky"))]),
        )
    (failed,) = [e.speaker_failed for e in of_kind(failed_events, "speaker_failed")]
    assert failed.attempts == down.calls == 3, "one call and the harness's two retries"
    (final,) = finals(final_events)
    assert final.attempts == flaky.calls == 3


async def test_a_count_off_whose_re_ask_fails_still_says_its_number(start_server) -> None:
    # The member said 7 (wrong), and asking again met a server that is down: the count-off
    # gets the bare number, as for a reply still wrong after the re-asks.
    wrong_then_down = Flaky(fails=100, first="7")
    async with start_server(providers={"w": wrong_then_down}) as server:
        roster = [member("a", "A", model=model_ref("w"))]
        events = await run(server.address, start_request("报数", members=roster))
    (final,) = finals(events)
    assert final.content == "1" and final.finish_reason == epb.FINISH_REASON_REPLACED
    assert not of_kind(events, "speaker_failed")


def _director(plan: SupervisorPlan):
    def decide(call, schema):
        return MemoryProposals() if schema is MemoryProposals else plan

    return decide


async def test_a_plan_naming_a_member_twice_or_a_blank_task_falls_back(start_server) -> None:
    for steps, reason in (
        (
            [
                SupervisorStep(member_id="b", task="Open."),
                SupervisorStep(member_id="b", task="Close."),
            ],
            "invalid_plan: duplicate member b",
        ),
        ([SupervisorStep(member_id="b", task="   ")], "invalid_plan: blank task for b"),
    ):
        model = ScriptedProvider(
            reply=lambda call, attempt: "ok",
            plan=_director(SupervisorPlan(steps=steps, converged=True)),
        )
        async with start_server(providers={"scripted": model}) as server:
            events = await run(
                server.address,
                start_request("what tea?", default_model=model_ref("scripted", "director")),
            )
        plan = of_kind(events, "plan_created")[0].plan_created
        assert plan.source == epb.PLAN_SOURCE_FALLBACK and plan.fallback_reason == reason


async def test_a_single_chat_is_one_to_one(start_server) -> None:
    model = ScriptedProvider(reply=lambda call, attempt: "hello")
    roster = [
        member("a", "Alice", "Secret persona of Alice", model=model_ref("scripted")),
        member("b", "Bob", "Bob's persona", model=model_ref("scripted")),
    ]
    single = dict(kind=spb.SESSION_KIND_SINGLE, primary="b", members=roster)
    async with start_server(providers={"scripted": model}) as server:
        events = await run(server.address, start_request("hello", **single))
        go_on = await run(
            server.address, start_request("ok, please go on", thread_id="fresh", **single)
        )
    assert [f.member_id for f in finals(events)] == ["b"]
    system = model.seen[0].call.messages[0].content
    assert "group chat" not in system and "Alice" not in system
    # "go on" with nothing stopped to continue is a message to answer, in a single chat.
    assert [f.member_id for f in finals(go_on)] == ["b"]
