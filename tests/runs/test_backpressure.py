"""Limits and backpressure: concurrent runs per process and tenant, and a bounded buffer per
stream so a slow reader cannot make the server buffer without bound."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from roundtable.domain.errors import StreamOverflow
from roundtable.domain.events import AssistantDelta, Envelope, Event, SpeakerStarted
from roundtable.runs.live import MERGED_DELTA_MAX, Subscription
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, kinds, member, model_ref, start_request
from support.scripted import ScriptedProvider

SLOW = spb.ModelRef(
    target=spb.ModelTarget(provider="offline", model="slow", base_url="offline:?latency_ms=400")
)


async def read_rest(call) -> list[epb.RunEvent]:
    """Reads a call to its end with the read API (an RPC cannot mix read() and iteration)."""
    events = []
    while (response := await call.read()) != grpc.aio.EOF:
        events.append(response.event)
    return events


def slow_request(run_id: str, tenant: str, thread: str) -> pb.StartRunRequest:
    return start_request(
        "@all hi",
        members=[member("a", "Alice", model=SLOW)],
        run_id=run_id,
        tenant=tenant,
        thread_id=thread,
    )


async def test_concurrent_runs_per_tenant_are_limited_with_a_retry_hint(start_server) -> None:
    async with (
        start_server(max_runs_per_tenant=1, max_runs=2) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        first = stub.StartRun(slow_request("lim-1", "acme", "t1"))
        await first.read()  # run_started: the run is live
        second = stub.StartRun(slow_request("lim-2", "acme", "t2"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await read_rest(second)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        status = await rpc_status.aio.from_call(second)
        hints = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
        assert hints, "a retry hint comes with it"
        # Another tenant still gets in, up to the process limit.
        other = stub.StartRun(slow_request("lim-3", "globex", "t3"))
        await other.read()
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await collect(stub.StartRun(slow_request("lim-4", "initech", "t4")))
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert kinds(await read_rest(first))[-1] == "run_completed"
        await read_rest(other)
        # Capacity comes back when runs end.
        assert (
            kinds(await collect(stub.StartRun(slow_request("lim-5", "acme", "t5"))))[-1]
            == "run_completed"
        )


async def test_a_stop_turn_is_taken_at_the_run_limit_and_stops_the_run(start_server) -> None:
    # Outside testing: 停止 was refused TOO_MANY_RUNS at the limit, and the run it was sent
    # to stop went on talking. A queued run counts towards the limit (it holds its snapshot).
    async with (
        start_server(max_runs_per_tenant=1, max_runs=1) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        roster = [member(m, m.title(), model=SLOW) for m in ("a", "b", "c")]
        live = stub.StartRun(
            start_request("@all hi", members=roster, run_id="full-1", thread_id="t")
        )
        await live.read()
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await collect(stub.StartRun(slow_request("full-2", "tenant-1", "t2")))
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        stop = await collect(stub.StartRun(start_request("停止", run_id="full-3", thread_id="t")))
        assert kinds(stop)[-1] == "run_completed"
        events = await read_rest(live)
        assert kinds(events)[-1] == "run_cancelled"
        assert len(finals(events)) < 3


def event(seq: int, kind: str) -> Envelope:
    if kind == "delta":
        payload: Event = AssistantDelta(reply_id="", text="x", attempt=0)
    else:
        payload = SpeakerStarted(step=seq, member_id="m", reply_id=f"r#{seq}", attempt=1)
    return Envelope(run_id="r", seq=seq, emitted_at=0.0, event=payload)


async def test_a_full_buffer_drops_deltas_then_ends_the_stream_on_a_durable_event() -> None:
    sub = Subscription([], ended=False, buffer=3)
    assert all(sub.offer(event(i, "durable")) for i in (1, 2, 3))
    assert sub.offer(event(3, "delta")), "a delta that does not fit is dropped"
    assert sub.dropped_deltas == 1
    assert not sub.offer(event(4, "durable")), "a durable event that does not fit ends it"
    received = [e async for e in sub]
    assert received == [] and isinstance(sub.error, StreamOverflow) and not sub.reached_end


def delta(text: str, reply: str = "r#0", attempt: int = 0, seq: int = 1) -> Envelope:
    chunk = AssistantDelta(reply_id=reply, text=text, attempt=attempt)
    return Envelope(run_id="r", seq=seq, emitted_at=0.0, event=chunk)


def texts(events: list[Envelope]) -> list[tuple[str, str, int]]:
    return [
        (e.event.reply_id, e.event.text, e.event.attempt)
        if isinstance(e.event, AssistantDelta)
        else ("durable", str(e.seq), 0)
        for e in events
    ]


async def test_a_reader_behind_gets_the_deltas_waiting_for_it_merged() -> None:
    behind = Subscription([], ended=False, buffer=100)
    keeping_up = Subscription([], ended=False, buffer=100)
    chunks = [delta("a"), delta("b"), delta("c"), delta("d", attempt=1), event(2, "durable")]
    chunks += [delta("e", seq=2), delta("f", reply="r#1", seq=2), delta("g", reply="r#1", seq=2)]
    received_live = []
    for chunk in chunks:
        for sub in (behind, keeping_up):
            assert sub.offer(chunk)
        # keeping_up's reader takes each event as it comes: nothing waits, nothing merges.
        received_live.append(keeping_up._items.popleft())
    behind.end()
    received = [e async for e in behind]
    # Same reply and attempt, and nothing durable between them: one message; the order and
    # every character are kept.
    assert texts(received) == [
        ("r#0", "abc", 0),
        ("r#0", "d", 1),
        ("durable", "2", 0),
        ("r#0", "e", 0),
        ("r#1", "fg", 0),
    ]
    # The published events, shared by every stream, are left as they were.
    assert texts(received_live) == texts(chunks)
    assert behind.dropped_deltas == 0


async def test_merged_deltas_stay_under_the_cap_and_within_the_buffer() -> None:
    sub = Subscription([], ended=False, buffer=2)
    big = "x" * (MERGED_DELTA_MAX // 2)
    for _ in range(5):
        assert sub.offer(delta(big))
    sub.end()
    received = [e async for e in sub]
    assert [len(e.event.text) for e in received] == [MERGED_DELTA_MAX] * 2
    assert sub.dropped_deltas == 1, "the fifth half-cap chunk found the buffer full"


async def test_a_slow_reader_is_cut_off_and_loses_nothing_by_re_attaching(start_server) -> None:
    # Replies big enough to fill the transport's flow-control window, so the server-side
    # buffer is what fills while the reader sleeps.
    # (Each reply is cut at the reply bound, 256K characters; the reader's channel keeps
    # its window at HTTP/2's 64 KiB, without BDP probing, so six of them fill it.)
    big = ScriptedProvider(reply=lambda call, attempt: "word " * 400_000)
    roster = [member(m, m.upper(), model=model_ref("scripted", "big")) for m in "abcdef"]
    request = start_request(
        "@all talk",
        members=roster,
        run_id="slow-1",
        options=pb.RunOptions(stream_deltas=False),
        budgets=spb.Budgets(max_output_tokens=32_768),
    )
    async with (
        start_server(providers={"scripted": big}, stream_buffer_events=2) as server,
        grpc.aio.insecure_channel(server.address, options=[("grpc.http2.bdp_probe", 0)]) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        call = stub.StartRun(request)
        status = pb.RUN_STATUS_UNSPECIFIED
        for _ in range(200):  # the reader reads nothing until the run is over
            await asyncio.sleep(0.05)
            try:
                got = await stub.GetRun(pb.GetRunRequest(run_id="slow-1", tenant="tenant-1"))
            except grpc.aio.AioRpcError:
                continue  # the call has not reached the server yet
            status = got.run.status
            if status == pb.RUN_STATUS_SUCCEEDED:
                break
        assert status == pb.RUN_STATUS_SUCCEEDED, "a slow reader does not hold the run back"
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for response in call:
                received.append(response.event)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "re-attach" in err.value.details()
        last = received[-1].seq if received else 0
        rest = await collect(
            stub.StreamRun(pb.StreamRunRequest(run_id="slow-1", tenant="tenant-1", after_seq=last))
        )
    events = received + rest
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(finals(events)) == 6 and kinds(events)[-1] == "run_completed"
