"""Durable runs over a real server: cancel, continue, resume, re-attach, busy threads."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import grpc
import pytest
from roundtable.api.convert import legacy_fingerprint, run_request_from_proto
from roundtable.api.limits import RequestLimits
from roundtable.domain.snapshot import Budgets
from roundtable.store.base import RunRecord, RunStatus, StoredEvent
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.approvals import reason_of
from support.builders import (
    collect,
    finals,
    kinds,
    last_execution,
    member,
    of_kind,
    read_until,
    start_request,
)

SLOW = spb.ModelRef(
    target=spb.ModelTarget(provider="offline", model="slow", base_url="offline:?token_delay_ms=15")
)


def slow_roster(n: int = 4) -> list[spb.Member]:
    names = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank"]
    return [
        member(chr(ord("a") + i), names[i], f"Member {names[i]}.", model=SLOW) for i in range(n)
    ]


def slow_request(text: str = "@all how was your day?", **kwargs) -> pb.StartRunRequest:
    return start_request(text, members=slow_roster(kwargs.pop("n", 4)), **kwargs)


def is_started(step: int):
    return lambda e: e.WhichOneof("payload") == "speaker_started" and e.speaker_started.step == step


def is_delta_of(reply_id: str):
    return lambda e: (
        e.WhichOneof("payload") == "assistant_delta" and e.assistant_delta.reply_id == reply_id
    )


async def left_behind(
    server, run_id: str, thread: str, fingerprint: str, status: RunStatus, last_seq: int = 0
) -> None:
    """A registry row as a process that died (or a stop) left it, written straight in."""
    now = time.time()
    assert await server.store.create_run(
        RunRecord(
            tenant="tenant-1",
            run_id=run_id,
            thread_id=thread,
            fingerprint=fingerprint,
            status=status,
            created_at=now,
            updated_at=now,
            last_seq=last_seq,
        )
    )


async def get_status(stub, run_id: str, tenant: str = "tenant-1") -> int:
    return (await stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant=tenant))).run.status


async def test_graceful_cancel_finishes_the_speaker_then_continue_resumes(stub) -> None:
    request = slow_request(run_id="grace-1", thread_id="t-grace")
    call = stub.StartRun(request)
    events = await read_until(call, is_started(1))
    answer = await stub.CancelRun(pb.CancelRunRequest(run_id="grace-1", tenant="tenant-1"))
    assert answer.outcome == pb.CANCEL_OUTCOME_REQUESTED
    events += await collect(call)

    got = finals(events)
    assert [f.member_id for f in got] == ["a", "b"], "speaker 2 finished its reply"
    assert not [e for e in of_kind(events, "speaker_started") if e.speaker_started.step >= 2]
    cancelled = of_kind(events, "run_cancelled")[0].run_cancelled
    assert list(cancelled.finished_reply_ids) == ["grace-1#0", "grace-1#1"]
    assert [s.reply_id for s in cancelled.steps_left] == ["grace-1#2", "grace-1#3"]
    assert await get_status(stub, "grace-1") == pb.RUN_STATUS_CANCELLED

    # "继续" on the same thread speaks the steps left, with their original reply ids, about
    # what the stopped run was answering (outside testing: they answered "继续" itself;
    # review: not the question a later turn asked).
    continued = slow_request("继续", run_id="grace-2", thread_id="t-grace")
    history = continued.snapshot.history
    history.add(role=spb.MESSAGE_ROLE_USER, content=request.snapshot.user_turn.text)
    for final in got:
        history.add(
            role=spb.MESSAGE_ROLE_ASSISTANT, member_id=final.member_id, content=final.content
        )
    history.add(role=spb.MESSAGE_ROLE_USER, content="@a what is 2+2?")
    history.add(role=spb.MESSAGE_ROLE_ASSISTANT, member_id="a", content="4")
    more = await collect(stub.StartRun(continued))
    plan = of_kind(more, "plan_created")[0].plan_created
    assert plan.source == epb.PLAN_SOURCE_CONTINUED and plan.continued_run_id == "grace-1"
    assert [f.reply_id for f in finals(more)] == ["grace-1#2", "grace-1#3"]
    assert [f.member_id for f in finals(more)] == ["c", "d"]
    assert all("how was your day?" in f.content for f in finals(more)), finals(more)
    assert await get_status(stub, "grace-1") == pb.RUN_STATUS_CONTINUED
    # Its run_cancelled says "send the same StartRun": that, or a StreamRun, now replays its
    # log and says it was continued (outside testing: both ended OK, so a gateway following
    # the advice got the cancel again, never told the run could not go on).
    for call in (
        stub.StartRun(request),
        stub.StreamRun(pb.StreamRunRequest(run_id="grace-1", tenant="tenant-1")),
    ):
        replayed: list[epb.RunEvent] = []
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for event in call:
                replayed.append(event.event)
        assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(ended.value) == "RUN_CONTINUED"
        assert kinds(replayed)[-1] == "run_cancelled"
    earlier = await stub.GetRun(pb.GetRunRequest(run_id="grace-1", tenant="tenant-1"))
    assert earlier.run.continued_by_run_id == "grace-2"
    # It cannot be continued twice: the next continue finds nothing.
    again = await collect(
        stub.StartRun(slow_request("继续", run_id="grace-3", thread_id="t-grace"))
    )
    assert of_kind(again, "plan_created")[0].plan_created.fallback_reason == "nothing to continue"


async def test_a_graceful_cancel_during_the_last_speaker_asks_for_no_memory_proposal(
    stub,
) -> None:
    # Review: the memory proposal's model call ran after the stop (no speaker follows the
    # last one). The plan finished, so the run completes, but nothing more is asked.
    text = "@all remember that I like green tea"
    for run_id, cancel in (("mem-1", False), ("mem-2", True)):
        call = stub.StartRun(slow_request(text, run_id=run_id, thread_id=run_id, n=2))
        events = await read_until(call, is_started(1))
        if cancel:
            answer = await stub.CancelRun(pb.CancelRunRequest(run_id=run_id, tenant="tenant-1"))
            assert answer.outcome == pb.CANCEL_OUTCOME_REQUESTED
        events += await collect(call)
        assert [f.member_id for f in finals(events)] == ["a", "b"]
        assert kinds(events)[-1] == "run_completed"
        assert bool(of_kind(events, "memory_proposed")) is not cancel, kinds(events)


async def test_a_drain_during_the_last_speaker_still_asks_for_the_memory_proposal(
    start_server,
) -> None:
    # Review: a shutdown's stop skipped the proposal like a person's, and the run completed,
    # so no later StartRun proposed it. Nobody stopped the run: the grace lets it finish.
    text = "@all remember that I like green tea"
    async with start_server(grace_seconds=5.0) as server:
        channel = grpc.aio.insecure_channel(server.address)
        call = pb_grpc.OrchestratorServiceStub(channel).StartRun(
            slow_request(text, run_id="dm-1", thread_id="t-dm", n=2)
        )
        events = await read_until(call, is_started(1))
        rest = asyncio.create_task(collect(call))
    events += await asyncio.wait_for(rest, 10)  # the server drained on the way out
    await channel.close()
    assert kinds(events)[-1] == "run_completed"
    assert of_kind(events, "memory_proposed")


async def test_a_continue_turn_proposes_the_memories_of_the_words_it_answers(stub) -> None:
    # Outside testing: stop, then continue, proposed nothing (the continue turn's words are
    # "继续"); resuming the same run instead proposed them.
    text = "@all remember that I like oolong"
    call = stub.StartRun(slow_request(text, run_id="cm-1", thread_id="t-cm"))
    await read_until(call, is_started(1))
    await collect(stub.StartRun(slow_request("停止", run_id="cm-2", thread_id="t-cm")))
    stopped = await collect(call)
    assert kinds(stopped)[-1] == "run_cancelled" and not of_kind(stopped, "memory_proposed")
    continued = slow_request("继续", run_id="cm-3", thread_id="t-cm")
    continued.snapshot.history.add(role=spb.MESSAGE_ROLE_USER, content=text)
    more = await collect(stub.StartRun(continued))
    assert of_kind(more, "plan_created")[0].plan_created.continued_run_id == "cm-1"
    (proposed,) = of_kind(more, "memory_proposed")
    assert {p.content for p in proposed.memory_proposed.proposals} == {"I like oolong"}


async def test_immediate_cancel_drops_the_partial_reply_and_resume_redoes_it(stub) -> None:
    request = slow_request(run_id="now-1", thread_id="t-now")
    call = stub.StartRun(request)
    first = await read_until(call, is_delta_of("now-1#1"))
    await stub.CancelRun(
        pb.CancelRunRequest(run_id="now-1", tenant="tenant-1", mode=pb.CANCEL_MODE_IMMEDIATE)
    )
    first += await collect(call)
    assert [f.reply_id for f in finals(first)] == ["now-1#0"], "the partial reply is never final"
    cancelled = of_kind(first, "run_cancelled")[0].run_cancelled
    assert [s.reply_id for s in cancelled.steps_left] == ["now-1#1", "now-1#2", "now-1#3"]

    # The same StartRun again resumes: no new plan, speaker 2 speaks again, 1 is not repeated.
    # Its stream is the run's log from seq 1: the first execution, then the second.
    stream = await collect(stub.StartRun(request))
    second = last_execution(stream)
    durable_first = [e for e in first if e.WhichOneof("payload") != "assistant_delta"]
    assert stream[: len(stream) - len(second)] == durable_first
    assert second[0].run_started.resumed
    assert not of_kind(second, "plan_created")
    assert [e.speaker_started.step for e in of_kind(second, "speaker_started")] == [1, 2, 3]
    both = Counter(f.reply_id for f in finals(first + second))
    assert both == Counter({f"now-1#{i}": 1 for i in range(4)})
    assert second[0].seq == first[-1].seq + 1, "seq goes on across executions"
    assert await get_status(stub, "now-1") == pb.RUN_STATUS_SUCCEEDED

    # Once more, it replays the same log: each execution from its run_started to its
    # terminal event, the stream ending after the last one.
    replay = await collect(stub.StartRun(request))
    assert replay == [e for e in stream if e.WhichOneof("payload") != "assistant_delta"]
    edges = {"run_started", "run_cancelled", "run_completed"}
    assert [k for k in kinds(replay) if k in edges] == [
        "run_started",
        "run_cancelled",
        "run_started",
        "run_completed",
    ]
    assert [e.run_started.resumed for e in of_kind(replay, "run_started")] == [False, True]


async def test_stream_run_after_a_dropped_connection_delivers_everything_once(server) -> None:
    request = slow_request(run_id="drop-1", thread_id="t-drop")
    async with grpc.aio.insecure_channel(server.address) as channel:
        from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc

        stub = pb_grpc.OrchestratorServiceStub(channel)
        call = stub.StartRun(request)
        seen = await read_until(call, is_started(1))
        call.cancel()  # the gateway's connection drops mid-run
    last = max(e.seq for e in seen)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.OrchestratorServiceStub(channel)
        rest = await collect(
            stub.StreamRun(pb.StreamRunRequest(run_id="drop-1", tenant="tenant-1", after_seq=last))
        )
        durable = [e for e in seen + rest if e.WhichOneof("payload") != "assistant_delta"]
        assert [e.seq for e in durable] == list(range(1, len(durable) + 1))
        assert [f.reply_id for f in finals(durable)] == [f"drop-1#{i}" for i in range(4)]
        assert kinds(durable)[-1] == "run_completed"
        # A full replay from 0 gives the same events, same seq.
        replay = await collect(
            stub.StreamRun(pb.StreamRunRequest(run_id="drop-1", tenant="tenant-1"))
        )
        assert [e.SerializeToString() for e in replay] == [e.SerializeToString() for e in durable]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(
                stub.StreamRun(
                    pb.StreamRunRequest(run_id="drop-1", tenant="tenant-1", after_seq=999)
                )
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_dropped_stream_with_policy_cancel_stops_the_run(server, stub) -> None:
    options = pb.RunOptions(disconnect_policy=pb.DISCONNECT_POLICY_CANCEL)
    request = slow_request(run_id="dropc-1", thread_id="t-dropc", options=options)
    call = stub.StartRun(request)
    await read_until(call, is_started(0))
    call.cancel()
    rest = await collect(stub.StreamRun(pb.StreamRunRequest(run_id="dropc-1", tenant="tenant-1")))
    cancelled = of_kind(rest, "run_cancelled")[0].run_cancelled
    assert cancelled.reason == "stream_dropped"
    assert list(cancelled.finished_reply_ids) == ["dropc-1#0"]


async def test_busy_thread_reject(stub) -> None:
    call = stub.StartRun(slow_request(run_id="busy-1", thread_id="t-busy"))
    await read_until(call, is_started(0))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub.StartRun(slow_request(run_id="busy-2", thread_id="t-busy")))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.GetRun(pb.GetRunRequest(run_id="busy-2", tenant="tenant-1"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND, "a rejected run leaves no trace"
    await collect(call)


async def test_busy_thread_interrupt(stub) -> None:
    first = stub.StartRun(slow_request(run_id="int-1", thread_id="t-int"))
    events = await read_until(first, is_started(1))
    options = pb.RunOptions(busy_thread_policy=pb.BUSY_THREAD_POLICY_INTERRUPT)
    second = await collect(
        stub.StartRun(slow_request("@Dave hi", run_id="int-2", thread_id="t-int", options=options))
    )
    events += await collect(first)
    assert of_kind(events, "run_cancelled")[0].run_cancelled.reason == "interrupted_by_new_run"
    assert [f.member_id for f in finals(events)] == ["a", "b"]
    assert [f.member_id for f in finals(second)] == ["d"]


async def test_busy_thread_enqueue(stub) -> None:
    first = stub.StartRun(slow_request(run_id="q-1", thread_id="t-q", n=2))
    await read_until(first, is_started(0))
    options = pb.RunOptions(busy_thread_policy=pb.BUSY_THREAD_POLICY_ENQUEUE)
    second = stub.StartRun(
        slow_request("@Bob hi", run_id="q-2", thread_id="t-q", options=options, n=2)
    )
    await asyncio.sleep(0.05)
    assert await get_status(stub, "q-2") == pb.RUN_STATUS_QUEUED
    first_events = await collect(first)
    second_events = await collect(second)
    assert kinds(first_events)[-1] == "run_completed"
    assert [f.member_id for f in finals(second_events)] == ["b"]
    assert (
        second_events[0].emitted_at.ToNanoseconds() >= first_events[-1].emitted_at.ToNanoseconds()
    )


@pytest.mark.parametrize("words", ["停止", "好了，停止", "ok, stop"])
async def test_stop_turn_stops_the_live_run_whatever_the_policy(stub, words: str) -> None:
    live = stub.StartRun(slow_request(run_id="st-1", thread_id="t-stop"))
    events = await read_until(live, is_started(1))
    stop = await collect(stub.StartRun(slow_request(words, run_id="st-2", thread_id="t-stop")))
    assert kinds(stop) == ["run_started", "plan_created", "run_completed"]
    events += await collect(live)
    assert of_kind(events, "run_cancelled")[0].run_cancelled.reason == "stop_directive"
    assert [f.member_id for f in finals(events)] == ["a", "b"]


async def test_a_resumed_run_whose_logged_plan_is_empty_does_not_plan_again(server, stub) -> None:
    # A stop turn (its plan has no step) whose process died after logging its plan.
    request = slow_request("停止", run_id="ep-1", thread_id="t-ep")
    fingerprint = run_request_from_proto(
        request, limits=RequestLimits(), defaults=Budgets()
    ).fingerprint
    await left_behind(server, "ep-1", "t-ep", fingerprint, RunStatus.INTERRUPTED, last_seq=2)
    logged = [
        epb.RunEvent(run_id="ep-1", seq=1, run_started=epb.RunStarted(route=epb.ROUTE_GROUP)),
        epb.RunEvent(
            run_id="ep-1",
            seq=2,
            plan_created=epb.PlanCreated(directive=epb.DIRECTIVE_KIND_STOP, round=1),
        ),
    ]
    for event in logged:
        kind = event.WhichOneof("payload")
        stored = StoredEvent(event.seq, kind, event.SerializeToString())
        await server.store.append_event("tenant-1", "ep-1", stored)

    stream = await collect(stub.StartRun(request))
    resumed = last_execution(stream)
    assert resumed[0].run_started.resumed
    assert kinds(resumed) == ["run_started", "run_completed"], "its plan is not announced twice"


async def test_cancel_of_a_finished_run_changes_nothing(stub) -> None:
    await collect(stub.StartRun(start_request("报数", run_id="done-1")))
    answer = await stub.CancelRun(pb.CancelRunRequest(run_id="done-1", tenant="tenant-1"))
    assert answer.outcome == pb.CANCEL_OUTCOME_ALREADY_ENDED
    assert answer.run.status == pb.RUN_STATUS_SUCCEEDED
    assert len(answer.run.finished_reply_ids) == 4
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CancelRun(pb.CancelRunRequest(run_id="nope", tenant="tenant-1"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("claimed", [True, False], ids=["after-its-claim", "before-its-claim"])
async def test_a_continue_turn_that_died_before_its_plan_resumes_with_the_steps_left(
    server, stub, claimed
) -> None:
    # Run A is cancelled after its first speaker: three steps are left.
    call = stub.StartRun(slow_request(run_id="cw-a", thread_id="t-cw"))
    await read_until(call, is_started(1))
    await stub.CancelRun(pb.CancelRunRequest(run_id="cw-a", tenant="tenant-1"))
    left = of_kind(await collect(call), "run_cancelled")[0].run_cancelled.steps_left
    assert len(left) >= 2

    # "继续" (run B) starts, logs run_started, and its process dies before B's plan is in the
    # log: that is what the registry and the log then hold. B claims A's steps before it
    # logs anything, so A is marked continued by B, unless B died before even that.
    request = slow_request("继续", run_id="cw-b", thread_id="t-cw")
    fingerprint = run_request_from_proto(
        request, limits=RequestLimits(), defaults=Budgets()
    ).fingerprint
    await left_behind(server, "cw-b", "t-cw", fingerprint, RunStatus.INTERRUPTED, last_seq=1)
    started = epb.RunEvent(
        run_id="cw-b", seq=1, run_started=epb.RunStarted(route=epb.ROUTE_GROUP, thread_id="t-cw")
    )
    await server.store.append_event(
        "tenant-1", "cw-b", StoredEvent(1, "run_started", started.SerializeToString())
    )
    if claimed:
        assert await server.store.claim_continuation("tenant-1", "cw-a", "cw-b")

    # The gateway retries B: it resumes and still continues A, with A's reply ids.
    stream = await collect(stub.StartRun(request))
    assert stream[0] == started, "the stream starts at seq 1, the dead execution's event"
    resumed = last_execution(stream)
    assert resumed[0].run_started.resumed
    plan = of_kind(resumed, "plan_created")[0].plan_created
    assert plan.source == epb.PLAN_SOURCE_CONTINUED and plan.continued_run_id == "cw-a"
    assert [s.reply_id for s in plan.steps] == [s.reply_id for s in left]
    assert [f.reply_id for f in finals(resumed)] == [s.reply_id for s in left]
    assert await get_status(stub, "cw-a") == pb.RUN_STATUS_CONTINUED
    assert await get_status(stub, "cw-b") == pb.RUN_STATUS_SUCCEEDED


async def test_two_continue_turns_never_take_over_the_same_steps(stub) -> None:
    # Run A is cancelled with steps left; run L is speaking on the thread.
    call = stub.StartRun(slow_request(run_id="two-a", thread_id="t-two"))
    await read_until(call, is_started(1))
    await stub.CancelRun(pb.CancelRunRequest(run_id="two-a", tenant="tenant-1"))
    left = of_kind(await collect(call), "run_cancelled")[0].run_cancelled.steps_left
    busy = stub.StartRun(slow_request("@Alice hi", run_id="two-l", thread_id="t-two"))
    await read_until(busy, is_started(0))

    # Two "继续" turns queue behind L, one after the other.
    enqueue = pb.RunOptions(busy_thread_policy=pb.BUSY_THREAD_POLICY_ENQUEUE)
    first = stub.StartRun(slow_request("继续", run_id="two-c1", thread_id="t-two", options=enqueue))
    await asyncio.sleep(0.05)
    second = stub.StartRun(
        slow_request("继续", run_id="two-c2", thread_id="t-two", options=enqueue)
    )
    first_events, second_events = await asyncio.gather(collect(first), collect(second))
    await collect(busy)

    assert [f.reply_id for f in finals(first_events)] == [s.reply_id for s in left]
    plan = of_kind(second_events, "plan_created")[0].plan_created
    assert plan.fallback_reason == "nothing to continue" and not finals(second_events)
    assert await get_status(stub, "two-a") == pb.RUN_STATUS_CONTINUED


async def test_a_run_recorded_by_an_older_version_resumes_by_its_old_fingerprint(
    server, stub
) -> None:
    # An interrupted run whose registry row holds the sha256 fingerprint versions before
    # xxh3 stored (a restart onto an upgraded server, or a rolling deploy).
    request = start_request("报数", run_id="old-1", thread_id="t-old")
    old = legacy_fingerprint("t-old", request.snapshot.SerializeToString(deterministic=True))
    await left_behind(server, "old-1", "t-old", old, RunStatus.INTERRUPTED)
    events = await collect(stub.StartRun(request))
    assert kinds(events)[-1] == "run_completed" and len(finals(events)) == 4

    # A different turn under the same run id is still refused.
    other = start_request("@Alice hi", run_id="old-1", thread_id="t-old")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await collect(stub.StartRun(other))
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_a_continue_turn_passes_over_a_stopped_run_with_nothing_left(server, stub) -> None:
    # Run A is cancelled with steps left; then a run of the thread is stopped before it had
    # a plan (as a queued run is by a stop turn): it is newer, and has nothing to continue.
    call = stub.StartRun(slow_request(run_id="po-a", thread_id="t-po"))
    await read_until(call, is_started(1))
    await stub.CancelRun(pb.CancelRunRequest(run_id="po-a", tenant="tenant-1"))
    left = of_kind(await collect(call), "run_cancelled")[0].run_cancelled.steps_left
    await left_behind(server, "po-empty", "t-po", "x3:0", RunStatus.CANCELLED)
    more = await collect(stub.StartRun(slow_request("继续", run_id="po-c", thread_id="t-po")))
    plan = of_kind(more, "plan_created")[0].plan_created
    assert plan.continued_run_id == "po-a"
    assert [f.reply_id for f in finals(more)] == [s.reply_id for s in left]
    assert await get_status(stub, "po-empty") == pb.RUN_STATUS_CANCELLED, "not claimed"


@pytest.mark.parametrize("text", ["继续", "continue", "@Bob hi"])
async def test_the_turn_after_a_stop_turn_waits_for_the_stopped_run_even_with_reject(
    stub, text: str
) -> None:
    # Outside testing: the stop turn had ended while sf-1 finished its speaker's reply, and
    # the next turn (继续 too) got THREAD_BUSY under the default policy. A thread whose
    # runs are all stopping is not busy for long: the next turn waits for them.
    key = {"继续": "zh", "continue": "en", "@Bob hi": "new"}[text]
    thread = f"t-sf-{key}"
    live = stub.StartRun(slow_request(run_id=f"sf-1-{key}", thread_id=thread))
    events = await read_until(live, is_started(0))
    stop = await collect(
        stub.StartRun(slow_request("停止", run_id=f"sf-2-{key}", thread_id=thread))
    )
    assert kinds(stop)[-1] == "run_completed"
    after = stub.StartRun(slow_request(text, run_id=f"sf-3-{key}", thread_id=thread))
    events += await collect(live)
    assert of_kind(events, "run_cancelled")[0].run_cancelled.reason == "stop_directive"
    more = await collect(after)
    assert kinds(more)[-1] == "run_completed"
    assert more[0].emitted_at.ToNanoseconds() >= events[-1].emitted_at.ToNanoseconds()
    if text == "@Bob hi":
        assert [f.member_id for f in finals(more)] == ["b"]
    else:  # it continues the stopped run: the speakers it had left
        assert [f.member_id for f in finals(more)] == ["b", "c", "d"]
    # A run that is not stopping still makes the thread busy.
    busy_live = stub.StartRun(slow_request(run_id=f"sf-4-{key}", thread_id=thread))
    await read_until(busy_live, is_started(0))
    with pytest.raises(grpc.aio.AioRpcError) as busy:
        await collect(
            stub.StartRun(slow_request("@Bob hi", run_id=f"sf-5-{key}", thread_id=thread))
        )
    assert reason_of(busy.value) == "THREAD_BUSY"
    await collect(busy_live)


async def test_an_immediate_cancel_during_a_committed_append_loses_no_event(
    server, stub, monkeypatch
) -> None:
    """Over the network a cancel can land after the database committed an event: the
    event still takes its seq and reaches the stream, and the run's end comes after it."""
    store = server.store
    if not store.shared:
        pytest.skip("SQLite's append never waits after it writes")
    committed = asyncio.Event()
    real_append = store.append_event

    async def append_then_wait(tenant: str, run_id: str, event: StoredEvent, **kw):
        mark = await real_append(tenant, run_id, event, **kw)
        if event.kind == "plan_created":
            committed.set()
            await asyncio.sleep(0.5)  # the reply is on its way back when the cancel lands
        return mark

    monkeypatch.setattr(store, "append_event", append_then_wait)
    call = stub.StartRun(slow_request(run_id="race-1", thread_id="t-race"))
    events = asyncio.create_task(collect(call))
    await asyncio.wait_for(committed.wait(), 10)
    await stub.CancelRun(
        pb.CancelRunRequest(run_id="race-1", tenant="tenant-1", mode=pb.CANCEL_MODE_IMMEDIATE)
    )
    streamed = await asyncio.wait_for(events, 10)
    assert kinds(streamed) == ["run_started", "plan_created", "run_cancelled"]
    assert [e.seq for e in streamed] == [1, 2, 3]
    logged = await real_append.__self__.read_events("tenant-1", "race-1", 0)
    assert [(e.seq, e.kind) for e in logged] == [
        (1, "run_started"),
        (2, "plan_created"),
        (3, "run_cancelled"),
    ]
    assert await get_status(stub, "race-1") == pb.RUN_STATUS_CANCELLED


