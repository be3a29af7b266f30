"""Cross-process recovery: a real `roundtable serve` killed mid-run, a second one resumes it.

Process A runs a 6-speaker turn with a slow offline model and is killed with SIGKILL;
process B, a new server on the same database, gets the same StartRun and finishes. Every
reply_id has exactly one assistant_final across both streams, B calls the model only for
the speakers that had not finished, and no plan is announced twice.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import (
    collect,
    durable_seqs,
    finals,
    last_execution,
    member,
    of_kind,
    start_request,
)
from support.process import ServerProcess

pytestmark = pytest.mark.e2e

NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank"]


def six_speakers(
    text: str, run_id: str, *, director: spb.ModelRef | None = None
) -> pb.StartRunRequest:
    slow = spb.ModelRef(
        target=spb.ModelTarget(
            provider="offline", model="slow", base_url="offline:?token_delay_ms=20"
        )
    )
    roster = [
        member(chr(ord("a") + i), n, f"{n} speaks plainly.", model=slow)
        for i, n in enumerate(NAMES)
    ]
    return start_request(
        text,
        members=roster,
        run_id=run_id,
        thread_id=f"thread-{run_id}",
        default_model=director,
        budgets=spb.Budgets(max_speakers=6),
    )


async def run_until_killed(server: ServerProcess, request, stop_when) -> list[epb.RunEvent]:
    events: list[epb.RunEvent] = []
    try:
        async with server.channel() as channel:
            async for response in server.stub(channel).StartRun(request):
                events.append(response.event)
                if stop_when(response.event):
                    server.kill()
                    break
    finally:
        await server.stop()  # kills it if the stream failed before the kill, and waits
    return events


def dispatch_calls(server: ServerProcess) -> int:
    return sum(
        1 for r in server.audit() if r["caller_node"] == "dispatch" and r["status"] == "success"
    )


async def resume_on_b(tmp_path: Path, request) -> tuple[ServerProcess, list[epb.RunEvent], int]:
    b = await ServerProcess(tmp_path / "rt.db", tmp_path / "b.log").start()
    try:
        async with b.channel() as channel:
            stub = b.stub(channel)
            before = await stub.GetRun(
                pb.GetRunRequest(run_id=request.context.run_id, tenant="tenant-1")
            )
            events = await collect(stub.StartRun(request))
            after = await stub.GetRun(
                pb.GetRunRequest(run_id=request.context.run_id, tenant="tenant-1")
            )
        assert before.run.status == pb.RUN_STATUS_INTERRUPTED, "restart marks the dead run"
        # The stream is the whole log from seq 1 (A's part too, even what A committed and
        # never sent), then B's execution: that is what the tests look at.
        seqs = durable_seqs(events)
        assert seqs == list(range(1, len(seqs) + 1)), "every seq once, in order"
        return b, last_execution(events), after.run.status
    finally:
        await b.stop()


def assert_exactly_once(a_events, b_events, n: int, run_id: str) -> None:
    both = Counter(f.reply_id for f in finals(a_events + b_events))
    assert both == Counter({f"{run_id}#{i}": 1 for i in range(n)})
    assert len(of_kind(a_events + b_events, "plan_created")) == 1
    assert b_events[0].run_started.resumed
    assert of_kind(b_events, "run_completed")


@pytest.mark.parametrize("durability", ["exit", "async"])
async def test_kill_after_speaker_3_final(tmp_path: Path, durability: str) -> None:
    # exit (the default): A leaves no checkpoint, B resumes from the event log alone.
    # async: A leaves the plan's checkpoint, and B's graph resumes from it at dispatch.
    request = six_speakers("@all introduce yourselves", "ab-final")
    a = await ServerProcess(
        tmp_path / "rt.db", tmp_path / "a.log", "--checkpoint-durability", durability
    ).start()
    a_events = await run_until_killed(
        a,
        request,
        lambda e: e.WhichOneof("payload") == "assistant_final" and e.assistant_final.step == 2,
    )
    b, b_events, status = await resume_on_b(tmp_path, request)
    assert_exactly_once(a_events, b_events, 6, "ab-final")
    assert [f.step for f in finals(b_events)] == [3, 4, 5]
    assert dispatch_calls(b) == 3, "no model call for speakers 1-3 in B"
    assert status == pb.RUN_STATUS_SUCCEEDED
    # The run's usage counts all six speakers once (A's three from their finals in the
    # log), plus B's own calls that are no speaker's (the memory proposal).
    usage = of_kind(b_events, "run_completed")[0].run_completed.usage
    others = [r for r in b.audit() if r["caller_node"] != "dispatch" and r["status"] == "success"]
    every_final = finals(a_events + b_events)
    assert (usage.input_tokens, usage.output_tokens) == (
        sum(f.usage.input_tokens for f in every_final) + sum(r["input_tokens"] for r in others),
        sum(f.usage.output_tokens for f in every_final) + sum(r["output_tokens"] for r in others),
    )


async def test_kill_in_the_middle_of_a_reply(tmp_path: Path) -> None:
    request = six_speakers("@all introduce yourselves", "ab-delta")
    a = await ServerProcess(tmp_path / "rt.db", tmp_path / "a.log").start()
    a_events = await run_until_killed(
        a,
        request,
        lambda e: (
            e.WhichOneof("payload") == "assistant_delta"
            and e.assistant_delta.reply_id == "ab-delta#3"
        ),
    )
    b, b_events, status = await resume_on_b(tmp_path, request)
    assert [f.step for f in finals(a_events)] == [0, 1, 2]
    assert_exactly_once(a_events, b_events, 6, "ab-delta")
    assert [f.step for f in finals(b_events)] == [3, 4, 5], "the half-spoken speaker speaks again"
    # It starts over as attempt 2, past A's, so a client drops A's half-spoken text (review:
    # it said attempt 1 again, and its deltas went on from the same counter).
    started = [e.speaker_started for e in of_kind(b_events, "speaker_started")]
    assert [(s.reply_id, s.attempt) for s in started] == [
        ("ab-delta#3", 2),
        ("ab-delta#4", 1),
        ("ab-delta#5", 1),
    ]
    assert dispatch_calls(b) == 3
    assert status == pb.RUN_STATUS_SUCCEEDED


async def test_kill_during_the_supervisor_call(tmp_path: Path) -> None:
    director = spb.ModelRef(
        target=spb.ModelTarget(
            provider="offline", model="director", base_url="offline:?latency_ms=1500"
        )
    )
    request = six_speakers("what should we do this weekend?", "ab-super", director=director)
    a = await ServerProcess(tmp_path / "rt.db", tmp_path / "a.log").start()
    a_events = await run_until_killed(
        a, request, lambda e: e.WhichOneof("payload") == "run_started"
    )
    assert not of_kind(a_events, "plan_created")
    _b, b_events, status = await resume_on_b(tmp_path, request)
    plans = of_kind(b_events, "plan_created")
    assert len(plans) == 1 and plans[0].plan_created.source == epb.PLAN_SOURCE_SUPERVISOR
    n = len(plans[0].plan_created.steps)
    assert_exactly_once(a_events, b_events, n, "ab-super")
    assert status == pb.RUN_STATUS_SUCCEEDED


async def test_sigterm_drains_at_a_speaker_boundary_and_exits_0(tmp_path: Path) -> None:
    request = six_speakers("@all introduce yourselves", "drain-1")
    a = await ServerProcess(tmp_path / "rt.db", tmp_path / "a.log", "--grace-seconds", "10").start()
    events: list[epb.RunEvent] = []
    async with a.channel() as channel:
        async for response in a.stub(channel).StartRun(request):
            events.append(response.event)
            if (
                response.event.WhichOneof("payload") == "speaker_started"
                and response.event.speaker_started.step == 1
            ):
                a.terminate()
    assert await a.wait() == 0
    cancelled = of_kind(events, "run_cancelled")[0].run_cancelled
    assert cancelled.reason == "server_shutdown"
    assert [f.step for f in finals(events)] == [0, 1], "the speaker in flight finished first"
    _b, b_events, status = await resume_on_b(tmp_path, request)
    assert [f.step for f in finals(b_events)] == [2, 3, 4, 5]
    assert status == pb.RUN_STATUS_SUCCEEDED


async def _stream_of(server: ServerProcess, run_id: str) -> tuple[list[epb.RunEvent], object]:
    """StreamRun from seq 0: the events it gave, and the status it ended with."""
    import grpc

    events: list[epb.RunEvent] = []
    async with server.channel() as channel:
        call = server.stub(channel).StreamRun(pb.StreamRunRequest(run_id=run_id, tenant="tenant-1"))
        try:
            async for response in call:
                events.append(response.event)
        except grpc.aio.AioRpcError as error:
            return events, error.code()
    return events, "OK"


async def test_a_stream_of_a_run_whose_execution_died_is_not_a_clean_end(tmp_path: Path) -> None:
    import grpc

    a = await ServerProcess(tmp_path / "rt.db", tmp_path / "a.log").start()
    request = six_speakers("@all hello", "died-1")
    killed = await run_until_killed(
        a, request, lambda e: e.WhichOneof("payload") == "speaker_started"
    )
    b = await ServerProcess(tmp_path / "rt.db", tmp_path / "b.log").start()
    try:
        # Marked interrupted at B's start, which closes the log A never closed: the stream
        # ends in a terminal event saying "send the same StartRun" (it ended OK after a
        # speaker_started before).
        events, code = await _stream_of(b, "died-1")
        assert [e.seq for e in events[:-1]] == [e.seq for e in killed if e.seq]
        closed = events[-1].run_failed
        assert (closed.code, closed.retryable) == ("RUN_INTERRUPTED", True)
        assert code == "OK"
        # A 继续 turn continues it: the old run's stream then ends FAILED_PRECONDITION
        # after its log (its retryable run_failed would have the gateway send a StartRun
        # that can only replay it), and so does that StartRun.
        cont = start_request(
            "继续",
            members=list(request.snapshot.members),
            run_id="died-2",
            thread_id="thread-died-1",
        )
        async with b.channel() as channel:
            await collect(b.stub(channel).StartRun(cont))
        again, code = await _stream_of(b, "died-1")
        assert again == events
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        async with b.channel() as channel:
            with pytest.raises(grpc.aio.AioRpcError) as replay:
                await collect(b.stub(channel).StartRun(request))
        assert replay.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "died-2" in (replay.value.details() or "")
    finally:
        await b.stop()


async def test_a_resumed_run_closes_the_execution_that_died(tmp_path: Path) -> None:
    a = await ServerProcess(tmp_path / "rt.db", tmp_path / "a.log").start()
    request = six_speakers("@all hello", "died-3")
    await run_until_killed(a, request, lambda e: e.WhichOneof("payload") == "speaker_started")
    b = await ServerProcess(tmp_path / "rt.db", tmp_path / "b.log").start()
    try:
        async with b.channel() as channel:
            events = await collect(b.stub(channel).StartRun(request))
    finally:
        await b.stop()
    events = [e for e in events if e.WhichOneof("payload") != "assistant_delta"]
    # Each execution in the log runs from run_started to a terminal event.
    starts = [i for i, e in enumerate(events) if e.WhichOneof("payload") == "run_started"]
    assert len(starts) == 2
    dead_end = events[starts[1] - 1]
    assert dead_end.WhichOneof("payload") == "run_failed"
    assert (dead_end.run_failed.code, dead_end.run_failed.retryable) == ("RUN_INTERRUPTED", True)
    assert events[-1].WhichOneof("payload") == "run_completed"
    assert [e.seq for e in events if e.seq] == list(range(1, len(events) + 1))
