"""A member's tool loop over a real server and a real MCP server: the per-speaker budget, a
parallel group where one speaker waits for approval, and calls the member may not make."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from roundtable.domain.events import TokenUsage
from roundtable.domain.snapshot import ModelTarget
from roundtable.models.base import ChatCall, ChatResult, ModelToolCall, TextSink
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.approvals import APPROVE, DENY, Reader, resolve, sent_key, tool_request, waiting_run
from support.builders import collect, finals, kinds, member, model_ref, of_kind
from support.mcp_server import McpServerProcess


@dataclass
class EagerTools:
    """A model that calls `tool` whenever it may, and answers once it may not."""

    tool: str = "weather"
    name: str = "eager"
    calls: list[ChatCall] = field(default_factory=list)

    async def complete(
        self, target: ModelTarget, call: ChatCall, *, api_key: str | None, on_text: TextSink | None
    ) -> ChatResult:
        self.calls.append(call)
        if call.tools:
            n = sum(1 for m in call.messages if m.role == "tool") + 1
            arguments = json.dumps({"city": f"City{n}"})
            return ChatResult(tool_calls=(ModelToolCall(f"c{n}", self.tool, arguments),))
        results = [m.content for m in call.messages if m.role == "tool"]
        return ChatResult(text=f"I looked {len(results)} times: {'; '.join(results)}")


async def run_with(start_server, provider: EagerTools, request: pb.StartRunRequest) -> list:
    """The run's events on a server that knows the `eager` provider."""
    async with (
        start_server(providers={"eager": provider}) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        return await collect(pb_grpc.OrchestratorServiceStub(channel).StartRun(request))


async def test_a_speaker_makes_at_most_its_budget_of_tool_calls_then_answers(
    start_server, mcp: McpServerProcess
) -> None:
    provider = EagerTools()
    request = tool_request("what's the weather?", mcp, "budget")
    request.snapshot.members[0].model.CopyFrom(model_ref("eager"))
    request.snapshot.session.budgets.max_tool_calls_per_speaker = 2
    events = await run_with(start_server, provider, request)
    (final,) = finals(events)
    assert [t.call_id for t in final.tool_calls] == ["budget#0/1", "budget#0/2"]
    assert "City1" in final.content and "City2" in final.content
    assert mcp.counts("weather") == {sent_key("budget", f"budget#0/{n}"): 1 for n in (1, 2)}
    last = provider.calls[-1]
    assert not last.tools, "past the budget the model is asked without tools"
    assert "used all the tool calls" in last.messages[-1].content
    assert final.attempts == 3, "three model calls made the reply"


async def test_a_call_to_a_tool_the_member_may_not_use_is_refused_without_running(
    start_server, mcp: McpServerProcess
) -> None:
    provider = EagerTools(tool="note")
    request = tool_request("what's the weather?", mcp, "not-mine")
    mei = request.snapshot.members[0]
    mei.model.CopyFrom(model_ref("eager"))
    del mei.tool_names[:]
    mei.tool_names.append("weather")  # the model asks for note anyway
    request.snapshot.session.budgets.max_tool_calls_per_speaker = 1
    events = await run_with(start_server, provider, request)
    (final,) = finals(events)
    assert [(t.tool_name, t.outcome) for t in final.tool_calls] == [
        ("note", epb.TOOL_CALL_OUTCOME_FAILED)
    ]
    assert "No tool named 'note'" in final.content
    assert mcp.counts("note") == {}
    assert not of_kind(events, "permission_required")


async def approved_once(
    start_server, provider: EagerTools, mcp: McpServerProcess, run_id: str, edited: str = ""
) -> list[epb.RunEvent]:
    """The events of a run whose model asks `provider.tool` once (budget 1), approved (with
    `edited` arguments, if any) once the run waits."""
    request = tool_request("note it", mcp, run_id)
    request.snapshot.members[0].model.CopyFrom(model_ref("eager"))
    request.snapshot.session.budgets.max_tool_calls_per_speaker = 1
    async with (
        start_server(providers={"eager": provider}) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        reader = Reader(stub.StartRun(request))
        asked = (await reader.until("permission_required")).permission_required
        await waiting_run(stub, run_id)
        decision = resolve(run_id, asked.permission_request_id, APPROVE)
        decision.edited_arguments_json = edited
        await stub.ResolvePermission(decision)
        events = await reader.end()
    assert kinds(events)[-1] == "run_completed"
    return events


async def test_the_model_hears_the_arguments_a_person_edited(
    start_server, mcp: McpServerProcess
) -> None:
    # Review: the model was shown the result as the answer to the arguments it asked
    # with, not to the person's edit the tool ran with.
    provider = EagerTools(tool="note")
    edited = json.dumps({"text": "buy oat milk"})
    await approved_once(start_server, provider, mcp, "edit-heard", edited)
    (result,) = [m.content for m in provider.calls[-1].messages if m.role == "tool"]
    assert f"it ran with {edited}" in result and f"按 {edited} 执行" in result
    assert "noted 'buy oat milk' (1)" in result


@dataclass
class CostlyTools(EagerTools):
    """EagerTools whose every answer reports 100 tokens in and 10 out."""

    async def complete(
        self, target: ModelTarget, call: ChatCall, *, api_key: str | None, on_text: TextSink | None
    ) -> ChatResult:
        result = await super().complete(target, call, api_key=api_key, on_text=on_text)
        return dataclasses.replace(result, usage=TokenUsage(100, 10))


async def test_a_reply_counts_the_tokens_its_model_spent_before_it_waited(
    start_server, mcp: McpServerProcess
) -> None:
    # Review: the turn that asked for a call needing approval was asked before the run
    # parked; the execution after the decision replays it, and its tokens were lost from
    # the reply's usage and the run's.
    provider = CostlyTools(tool="note")
    events = await approved_once(start_server, provider, mcp, "costs")
    assert len(provider.calls) == 2, "the turn before the wait was not asked again"
    (final,) = finals(events)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (200, 20)
    assert final.attempts == 2


async def test_in_a_parallel_group_the_others_finish_while_one_speaker_waits(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    request = tool_request("@all use note for buy milk", mcp, "par-wait")
    request.snapshot.session.kind = spb.SESSION_KIND_GROUP
    request.snapshot.session.speaker_concurrency = spb.SPEAKER_CONCURRENCY_PARALLEL
    request.snapshot.members.extend([member("kai", "Kai"), member("lin", "Lin")])
    reader = Reader(stub.StartRun(request))
    asked = (await reader.until("permission_required")).permission_required
    assert asked.member_id == "mei"
    run = await waiting_run(stub, "par-wait")
    # The two without tools answered; the one waiting holds the run.
    assert sorted(f.member_id for f in finals(reader.events)) == ["kai", "lin"]
    assert list(run.finished_reply_ids) == ["par-wait#1", "par-wait#2"]
    await stub.ResolvePermission(resolve("par-wait", asked.permission_request_id, APPROVE))
    events = await reader.end()
    assert kinds(events)[-1] == "run_completed"
    assert sorted(f.member_id for f in finals(events)) == ["kai", "lin", "mei"]
    assert [r.member_id for r in events[-1].run_completed.replies] == ["mei", "kai", "lin"]
    assert mcp.counts("note") == {sent_key("par-wait", asked.permission_request_id): 1}


@pytest.mark.parametrize("text", ["use weather for Paris", "用 weather 查 巴黎"])
async def test_the_offline_model_calls_a_named_tool_in_either_language(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess, text: str
) -> None:
    events = await collect(stub.StartRun(tool_request(text, mcp, f"lang-{len(text)}")))
    (final,) = finals(events)
    city = "Paris" if text.startswith("use") else "巴黎"
    assert f"Sunny, 21°C in {city}" in final.content
    quoted = "weather says" if text.startswith("use") else "weather 的结果"
    assert quoted in final.content


async def test_a_parallel_speaker_resumed_after_approval_does_not_see_its_groups_replies(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    """Lin's call is denied and Lin answers; Mei, approved later, resumes in the same group:
    parallel speakers never see each other's replies, a resumed one neither."""
    request = tool_request("@Lin @Mei use note for buy milk", mcp, "par-see")
    session = request.snapshot.session
    session.kind = spb.SESSION_KIND_GROUP
    session.speaker_concurrency = spb.SPEAKER_CONCURRENCY_PARALLEL
    request.snapshot.members.append(member("lin", "Lin", tool_names=["note"]))
    request.snapshot.user_turn.mentions.extend(["lin", "mei"])
    reader = Reader(stub.StartRun(request))
    await reader.until("permission_required")
    async with asyncio.timeout(20):
        while len(of_kind(reader.events, "permission_required")) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    asked = {
        e.permission_required.member_id: e.permission_required
        for e in reader.events
        if e.HasField("permission_required")
    }
    for who, decision in (("lin", DENY), ("mei", APPROVE)):
        reason = "不行" if who == "lin" else ""
        await stub.ResolvePermission(
            resolve("par-see", asked[who].permission_request_id, decision, reason=reason)
        )
        if who == "lin":
            async with asyncio.timeout(20):
                while not finals(reader.events):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
    events = await reader.end()
    by_member = {f.member_id: f.content for f in finals(events)}
    assert "不行" in by_member["lin"]
    assert "noted 'buy milk' (1)" in by_member["mei"]
    # The offline model answers in Chinese when its prompt holds Chinese: Lin's reply would.
    assert by_member["mei"].startswith("note says")


@dataclass
class Turns(EagerTools):
    """Asks for `slow` with the same arguments as many times in each model turn as `turns`
    says, turn after turn, then answers."""

    turns: tuple[int, ...] = (1, 1)
    seconds: float = 1.0

    async def complete(
        self, target: ModelTarget, call: ChatCall, *, api_key: str | None, on_text: TextSink | None
    ) -> ChatResult:
        self.calls.append(call)
        if len(self.calls) > len(self.turns):
            return ChatResult(text="I could not tell whether it ran.")
        arguments = json.dumps({"seconds": self.seconds})
        asked = range(self.turns[len(self.calls) - 1])
        calls = tuple(ModelToolCall(f"s{len(self.calls)}-{i}", "slow", arguments) for i in asked)
        return ChatResult(tool_calls=calls)


def slow_tool_request(mcp: McpServerProcess, run_id: str, **declared: Any) -> pb.StartRunRequest:
    """`tool_request` whose member may also call `slow`, declared as `declared` says."""
    request = tool_request("do the slow thing", mcp, run_id)
    mei = request.snapshot.members[0]
    mei.model.CopyFrom(model_ref("eager"))
    mei.tool_names.append("slow")
    request.snapshot.session.tools.add(
        name="slow",
        description="Takes its time.",
        input_schema_json=json.dumps({"type": "object"}),
        server_id="local",
        **declared,
    )
    request.snapshot.session.budgets.max_tool_calls_per_speaker = 8
    return request


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_write_that_timed_out_is_said_to_maybe_have_run_and_goes_again_under_its_key(
    start_server, mcp: McpServerProcess, read_only: bool
) -> None:
    # Review: a write tool that timed out was told to the model as "could not be run"; the
    # model asked again, the call went under a new key, and the write ran twice.
    run_id = f"write-timeout-{read_only}"
    request = slow_tool_request(mcp, run_id, read_only=read_only, timeout_ms=200)
    provider = Turns(turns=(1, 1))
    events = await run_with(start_server, provider, request)

    (final,) = finals(events)
    told = [m.content for m in provider.calls[-1].messages if m.role == "tool"]
    assert len(told) == 2
    keys = mcp.counts("slow")
    if read_only:
        assert all("could not be run" in t for t in told)
        assert sum(keys.values()) >= 2  # a read is retried as it likes, under its own keys
    else:
        assert all("it may have run" in t and "可能已经执行" in t for t in told)
        assert keys == {sent_key(run_id, f"{run_id}#0/1"): 2}, "the second went as the first"
    assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_FAILED] * 2


@pytest.mark.parametrize(
    ("turns", "keys"),
    [
        # Asked again after the failure: the first one's key; again after that one ran:
        # its own key (a write made again on purpose runs again).
        ((1, 1, 1), {"#0/1": 1, "#0/3": 1}),
        # Asked twice in one model turn, before the model heard of the failure: two calls.
        ((2,), {"#0/2": 1}),
    ],
    ids=["after-it-ran", "same-turn"],
)
async def test_a_write_goes_under_a_new_key_once_the_one_it_repeats_was_answered(
    start_server, mcp: McpServerProcess, turns: tuple[int, ...], keys: dict[str, int]
) -> None:
    # Review of the above: the first timed-out call's key was reused for good, so a write
    # made again on purpose after one that ran got the cached answer and never ran; and two
    # calls of one model turn shared a key though the model had heard nothing yet.
    run_id = f"write-again-{len(turns)}"
    request = slow_tool_request(mcp, run_id, timeout_ms=5000)
    mcp.fault(503)  # the first call fails: it may have run
    provider = Turns(turns=turns, seconds=0)
    await run_with(start_server, provider, request)

    told = [m.content for m in provider.calls[-1].messages if m.role == "tool"]
    assert "it may have run" in told[0] and "(TOOL_UNAVAILABLE)" in told[0]
    assert told[1:] == ["slept 0"] * (sum(turns) - 1)
    assert mcp.counts("slow") == {sent_key(run_id, run_id + k): n for k, n in keys.items()}


@dataclass
class NotJson(EagerTools):
    """Calls `tool` with arguments Python's json reads and JSON does not have."""

    async def complete(
        self, target: ModelTarget, call: ChatCall, *, api_key: str | None, on_text: TextSink | None
    ) -> ChatResult:
        self.calls.append(call)
        if len(self.calls) == 1:
            arguments = '{"text": "x", "n": NaN, "city": "Paris"}'
            return ChatResult(tool_calls=(ModelToolCall("c1", self.tool, arguments),))
        return ChatResult(text="done")


async def test_arguments_with_nan_are_no_json_object_in_events_nor_to_the_tool(
    start_server, mcp: McpServerProcess
) -> None:
    # Outside testing: NaN reached the permission request's Struct, which no gateway can
    # print as JSON (protobuf's own json_format refuses it), and a read tool ran with it.
    for tool, run_id in (("note", "nan-approval"), ("weather", "nan-read")):
        provider = NotJson(tool=tool)
        request = tool_request("do it", mcp, run_id)
        request.snapshot.members[0].model.CopyFrom(model_ref("eager"))
        async with (
            start_server(providers={"eager": provider}) as server,
            grpc.aio.insecure_channel(server.address) as channel,
        ):
            stub = pb_grpc.OrchestratorServiceStub(channel)
            reader = Reader(stub.StartRun(request))
            if tool == "note":
                asked = (await reader.until("permission_required")).permission_required
                assert asked.arguments_json.startswith('{"text": "x", "n": NaN')
                assert not asked.HasField("arguments")
                run = (await stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant="tenant-1"))).run
                json_format.MessageToJson(run)  # printable as JSON
                await stub.ResolvePermission(resolve(run_id, asked.permission_request_id, APPROVE))
            events = await reader.end()
        (final,) = finals(events)
        assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_FAILED]
        told = [m.content for m in provider.calls[-1].messages if m.role == "tool"]
        assert told and "not a JSON object" in told[0]
    assert mcp.counts("note") == {} and mcp.counts("weather") == {}