async def test_continue_after_a_member_left_speaks_the_steps_of_those_still_here(stub) -> None:
    call = stub.StartRun(slow_request(run_id="gone-1", thread_id="t-gone"))
    await read_until(call, is_started(1))
    await stub.CancelRun(pb.CancelRunRequest(run_id="gone-1", tenant="tenant-1"))
    await collect(call)
    # Dave (d) left the session before the user said "继续".
    more = await collect(
        stub.StartRun(slow_request("继续", run_id="gone-2", thread_id="t-gone", n=3))
    )
    plan = of_kind(more, "plan_created")[0].plan_created
    assert [s.member_id for s in plan.steps] == ["c"]
    assert plan.fallback_reason == "no longer in the session: d"
    assert [f.member_id for f in finals(more)] == ["c"]
    assert kinds(more)[-1] == "run_completed"


async def test_a_run_failed_retryably_resumes_on_retry_keeping_its_finished_speakers(
    stub, monkeypatch
) -> None:
    import roundtable.graph.member as member_module

    real = member_module.select_memories
    calls = Counter[str]()

    def fails_once_for_carol(memories, *args, **kwargs):
        calls["all"] += 1
        if calls["all"] == 3:  # the third speaker, once
            raise RuntimeError("a transient fault")
        return real(memories, *args, **kwargs)

    monkeypatch.setattr(member_module, "select_memories", fails_once_for_carol)
    request = start_request("@all hi", run_id="rf-1", thread_id="t-rf")
    first = await collect(stub.StartRun(request))
    failed = of_kind(first, "run_failed")[0].run_failed
    assert failed.retryable and [f.member_id for f in finals(first)] == ["a", "b"]

    again = await collect(stub.StartRun(request))
    resumed = last_execution(again)
    assert resumed[0].run_started.resumed
    assert [f.member_id for f in finals(resumed)] == ["c", "d"], "a and b not repeated"
    assert kinds(again)[-1] == "run_completed"
    assert await get_status(stub, "rf-1") == pb.RUN_STATUS_SUCCEEDED


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        ("报数", False),
        ("@all hi", False),
        ("hi", True),
        (" ".join(f"@N{i}" for i in range(10)), False),
    ],
)
async def test_a_turn_cut_to_max_speakers_says_so_in_its_plan(stub, text, mentions) -> None:
    # A count-off, @all or @mentions of more members than max_speakers (the mentions were
    # cut without a word before).
    request = start_request(
        text, members=[member(f"m{i}", f"N{i}") for i in range(10)], run_id="cut-1"
    )
    if mentions:
        request.snapshot.user_turn.mentions.extend(f"m{i}" for i in range(10))
    request.snapshot.session.budgets.max_speakers = 8
    events = await collect(stub.StartRun(request))
    plan = of_kind(events, "plan_created")[0].plan_created
    assert [s.member_id for s in plan.steps] == [f"m{i}" for i in range(8)]
    assert plan.fallback_reason == "cut to max_speakers: 8 of 10 members"


