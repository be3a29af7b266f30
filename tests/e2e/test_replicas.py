"""Two replicas on one Postgres: any replica can resume, follow or cancel any run.

Replica A runs a turn and is killed with SIGKILL; after A's lease expires, the same
StartRun on replica B finishes it: every reply_id final exactly once, no finished
speaker run again. A cancel sent to B for a run A owns stops it at A's next speaker
boundary, and B can follow A's run through the shared event log.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import (
    collect,
    durable_seqs,
    finals,
    kinds,
    last_execution,
    member,
    of_kind,
    start_request,
)
from support.process import ServerProcess
from support.stores import drop_schema, new_schema, postgres_dsn

pytestmark = pytest.mark.e2e

LEASE = "2"


@pytest.fixture
def shared_store() -> AsyncIterator[str]:
    dsn = postgres_dsn()
    url = new_schema(dsn)
    yield url
    drop_schema(dsn, url)


def six_speakers(run_id: str) -> pb.StartRunRequest:
    slow = spb.ModelRef(
        target=spb.ModelTarget(
            provider="offline", model="slow", base_url="offline:?token_delay_ms=20"
        )
    )
    names = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank"]
    roster = [member(chr(ord("a") + i), n, model=slow) for i, n in enumerate(names)]
    return start_request(
        "@all hello",
        members=roster,
        run_id=run_id,
        thread_id=f"t-{run_id}",
        budgets=spb.Budgets(max_speakers=6),
    )


def is_final(step: int):
    return lambda e: e.WhichOneof("payload") == "assistant_final" and e.assistant_final.step == step


async def replica(store: str, log: Path) -> ServerProcess:
    return await ServerProcess(store, log, "--lease-seconds", LEASE).start()


@contextlib.asynccontextmanager
async def two_replicas(
    store: str, tmp_path: Path
) -> AsyncIterator[tuple[ServerProcess, ServerProcess]]:
    """Replicas A and B on one Postgres, stopped on the way out (their last log lines
    written: they log in batches, so audit() is complete only after the stop)."""
    a = await replica(store, tmp_path / "a.log")
    try:
        b = await replica(store, tmp_path / "b.log")
        try:
            yield a, b
        finally:
            await b.stop()
    finally:
        await a.stop()


@contextlib.asynccontextmanager
async def replica_stubs(store: str, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    """Clients of replicas A and B (see two_replicas)."""
    async with (
        two_replicas(store, tmp_path) as (a, b),
        a.channel() as a_channel,
        b.channel() as b_channel,
    ):
        yield a.stub(a_channel), b.stub(b_channel)


def thread_turn(
    thread: str, run_id: str, policy: int, text: str = "@Alice hi", **kwargs: Any
) -> pb.StartRunRequest:
    """A turn of `thread` with a busy-thread policy."""
    request = start_request(text, run_id=run_id, thread_id=thread, **kwargs)
    request.options.busy_thread_policy = policy  # type: ignore[assignment]
    return request


async def until_speaking(call: Any) -> list[epb.RunEvent]:
    """Reads a StartRun stream until its first speaker starts (the run is then busy)."""
    events = []
    async for response in call:
        events.append(response.event)
        if response.event.WhichOneof("payload") == "speaker_started":
            return events
    raise AssertionError("the run ended before a speaker started")


async def kill_a_after_speaker_3(a: ServerProcess, request) -> list[epb.RunEvent]:
    events = []
    async with a.channel() as channel:
        async for response in a.stub(channel).StartRun(request):
            events.append(response.event)
            if is_final(2)(response.event):
                a.kill()
                break
    await a.wait()
    return events


def dispatch_calls(server: ServerProcess) -> int:
    return sum(
        1 for r in server.audit() if r["caller_node"] == "dispatch" and r["status"] == "success"
    )


async def test_b_resumes_what_a_left_after_its_lease_expires(
    shared_store: str, tmp_path: Path
) -> None:
    request = six_speakers("rep-1")
    async with two_replicas(shared_store, tmp_path) as (a, b):
        a_events = await kill_a_after_speaker_3(a, request)
        await asyncio.sleep(float(LEASE) + 0.5)
        async with b.channel() as channel:
            stub = b.stub(channel)
            stream = await collect(stub.StartRun(request))
            status = (
                await stub.GetRun(pb.GetRunRequest(run_id="rep-1", tenant="tenant-1"))
            ).run.status
        seqs = durable_seqs(stream)
        assert seqs == list(range(1, len(seqs) + 1)), "A's log from seq 1, then B's execution"
        b_events = last_execution(stream)
        assert b_events[0].run_started.resumed
        assert [f.step for f in finals(b_events)] == [3, 4, 5]
        both = Counter(f.reply_id for f in finals(a_events + b_events))
        assert both == Counter({f"rep-1#{i}": 1 for i in range(6)})
        assert len(of_kind(a_events + b_events, "plan_created")) == 1
        assert status == pb.RUN_STATUS_SUCCEEDED
        await b.stop()  # B writes its log lines in batches: all of them by its exit
        assert dispatch_calls(b) == 3, "no finished speaker ran again on B"


async def test_a_dead_replicas_run_reads_interrupted_and_a_continue_takes_it_over(
    shared_store: str, tmp_path: Path
) -> None:
    # Outside testing: only a replica's start marked a dead one's runs, and only those
    # whose lease had run out then; a run whose replica was restarted within its lease (or
    # never) stayed RUNNING for good: 继续 found nothing to continue, CancelRun said ended.
    request = six_speakers("rep-dead")
    async with two_replicas(shared_store, tmp_path) as (a, b):
        await kill_a_after_speaker_3(a, request)
        async with b.channel() as channel:
            stub = b.stub(channel)
            get = pb.GetRunRequest(run_id="rep-dead", tenant="tenant-1")
            async with asyncio.timeout(4 * float(LEASE) + 5):
                while (await stub.GetRun(get)).run.status != pb.RUN_STATUS_INTERRUPTED:
                    assert (await stub.GetRun(get)).run.status == pb.RUN_STATUS_RUNNING
                    await asyncio.sleep(0.2)
            go_on = start_request(
                "继续",
                members=list(request.snapshot.members),
                run_id="rep-dead-2",
                thread_id=request.context.thread_id,
                budgets=spb.Budgets(max_speakers=6),
            )
            events = await collect(stub.StartRun(go_on))
        assert kinds(events)[-1] == "run_completed"
        assert [f.reply_id for f in finals(events)] == [f"rep-dead#{i}" for i in (3, 4, 5)]


async def test_b_follows_a_dead_replica_then_takes_over(shared_store: str, tmp_path: Path) -> None:
    request = six_speakers("rep-1b")
    async with two_replicas(shared_store, tmp_path) as (a, b):
        await kill_a_after_speaker_3(a, request)
        # A's lease still runs: B attaches through the log, and resumes when the lease ends.
        async with b.channel() as channel:
            b_events = await collect(b.stub(channel).StartRun(request))
        assert Counter(f.reply_id for f in finals(b_events)) == Counter(
            {f"rep-1b#{i}": 1 for i in range(6)}
        )
        assert [e.run_started.resumed for e in of_kind(b_events, "run_started")] == [False, True]
        durable = [e.seq for e in b_events if e.WhichOneof("payload") != "assistant_delta"]
        assert durable == list(range(1, len(durable) + 1)), "one log, every seq once, in order"
        await b.stop()  # B writes its log lines in batches: all of them by its exit
        assert dispatch_calls(b) == 3


async def test_a_cancel_sent_to_b_stops_a_at_its_next_speaker_boundary(
    shared_store: str, tmp_path: Path
) -> None:
    request = six_speakers("rep-2")
    async with (
        two_replicas(shared_store, tmp_path) as (a, b),
        a.channel() as a_channel,
        b.channel() as b_channel,
    ):
        a_stub, b_stub = a.stub(a_channel), b.stub(b_channel)
        call = a_stub.StartRun(request)
        events = []
        async for response in call:
            events.append(response.event)
            if (
                response.event.WhichOneof("payload") == "speaker_started"
                and response.event.speaker_started.step == 1
            ):
                break
        # B follows A's run through the shared log...
        follower = asyncio.create_task(
            collect(b_stub.StreamRun(pb.StreamRunRequest(run_id="rep-2", tenant="tenant-1")))
        )
        # ...and records a cancel that A honours at its next speaker boundary.
        answer = await b_stub.CancelRun(pb.CancelRunRequest(run_id="rep-2", tenant="tenant-1"))
        assert answer.outcome == pb.CANCEL_OUTCOME_REQUESTED
        events += await collect(call)
        followed = await asyncio.wait_for(follower, 30)
    cancelled = of_kind(events, "run_cancelled")[0].run_cancelled
    assert cancelled.reason == "cancel_requested"
    assert [f.step for f in finals(events)] == [0, 1], "speaker 2 finished, nobody after it started"
    assert not [e for e in of_kind(events, "speaker_started") if e.speaker_started.step >= 2]
    durable = [e for e in events if e.WhichOneof("payload") != "assistant_delta"]
    assert [e.SerializeToString() for e in followed] == [e.SerializeToString() for e in durable]
    assert kinds(followed)[-1] == "run_cancelled"


async def test_an_immediate_cancel_sent_to_b_interrupts_a_mid_speaker(
    shared_store: str, tmp_path: Path
) -> None:
    parked = spb.ModelRef(
        target=spb.ModelTarget(
            provider="offline", model="parked", base_url="offline:?latency_ms=60000"
        )
    )
    request = start_request(
        "@all hello",
        members=[member("a", "Alice", model=parked), member("b", "Bob", model=parked)],
        run_id="rep-imm",
        thread_id="t-rep-imm",
    )
    async with replica_stubs(shared_store, tmp_path) as (a_stub, b_stub):
        call = a_stub.StartRun(request)
        events = []
        async for response in call:
            events.append(response.event)
            if response.event.WhichOneof("payload") == "speaker_started":
                break
        answer = await b_stub.CancelRun(
            pb.CancelRunRequest(run_id="rep-imm", tenant="tenant-1", mode=pb.CANCEL_MODE_IMMEDIATE)
        )
        assert answer.outcome == pb.CANCEL_OUTCOME_REQUESTED
        # A's lease keeper sees it within a third of the lease, not after the 60 s call.
        events += await asyncio.wait_for(collect(call), 15)
        run = await a_stub.GetRun(pb.GetRunRequest(run_id="rep-imm", tenant="tenant-1"))
    assert kinds(events)[-1] == "run_cancelled"
    assert of_kind(events, "run_cancelled")[0].run_cancelled.reason == "cancel_requested"
    assert not finals(events), "the interrupted speaker's reply was dropped"
    assert run.run.status == pb.RUN_STATUS_CANCELLED


async def test_two_replicas_never_run_one_run_at_once(shared_store: str, tmp_path: Path) -> None:
    request = six_speakers("rep-3")
    async with (
        two_replicas(shared_store, tmp_path) as (a, b),
        a.channel() as a_channel,
        b.channel() as b_channel,
    ):
        results = await asyncio.gather(
            collect(a.stub(a_channel).StartRun(request)),
            collect(b.stub(b_channel).StartRun(request)),
        )
    # Read after both stopped: replicas write their log lines in batches.
    executions = sum(len(of_kind(r, "run_started")) for r in results)
    assert executions == 2, "both streams see the run start once (one runs, one follows)"
    runs = [r for r in (a.audit() + b.audit()) if r["caller_node"] == "dispatch"]
    assert len(runs) == 6, "six speakers, each called once, on one replica"
    for events in results:
        assert [f.reply_id for f in finals(events)] == [f"rep-3#{i}" for i in range(6)]
        assert isinstance(events[-1], epb.RunEvent) and kinds(events)[-1] == "run_completed"


async def test_busy_thread_policies_see_the_thread_run_of_another_replica(
    shared_store: str, tmp_path: Path
) -> None:
    first = six_speakers("rep-4")
    thread = first.context.thread_id
    async with replica_stubs(shared_store, tmp_path) as (a_stub, b_stub):
        call = a_stub.StartRun(first)
        events = await until_speaking(call)

        # REJECT on B: the thread is busy on A, and the rejected run leaves no trace.
        with pytest.raises(grpc.aio.AioRpcError) as busy:
            await collect(
                b_stub.StartRun(thread_turn(thread, "rep-4-rejected", pb.BUSY_THREAD_POLICY_REJECT))
            )
        assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await b_stub.GetRun(pb.GetRunRequest(run_id="rep-4-rejected", tenant="tenant-1"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND

        # INTERRUPT on B: A stops at its next speaker boundary, then B's turn runs.
        second = await collect(
            b_stub.StartRun(thread_turn(thread, "rep-4-next", pb.BUSY_THREAD_POLICY_INTERRUPT))
        )
        events += await collect(call)
    cancelled = of_kind(events, "run_cancelled")
    assert cancelled and cancelled[0].run_cancelled.reason == "interrupted_by_new_run"
    assert len(finals(events)) < 6
    assert [f.member_id for f in finals(second)] == ["a"]
    assert second[0].emitted_at.ToNanoseconds() >= events[-1].emitted_at.ToNanoseconds(), (
        "B's turn starts once A's run has ended"
    )


async def test_enqueued_runs_of_one_thread_on_two_replicas_run_one_after_another(
    shared_store: str, tmp_path: Path
) -> None:
    first = six_speakers("rep-5")
    thread = first.context.thread_id
    enqueue = pb.BUSY_THREAD_POLICY_ENQUEUE
    async with replica_stubs(shared_store, tmp_path) as (a_stub, b_stub):
        call = a_stub.StartRun(first)
        head = await until_speaking(call)
        # B waits on replica b for A; then C waits on replica a for A and for B.
        on_b = asyncio.create_task(
            collect(b_stub.StartRun(thread_turn(thread, "rep-5-b", enqueue)))
        )
        await asyncio.sleep(0.3)
        on_a = asyncio.create_task(
            collect(a_stub.StartRun(thread_turn(thread, "rep-5-c", enqueue)))
        )
        runs = [head + await collect(call), await on_b, await on_a]

    spans = [(e[0].emitted_at.ToNanoseconds(), e[-1].emitted_at.ToNanoseconds()) for e in runs]
    assert [kinds(e)[-1] for e in runs] == ["run_completed"] * 3
    assert spans[0][1] <= spans[1][0] and spans[1][1] <= spans[2][0], (
        "one run of the thread at a time, in the order they came"
    )


async def test_a_stop_turn_on_another_replica_stops_the_running_and_the_waiting_run(
    shared_store: str, tmp_path: Path
) -> None:
    first = six_speakers("rep-6")
    thread = first.context.thread_id
    waiting = thread_turn(thread, "rep-6-w", pb.BUSY_THREAD_POLICY_ENQUEUE, "@Bob hi")
    async with replica_stubs(shared_store, tmp_path) as (a_stub, b_stub):
        call = a_stub.StartRun(first)
        events = await until_speaking(call)
        behind = asyncio.create_task(collect(a_stub.StartRun(waiting)))
        await asyncio.sleep(0.3)
        stop = await collect(
            b_stub.StartRun(start_request("停止", run_id="rep-6-s", thread_id=thread))
        )
        events += await collect(call)
        waited = await behind
    assert kinds(stop) == ["run_started", "plan_created", "run_completed"]
    assert of_kind(events, "run_cancelled")[0].run_cancelled.reason == "stop_directive"
    assert len(finals(events)) < 6
    # The waiting run's execution opens and ends there: nobody in it spoke.
    assert kinds(waited) == ["run_started", "run_cancelled"]
    assert waited[-1].run_cancelled.reason == "stop_directive"


@pytest.mark.parametrize("continue_on", ["a", "b"])
async def test_continue_after_a_stop_sent_to_another_replica_waits_on_either(
    shared_store: str, tmp_path: Path, continue_on: str
) -> None:
    # Review: 停止 sent to B recorded the cancel on A's run; 继续 then sent to A, which runs
    # the run, got THREAD_BUSY until the speaker's end (A had not read the cancel yet).
    first = six_speakers(f"rep-sc-{continue_on}")
    thread = first.context.thread_id
    async with replica_stubs(shared_store, tmp_path) as (a_stub, b_stub):
        call = a_stub.StartRun(first)
        events = await until_speaking(call)
        stop = b_stub.StartRun(
            start_request("停止", run_id=f"rep-sc-{continue_on}-s", thread_id=thread)
        )
        assert kinds(await collect(stop))[-1] == "run_completed"
        stub = a_stub if continue_on == "a" else b_stub
        go_on = thread_turn(thread, f"rep-sc-{continue_on}-c", pb.BUSY_THREAD_POLICY_REJECT, "继续")
        more = await collect(stub.StartRun(go_on))
        events += await collect(call)
    assert kinds(events)[-1] == "run_cancelled"
    assert kinds(more)[-1] == "run_completed"
    left = events[-1].run_cancelled.steps_left  # of members still in the session (a-d)
    assert finals(more), "the continue turn spoke"
    assert [f.reply_id for f in finals(more)] == [s.reply_id for s in left if s.member_id < "e"]


async def test_two_replicas_starting_turns_of_one_thread_at_once_never_both_run(
    shared_store: str, tmp_path: Path
) -> None:
    # REJECT on both sides, sent at the same instant, ten times over: each time exactly one
    # runs and the other is refused (the replicas check and record in turn).
    async with replica_stubs(shared_store, tmp_path) as stubs:
        slow = spb.ModelRef(
            target=spb.ModelTarget(
                provider="offline", model="slow", base_url="offline:?token_delay_ms=20"
            )
        )
        roster = [member("a", "Alice", model=slow)]

        async def attempt(stub, run_id: str, thread: str) -> str:
            # A reply of a few hundred ms: the winner is still speaking when the other asks.
            request = thread_turn(thread, run_id, pb.BUSY_THREAD_POLICY_REJECT, members=roster)
            try:
                return kinds(await collect(stub.StartRun(request)))[-1]
            except grpc.aio.AioRpcError as err:
                return err.code().name

        outcomes = []
        for i in range(10):
            thread = f"t-race-{i}"
            outcomes.append(
                sorted(
                    await asyncio.gather(
                        attempt(stubs[0], f"race-{i}-a", thread),
                        attempt(stubs[1], f"race-{i}-b", thread),
                    )
                )
            )
    assert outcomes == [["FAILED_PRECONDITION", "run_completed"]] * 10


async def test_a_run_queued_on_one_replica_is_cancelled_at_once_from_another(
    shared_store: str, tmp_path: Path
) -> None:
    first = six_speakers("rep-q")
    thread = first.context.thread_id
    waiting = thread_turn(thread, "rep-q-w", pb.BUSY_THREAD_POLICY_ENQUEUE, "@Bob hi")
    async with replica_stubs(shared_store, tmp_path) as (a_stub, b_stub):
        call = a_stub.StartRun(first)
        await until_speaking(call)
        behind = asyncio.create_task(collect(a_stub.StartRun(waiting)))
        for _ in range(500):  # until replica A has recorded it, queued
            with contextlib.suppress(grpc.aio.AioRpcError):
                queued = await b_stub.GetRun(pb.GetRunRequest(run_id="rep-q-w", tenant="tenant-1"))
                if queued.run.status == pb.RUN_STATUS_QUEUED:
                    break
            await asyncio.sleep(0.01)
        answer = await b_stub.CancelRun(pb.CancelRunRequest(run_id="rep-q-w", tenant="tenant-1"))
        assert answer.outcome == pb.CANCEL_OUTCOME_REQUESTED
        waited = await behind
        still = await b_stub.GetRun(pb.GetRunRequest(run_id="rep-q", tenant="tenant-1"))
        assert still.run.status == pb.RUN_STATUS_RUNNING, "the queued run did not wait for it"
        await collect(call)
    assert kinds(waited)[-1] == "run_cancelled"
