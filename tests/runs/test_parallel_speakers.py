"""Parallel speakers (SPEAKER_CONCURRENCY_PARALLEL) over a real server, on both stores:
what a gateway sees on the stream when a round's independent speakers answer at once.

Members' speeds come from the offline model's `latency_ms` knob (a slow first member, a
fast last one), so the order of events proves what ran at once: every speaker of a group
starts before any finishes, and the fast one's final comes before the slow one's.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import (
    collect,
    finals,
    kinds,
    last_execution,
    member,
    model_ref,
    of_kind,
    read_until,
    start_request,
)
from support.scripted import ScriptedProvider

PARALLEL = spb.SPEAKER_CONCURRENCY_PARALLEL


def offline(latency_ms: int, extra: str = "") -> spb.ModelRef:
    return model_ref("offline", "m", base_url=f"offline:?latency_ms={latency_ms}{extra}")


def roster(*latencies_ms: int, fail: str = "") -> list[spb.Member]:
    """Members a, b, c, ... answering after the given latencies (`fail`: their ids fail)."""
    out = []
    for i, latency in enumerate(latencies_ms):
        member_id = chr(ord("a") + i)
        extra = "&fail=error" if member_id in fail else ""
        out.append(member(member_id, member_id.upper() * 3, model=offline(latency, extra)))
    return out


def parallel_request(text: str, members: list[spb.Member], run_id: str, **budgets: int):
    request = start_request(
        text,
        members=members,
        run_id=run_id,
        thread_id=f"t-{run_id}",
        budgets=spb.Budgets(**budgets) if budgets else None,
    )
    request.snapshot.session.speaker_concurrency = PARALLEL
    return request


def in_flight_peak(events: list[epb.RunEvent]) -> int:
    """The most speakers answering at once, read from the stream."""
    answering: set[str] = set()
    peak = 0
    for e in events:
        kind = e.WhichOneof("payload")
        if kind == "speaker_started":
            answering.add(e.speaker_started.reply_id)
        elif kind in ("assistant_final", "speaker_failed"):
            answering.discard(getattr(e, kind).reply_id)
        peak = max(peak, len(answering))
    return peak


async def test_an_all_turn_starts_every_speaker_at_once_and_sends_each_final_when_ready(
    stub: pb_grpc.OrchestratorServiceStub,
) -> None:
    request = parallel_request("@all what do you think?", roster(600, 300, 150, 20), "par-all")
    events = await collect(stub.StartRun(request))
    plan = of_kind(events, "plan_created")[0].plan_created
    assert [s.member_id for s in plan.steps] == ["a", "b", "c", "d"]
    assert {s.parallel_group for s in plan.steps} == {1}
    order = kinds(events)
    assert order[:2] == ["run_started", "plan_created"]
    first_final = order.index("assistant_final")
    assert order[2:first_final] == ["speaker_started"] * 4, "all four start before any ends"
    # The fast last member's final comes first; nothing finished waited for the slow one.
    assert [f.member_id for f in finals(events)] == ["d", "c", "b", "a"]
    done = events[-1].run_completed
    assert [r.reply_id for r in done.replies] == [s.reply_id for s in plan.steps], "plan order"
    # Every event carries what a client needs to render speakers side by side.
    for e in of_kind(events, "assistant_delta"):
        assert e.assistant_delta.reply_id in {s.reply_id for s in plan.steps}


async def test_parallel_speakers_see_the_history_but_not_each_other(start_server) -> None:
    provider = ScriptedProvider(reply=lambda call, attempt: f"reply after {len(call.messages)}")
    members = [member(m, m.upper(), model=model_ref("scripted")) for m in "abc"]
    async with (
        start_server(providers={"scripted": provider}) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        events = await collect(stub.StartRun(parallel_request("@all hi", members, "par-see")))
    assert events[-1].WhichOneof("payload") == "run_completed"
    prompts = ["\n".join(m.content for m in s.call.messages) for s in provider.seen]
    for prompt in prompts:
        assert "reply after" not in prompt, "no parallel speaker sees another's reply"


async def test_a_count_off_keeps_its_numbers_whatever_finishes_first(
    stub: pb_grpc.OrchestratorServiceStub,
) -> None:
    request = parallel_request("大家报数！", roster(500, 20, 250, 60), "par-count")
    events = await collect(stub.StartRun(request))
    numbers = {f.member_id: f.content for f in finals(events)}
    assert numbers == {"a": "1!", "b": "2!", "c": "3!", "d": "4!"}
    assert finals(events)[0].member_id == "b", "the fastest finished first"
    steps = of_kind(events, "plan_created")[0].plan_created.steps
    assert [(s.member_id, s.count_off_number) for s in steps] == [
        ("a", 1),
        ("b", 2),
        ("c", 3),
        ("d", 4),
    ]


async def test_a_failing_speaker_fails_alone(stub: pb_grpc.OrchestratorServiceStub) -> None:
    request = parallel_request("@all go", roster(100, 50, 100, fail="b"), "par-fail")
    events = await collect(stub.StartRun(request))
    assert [e.speaker_failed.member_id for e in of_kind(events, "speaker_failed")] == ["b"]
    assert sorted(f.member_id for f in finals(events)) == ["a", "c"]
    assert events[-1].WhichOneof("payload") == "run_completed"


async def test_budgets_bound_the_speakers_and_how_many_answer_at_once(
    stub: pb_grpc.OrchestratorServiceStub,
) -> None:
    request = parallel_request(
        "@all go",
        roster(200, 150, 100, 50, 20),
        "par-budget",
        max_speakers=4,
        max_parallel_speakers=2,
    )
    events = await collect(stub.StartRun(request))
    plan = of_kind(events, "plan_created")[0].plan_created
    assert len(plan.steps) == 4 and "cut to max_speakers" in plan.fallback_reason
    assert len(finals(events)) == 4
    assert in_flight_peak(events) == 2


@pytest.mark.parametrize(
    ("budgets", "field"),
    [
        (spb.Budgets(max_parallel_speakers=17), "snapshot.session.budgets.max_parallel_speakers"),
        (None, "snapshot.session.speaker_concurrency"),
    ],
)
async def test_bad_concurrency_settings_are_invalid_argument(
    stub: pb_grpc.OrchestratorServiceStub, budgets: spb.Budgets | None, field: str
) -> None:
    request = parallel_request("@all go", roster(0, 0), f"par-bad-{field[-5:]}")
    if budgets is not None:
        request.snapshot.session.budgets.CopyFrom(budgets)
    else:
        request.snapshot.session.speaker_concurrency = 9  # type: ignore[assignment]
    call = stub.StartRun(request)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(call)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = await rpc_status.aio.from_call(call)
    fields = [
        v.field
        for d in status.details
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR)
        for v in _unpack(d).field_violations
    ]
    assert fields == [field]


def _unpack(detail) -> error_details_pb2.BadRequest:
    bad = error_details_pb2.BadRequest()
    detail.Unpack(bad)
    return bad


async def test_a_graceful_cancel_lets_the_answering_speakers_finish_and_starts_no_other(
    stub: pb_grpc.OrchestratorServiceStub,
) -> None:
    request = parallel_request(
        "@all go", roster(400, 400, 20, 20), "par-graceful", max_parallel_speakers=2
    )
    call = stub.StartRun(request)
    head = await read_until(call, lambda e: e.WhichOneof("payload") == "speaker_started")
    head += await read_until(call, lambda e: e.WhichOneof("payload") == "speaker_started")
    await stub.CancelRun(
        pb.CancelRunRequest(tenant="tenant-1", run_id="par-graceful", mode=pb.CANCEL_MODE_GRACEFUL)
    )
    events = head + await collect(call)
    assert sorted(f.member_id for f in finals(events)) == ["a", "b"], "both finished"
    assert len(of_kind(events, "speaker_started")) == 2, "c and d never started"
    cancelled = events[-1].run_cancelled
    assert [s.member_id for s in cancelled.steps_left] == ["c", "d"]
    # The same StartRun resumes: only the two left speak.
    resumed = last_execution(await collect(stub.StartRun(request)))
    assert sorted(f.member_id for f in finals(resumed)) == ["c", "d"]
    assert resumed[-1].WhichOneof("payload") == "run_completed"


async def test_an_immediate_cancel_aborts_every_speaker_and_a_resume_runs_them_once(
    stub: pb_grpc.OrchestratorServiceStub,
) -> None:
    request = parallel_request("@all go", roster(30, 800, 800, 800), "par-now")
    call = stub.StartRun(request)
    head = await read_until(call, lambda e: e.WhichOneof("payload") == "assistant_final")
    await stub.CancelRun(
        pb.CancelRunRequest(tenant="tenant-1", run_id="par-now", mode=pb.CANCEL_MODE_IMMEDIATE)
    )
    events = head + await asyncio.wait_for(collect(call), 5)
    assert [f.member_id for f in finals(events)] == ["a"]
    assert [s.member_id for s in events[-1].run_cancelled.steps_left] == ["b", "c", "d"]
    resumed = await collect(stub.StartRun(request))
    again = last_execution(resumed)
    assert sorted(f.member_id for f in finals(again)) == ["b", "c", "d"]
    every = [f.reply_id for f in finals(resumed)]
    assert len(every) == len(set(every)) == 4, "each reply final once across both executions"


async def test_a_supervisor_step_that_builds_on_the_others_waits_for_them(start_server) -> None:
    def plan(call, schema):
        return schema.model_validate(
            {
                "steps": [
                    {"member_id": "a", "task": "Say what you think."},
                    {"member_id": "b", "task": "Say what you think."},
                    {"member_id": "c", "task": "Answer both.", "builds_on_previous": True},
                ],
                "converged": True,
            }
        )

    provider = ScriptedProvider(reply=lambda call, attempt: "fine", plan=plan, token_delay_s=0.01)
    members = [member(m, m.upper(), model=model_ref("scripted")) for m in "abc"]
    async with (
        start_server(providers={"scripted": provider}) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        request = parallel_request("Should we go hiking?", members, "par-sup")
        request.snapshot.session.default_model.CopyFrom(model_ref("scripted"))
        events = await collect(stub.StartRun(request))
    steps = of_kind(events, "plan_created")[0].plan_created.steps
    assert [(s.member_id, s.parallel_group) for s in steps] == [("a", 1), ("b", 1), ("c", 2)]
    order = [
        (e.WhichOneof("payload"), getattr(e, e.WhichOneof("payload")).member_id)
        for e in events
        if e.WhichOneof("payload") in ("speaker_started", "assistant_final")
    ]
    assert order[:2] == [("speaker_started", "a"), ("speaker_started", "b")]
    assert order[-2:] == [("speaker_started", "c"), ("assistant_final", "c")]
    said = "\n".join(m.content for m in provider.seen[-1].call.messages)
    assert "fine" in said, "the step after the group sees its replies"


async def test_a_stop_turn_on_the_thread_acts_as_a_graceful_cancel(
    stub: pb_grpc.OrchestratorServiceStub,
) -> None:
    request = parallel_request(
        "@all go", roster(400, 400, 20, 20), "par-stop", max_parallel_speakers=2
    )
    call = stub.StartRun(request)
    head = await read_until(call, lambda e: e.WhichOneof("payload") == "speaker_started")
    head += await read_until(call, lambda e: e.WhichOneof("payload") == "speaker_started")
    stop = parallel_request("停止", roster(400, 400, 20, 20), "par-stop-2")
    stop.context.thread_id = request.context.thread_id
    stopped = await collect(stub.StartRun(stop))
    assert stopped[-1].WhichOneof("payload") == "run_completed", "nobody speaks in a stop turn"
    events = head + await collect(call)
    assert sorted(f.member_id for f in finals(events)) == ["a", "b"], "both finished"
    assert len(of_kind(events, "speaker_started")) == 2, "c and d never started"
    assert events[-1].run_cancelled.reason == "stop_directive"


@pytest.mark.parametrize("slow", ["AC", "A"])
async def test_a_resumed_group_keeps_its_replies_in_plan_order(start_server, slow: str) -> None:
    """The fast ones finished before the cancel, the `slow` ones after the resume: D, who
    builds on the group, reads them A, B, C as a run that never stopped does (review: B, A,
    C, or B, C, A with one speaker left: the log's replies first), and so would the next
    round's planner and the memory proposal."""

    def plan(call, schema):
        steps = [{"member_id": m, "task": "Say what you think."} for m in "abc"]
        steps.append({"member_id": "d", "task": "Answer all.", "builds_on_previous": True})
        return schema.model_validate({"steps": steps, "converged": True})

    def reply(call, attempt):
        name = call.messages[0].content.split(".")[0].removeprefix("You are ")
        return f"{name}-said " + ("slowly " * 30 if name in slow else "")

    provider = ScriptedProvider(reply=reply, plan=plan, token_delay_s=0.02)
    members = [member(m, m.upper(), model=model_ref("scripted")) for m in "abcd"]
    async with (
        start_server(providers={"scripted": provider}) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        request = parallel_request("Should we go hiking?", members, "par-order")
        request.snapshot.session.default_model.CopyFrom(model_ref("scripted"))
        call = stub.StartRun(request)
        fast = {"b", "c"} - set(slow.lower())
        done: list[str] = []

        def all_fast_ones_final(e: epb.RunEvent) -> bool:
            done.extend(f.member_id for f in finals([e]))
            return set(done) == fast

        await read_until(call, all_fast_ones_final)
        await stub.CancelRun(
            pb.CancelRunRequest(
                tenant="tenant-1", run_id="par-order", mode=pb.CANCEL_MODE_IMMEDIATE
            )
        )
        await collect(call)
        resumed = last_execution(await collect(stub.StartRun(request)))
    assert [f.member_id for f in finals(resumed)][-1] == "d"
    (d_call,) = [s.call for s in provider.seen if s.member == "D"]
    said = "\n".join(m.content for m in d_call.messages)
    assert said.index("A-said") < said.index("B-said") < said.index("C-said")