@pytest.mark.parametrize("mode", [pb.CANCEL_MODE_GRACEFUL, pb.CANCEL_MODE_IMMEDIATE])
async def test_a_queued_run_cancelled_ends_at_once_not_after_the_run_ahead(stub, mode) -> None:
    ahead = stub.StartRun(slow_request(run_id=f"qa-{mode}", thread_id=f"t-q-{mode}"))
    await read_until(ahead, is_started(0))
    enqueue = pb.RunOptions(busy_thread_policy=pb.BUSY_THREAD_POLICY_ENQUEUE)
    queued = stub.StartRun(
        slow_request("@Bob hi", run_id=f"qb-{mode}", thread_id=f"t-q-{mode}", options=enqueue)
    )
    for _ in range(500):  # until the server has it, queued
        with contextlib.suppress(grpc.aio.AioRpcError):
            if await get_status(stub, f"qb-{mode}") == pb.RUN_STATUS_QUEUED:
                break
        await asyncio.sleep(0.01)
    answer = await stub.CancelRun(
        pb.CancelRunRequest(run_id=f"qb-{mode}", tenant="tenant-1", mode=mode)
    )
    assert answer.outcome == pb.CANCEL_OUTCOME_REQUESTED
    # "The run as it is now": ended (it said QUEUED before, while its stream ended at once).
    assert answer.run.status == pb.RUN_STATUS_CANCELLED
    assert kinds(await collect(queued)) == ["run_started", "run_cancelled"]
    assert await get_status(stub, f"qa-{mode}") == pb.RUN_STATUS_RUNNING, "it did not wait"
    assert kinds(await collect(ahead))[-1] == "run_completed"
    assert await get_status(stub, f"qb-{mode}") == pb.RUN_STATUS_CANCELLED


async def test_stream_of_a_live_run_after_a_seq_it_never_gave_out_is_refused(stub) -> None:
    call = stub.StartRun(slow_request(run_id="past-1", thread_id="t-past"))
    await read_until(call, is_started(0))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(
            stub.StreamRun(pb.StreamRunRequest(run_id="past-1", tenant="tenant-1", after_seq=999))
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert kinds(await collect(call))[-1] == "run_completed", "the run goes on"


async def test_a_timeout_below_the_run_is_a_failure_to_retry_not_its_deadline(
    server, stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: any TimeoutError (a store's, a library's) ended the run as past its deadline,
    # not retryable, though the same StartRun again would have finished it.
    append, appends = server.store.append_event, 0

    async def third_times_out(*args: object, **kwargs: object) -> object:
        nonlocal appends
        appends += 1
        if appends == 3:
            raise TimeoutError
        return await append(*args, **kwargs)

    monkeypatch.setattr(server.store, "append_event", third_times_out)
    request = start_request("@all hi", run_id="stray-timeout", thread_id="t-stray")
    events = await collect(stub.StartRun(request))
    failed = events[-1].run_failed
    assert (failed.code, failed.retryable) == ("INTERNAL", True)
    again = await collect(stub.StartRun(request))
    assert kinds(again)[-1] == "run_completed"
