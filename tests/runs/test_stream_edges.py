"""Streams at the edges of a run's life, as a gateway sees them: a reader the server cut
off, a follower of a run another replica executes (its end, a resumed run's earlier end),
StreamRun's after_seq on a live run, a resumed run followed from its start, and a stream
whose run stops before its end (a drain that times out, a lease taken over). Found by
review; each failed before its fix."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import grpc
import psycopg
import pytest
from roundtable.domain.errors import StreamOverflow
from roundtable.domain.events import AssistantDelta, Envelope, SpeakerStarted
from roundtable.runs.follow import forward
from roundtable.runs.live import LiveRun, Subscription
from roundtable.store.base import RunRecord, RunStatus, StoredEvent
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, kinds, member, model_ref, read_until, start_request
from support.scripted import ScriptedProvider
from support.stores import run_record


class SlowBig(ScriptedProvider):
    async def complete(self, target, call, *, api_key, on_text):
        from support.scripted import member_name

        await asyncio.sleep(5.0 if member_name(call) == "F" else 0)
        return await super().complete(target, call, api_key=api_key, on_text=on_text)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_overflow_does_not_cancel_the_run(start_server):
    big = SlowBig(reply=lambda call, attempt: "word " * 400_000)
    roster = [member(m, m.upper(), model=model_ref("scripted", "big")) for m in "abcdef"]
    options = pb.RunOptions(stream_deltas=False, disconnect_policy=pb.DISCONNECT_POLICY_CANCEL)
    request = start_request("@all talk", members=roster, run_id="ov-1", options=options)
    async with (
        start_server(providers={"scripted": big}, stream_buffer_events=2) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        call = stub.StartRun(request)
        await asyncio.sleep(2.0)  # a slow reader: the server-side buffer overflows
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for response in call:
                received.append(response.event)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        last = received[-1].seq if received else 0
        rest = await collect(  # re-attach, as the error says
            stub.StreamRun(pb.StreamRunRequest(run_id="ov-1", tenant="tenant-1", after_seq=last))
        )
    tail = kinds(rest)[-1]
    cancelled = [e.run_cancelled.reason for e in rest if e.WhichOneof("payload") == "run_cancelled"]
    assert tail == "run_completed", f"the run ended {tail} {cancelled}"


def ev(seq: int, run_id: str = "f-1", **payload) -> StoredEvent:
    e = epb.RunEvent(run_id=run_id, seq=seq, **payload)
    return StoredEvent(seq, e.WhichOneof("payload"), e.SerializeToString())


def run_of_another_replica(run_id: str, thread_id: str) -> RunRecord:
    """A running run whose live lease is held by replica "other-replica"."""
    now = time.time()
    return RunRecord(
        tenant="tenant-1",
        run_id=run_id,
        thread_id=thread_id,
        fingerprint="x3:0",
        status=RunStatus.RUNNING,
        created_at=now,
        updated_at=now,
        owner="other-replica",
        lease_until=now + 60,
    )


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_follower_delivers_the_terminal_event(server, stub, monkeypatch):
    store = server.store
    # A run that replica "other" executes (live lease), with its first event in the log.
    record = run_of_another_replica("f-1", "t-f")
    assert await store.create_run(record)
    await store.append_event("tenant-1", "f-1", ev(1, run_started=epb.RunStarted(thread_id="t-f")))

    real_get_run = store.get_run
    calls = {"n": 0}

    async def get_run(tenant, run_id):
        calls["n"] += 1
        if calls["n"] == 2:  # the pump's first registry read, right after an empty log read
            # Meanwhile the other replica logs its terminal event and finishes the run.
            await store.append_event("tenant-1", "f-1", ev(2, run_completed=epb.RunCompleted()))
            record.status, record.last_seq = RunStatus.SUCCEEDED, 2
            assert await store.finish_run(record, "other-replica")
        return await real_get_run(tenant, run_id)

    monkeypatch.setattr(store, "get_run", get_run)
    events = await collect(stub.StreamRun(pb.StreamRunRequest(run_id="f-1", tenant="tenant-1")))
    got = [(e.seq, e.WhichOneof("payload")) for e in events]
    assert got == [(1, "run_started"), (2, "run_completed")], got


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_follower_of_a_run_parked_elsewhere_reads_less_often_then_catches_up(
    server, stub, monkeypatch
):
    """A run waits for a person on another replica: its follower backs off (two queries
    every 50 ms for minutes would be the store's heaviest load), then streams the resumed
    run to its end."""
    store = server.store
    record = run_of_another_replica("fp-1", "t-fp")
    record.status = RunStatus.AWAITING_APPROVAL
    assert await store.create_run(record)
    await store.append_event(
        "tenant-1", "fp-1", ev(1, "fp-1", run_started=epb.RunStarted(thread_id="t-fp"))
    )
    real_get_run = store.get_run
    reads: list[float] = []

    async def get_run(tenant, run_id):
        if run_id == "fp-1":
            reads.append(time.monotonic())
        return await real_get_run(tenant, run_id)

    monkeypatch.setattr(store, "get_run", get_run)

    async def other_replica_resumes():
        await asyncio.sleep(2.0)
        parked_reads = len(reads)
        record.status = RunStatus.RUNNING
        await store.update_run(record)
        await store.append_event(
            "tenant-1", "fp-1", ev(2, "fp-1", run_completed=epb.RunCompleted())
        )
        record.status, record.last_seq = RunStatus.SUCCEEDED, 2
        assert await store.finish_run(record, "other-replica")
        return parked_reads

    resumer = asyncio.create_task(other_replica_resumes())
    events = await asyncio.wait_for(
        collect(stub.StreamRun(pb.StreamRunRequest(run_id="fp-1", tenant="tenant-1"))), 10
    )
    parked_reads = await resumer
    assert kinds(events) == ["run_started", "run_completed"]
    # 50 ms apart that would be 40 reads; backing off 0.05 -> 1 s, about 7.
    assert 3 <= parked_reads <= 10, parked_reads


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_follower_of_a_resumed_run_follows_to_its_real_end(server, stub):
    store = server.store
    record = run_of_another_replica("fr-1", "t-fr")
    assert await store.create_run(record)
    # Execution 1 was cancelled; execution 2 (a resume, on the other replica) is live.
    for e in (
        ev(1, "fr-1", run_started=epb.RunStarted(thread_id="t-fr")),
        ev(2, "fr-1", run_cancelled=epb.RunCancelled(reason="cancel_requested")),
        ev(3, "fr-1", run_started=epb.RunStarted(thread_id="t-fr", resumed=True)),
    ):
        await store.append_event("tenant-1", "fr-1", e)

    async def other_replica_finishes():
        await asyncio.sleep(0.3)
        await store.append_event(
            "tenant-1", "fr-1", ev(4, "fr-1", run_completed=epb.RunCompleted())
        )
        record.status, record.last_seq = RunStatus.SUCCEEDED, 4
        await store.finish_run(record, "other-replica")

    finisher = asyncio.create_task(other_replica_finishes())
    events = await asyncio.wait_for(
        collect(stub.StreamRun(pb.StreamRunRequest(run_id="fr-1", tenant="tenant-1"))), 10
    )
    await finisher
    got = [(e.seq, k) for e, k in zip(events, kinds(events), strict=True)]
    assert got[-1] == (4, "run_completed"), f"StreamRun ended early: {got}"


SLOW = spb.ModelRef(
    target=spb.ModelTarget(provider="offline", model="slow", base_url="offline:?token_delay_ms=15")
)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_live_stream_respects_after_seq(server, stub):
    roster = [
        member(c, n, model=SLOW) for c, n in zip("abcd", ["Al", "Bo", "Cy", "Di"], strict=True)
    ]
    request = start_request("@all hi", members=roster, run_id="as-1", thread_id="t-as")
    call = stub.StartRun(request)
    async for r in call:
        if r.event.WhichOneof("payload") == "speaker_started":
            break
    try:
        got = await collect(
            stub.StreamRun(pb.StreamRunRequest(run_id="as-1", tenant="tenant-1", after_seq=50))
        )
        code = grpc.StatusCode.OK
    except grpc.aio.AioRpcError as err:
        got, code = [], err.code()
    await collect(call)
    bad = sorted({e.seq for e in got if e.seq <= 50})
    assert not bad, f"status {code}; events with seq <= after_seq=50 delivered: {bad}"


def slow_request(**kw):
    roster = [
        member(c, n, f"Member {n}.", model=SLOW)
        for c, n in zip("abcd", ["Al", "Bo", "Cy", "Di"], strict=True)
    ]
    return start_request("@all how was your day?", members=roster, **kw)


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_stream_run_on_live_resumed_run_delivers_each_event_once(server, stub, monkeypatch):
    store = server.store
    request = slow_request(run_id="dup-1", thread_id="t-dup")
    # Execution 1: cancelled after its first speaker started.
    call = stub.StartRun(request)
    await read_until(call, lambda e: e.WhichOneof("payload") == "speaker_started")
    await stub.CancelRun(pb.CancelRunRequest(run_id="dup-1", tenant="tenant-1"))
    first = await collect(call)
    last = first[-1].seq
    assert first[-1].WhichOneof("payload") == "run_cancelled"

    committed = asyncio.Event()
    real_append = store.append_event

    async def append_then_slow_reply(tenant, run_id, event: StoredEvent, **kw):
        mark = await real_append(tenant, run_id, event, **kw)
        if event.seq == last + 2 and not committed.is_set():
            # The row is committed; the reply is still on its way back over the network.
            committed.set()
            await asyncio.sleep(0.3)
        return mark

    monkeypatch.setattr(store, "append_event", append_then_slow_reply)
    # Execution 2 (resume), followed by a StreamRun from the start while it is live.
    resumed = asyncio.create_task(collect(stub.StartRun(request)))
    await asyncio.wait_for(committed.wait(), 10)
    streamed = await collect(stub.StreamRun(pb.StreamRunRequest(run_id="dup-1", tenant="tenant-1")))
    await resumed

    durable = [e.seq for e in streamed if e.WhichOneof("payload") != "assistant_delta"]
    dupes = {s: n for s, n in Counter(durable).items() if n > 1}
    assert not dupes, f"durable events delivered more than once (seq: count): {dupes}"
    assert durable == list(range(1, durable[-1] + 1))


TERMINAL = {"run_completed", "run_cancelled", "run_failed"}
VERY_SLOW = spb.ModelRef(
    target=spb.ModelTarget(provider="offline", model="slow", base_url="offline:?token_delay_ms=300")
)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_stream_during_drain(start_server):
    roster = [member(c, n, model=VERY_SLOW) for c, n in zip("ab", ["Al", "Bo"], strict=True)]
    request = start_request("@all hi", members=roster, run_id="dr-1", thread_id="t-dr")
    stack = contextlib.AsyncExitStack()
    server = await stack.enter_async_context(start_server(grace_seconds=0.2))
    async with grpc.aio.insecure_channel(server.address) as channel:
        call = pb_grpc.OrchestratorServiceStub(channel).StartRun(request)
        events = []
        async for r in call:
            events.append(r.event)
            if r.event.WhichOneof("payload") == "speaker_started":
                break
        stopping = asyncio.create_task(stack.aclose())  # SIGTERM: drain, then stop
        try:
            async for r in call:
                events.append(r.event)
        except grpc.aio.AioRpcError:
            pass
        code = await call.code()
        await stopping
    assert code == grpc.StatusCode.UNAVAILABLE, kinds(events)
    assert not set(kinds(events)) & TERMINAL


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_stream_of_a_run_whose_lease_was_taken_over(start_server, store_url):
    roster = [
        member(c, n, model=SLOW) for c, n in zip("abcd", ["Al", "Bo", "Cy", "Di"], strict=True)
    ]
    request = start_request("@all hi", members=roster, run_id="ll-1", thread_id="t-ll")
    async with (
        start_server(lease_seconds=0.6) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        call = stub.StartRun(request)
        events = []
        async for r in call:
            events.append(r.event)
            if r.event.WhichOneof("payload") == "speaker_started":
                # Another replica takes the run over (as after a long pause of this one).
                with psycopg.connect(store_url, autocommit=True) as conn:
                    conn.execute(
                        "UPDATE rt_runs SET owner='replica-b', lease_until=%s WHERE run_id='ll-1'",
                        (time.time() + 60,),
                    )
                break
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for r in call:
                events.append(r.event)
    # Not a stream that ended OK without its run's end: told to send the same StartRun.
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, kinds(events)
    assert not set(kinds(events)) & TERMINAL


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_replica_whose_run_was_taken_over_writes_nothing_more(start_server, store_url):
    """Its lease (60 s) is still being renewed as far as it knows: only the fence on the
    event log's append stops it, at its next event."""
    request = slow_request(run_id="fx-1", thread_id="t-fx")
    async with (
        start_server(lease_seconds=60) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        call = pb_grpc.OrchestratorServiceStub(channel).StartRun(request)
        events = await read_until(call, lambda e: e.WhichOneof("payload") == "speaker_started")
        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE rt_runs SET owner='replica-b', lease_until=%s WHERE run_id='fx-1'",
                (time.time() + 60,),
            )
            taken_at = conn.execute("SELECT max(seq) FROM rt_events WHERE run_id='fx-1'")
            last_seq = taken_at.fetchone()[0]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for r in call:
                events.append(r.event)
        with psycopg.connect(store_url, autocommit=True) as conn:
            after = conn.execute("SELECT max(seq) FROM rt_events WHERE run_id='fx-1'").fetchone()
            row = conn.execute("SELECT owner, status FROM rt_runs WHERE run_id='fx-1'").fetchone()
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, kinds(events)
    assert after[0] == last_seq, "nothing appended to the log of a run another replica owns"
    assert row == ("replica-b", "running"), "nor its registry row written"
    assert max(e.seq for e in events) == last_seq


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_start_run_attaching_to_a_live_resumed_run_streams_its_whole_log(server, stub):
    request = slow_request(run_id="at-1", thread_id="t-at")
    call = stub.StartRun(request)
    first = await read_until(call, lambda e: e.WhichOneof("payload") == "speaker_started")
    await stub.CancelRun(pb.CancelRunRequest(run_id="at-1", tenant="tenant-1"))
    first += await collect(call)

    # The resume runs; the same StartRun again attaches to it while it is live. Both
    # streams, like a follower on another replica or a replay once it ends, are the
    # run's log from seq 1: the first execution, then the second.
    resuming = stub.StartRun(request)
    second = await read_until(resuming, lambda e: e.WhichOneof("payload") == "speaker_started")
    attached = await collect(stub.StartRun(request))
    second += await collect(resuming)

    def durable(events):
        return [e for e in events if e.WhichOneof("payload") != "assistant_delta"]

    assert durable(second)[: len(durable(first))] == durable(first)
    assert durable(attached) == durable(second)
    assert [k for k in kinds(attached) if k in TERMINAL | {"run_started"}] == [
        "run_started",
        "run_cancelled",
        "run_started",
        "run_completed",
    ]


async def test_a_slow_reader_of_a_taken_over_run_is_bounded_like_any_other() -> None:
    # After a follower takes a run over, its events reach the client's stream through a
    # forwarder: a reader that does not read loses deltas, then gets StreamOverflow, and
    # the server never holds more than its buffer for it.
    record = run_record("r", tenant="t", thread_id="th", created_at=0, updated_at=0)
    live = LiveRun(request=None, record=record, buffer=16)  # type: ignore[arg-type]
    client = Subscription([], ended=False, buffer=16)
    forward_task = asyncio.create_task(forward(live.subscribe(0), client, 0))
    for seq in range(1, 200):
        started = SpeakerStarted(step=seq, member_id="m", reply_id=f"x{seq}", attempt=1)
        live.publish(Envelope(run_id="r", seq=seq, emitted_at=0.0, event=started))
        delta = AssistantDelta(reply_id=f"x{seq}", text="t" * 100, attempt=1)
        live.publish(Envelope(run_id="r", seq=seq, emitted_at=0.0, event=delta))
        await asyncio.sleep(0)
    await asyncio.wait_for(forward_task, 1.0)
    assert isinstance(client.error, StreamOverflow)
    assert len([e async for e in client]) <= 16 + 1


async def test_a_stored_log_without_its_end_ends_the_stream_unavailable(start_server) -> None:
    # A log nobody closed (a replica's run whose lease ran out on a shared store, before any
    # replica resumed it) is not an end: the stream says "send the same StartRun".
    async with start_server() as server:
        now = time.time()
        run = RunRecord(
            tenant="tenant-1",
            run_id="open-log",
            thread_id="t-open",
            fingerprint="f",
            status=RunStatus.INTERRUPTED,
            created_at=now,
            updated_at=now,
            last_seq=1,
        )
        assert await server.store.create_run(run)
        started = epb.RunEvent(run_id="open-log", seq=1)
        started.run_started.thread_id = "t-open"
        planned = epb.RunEvent(run_id="open-log", seq=2)
        planned.plan_created.steps.add(member_id="a", reply_id="open-log#0", task="answer")
        for event in (started, planned):
            kind = event.WhichOneof("payload") or ""
            stored = StoredEvent(event.seq, kind, event.SerializeToString())
            await server.store.append_event("tenant-1", "open-log", stored)
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.OrchestratorServiceStub(channel)
            got = []
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async for response in stub.StreamRun(
                    pb.StreamRunRequest(run_id="open-log", tenant="tenant-1")
                ):
                    got.append(response.event.seq)
            assert got == [1, 2]
            assert ended.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "send the same StartRun" in (ended.value.details() or "")
            # A 继续 turn takes it over: the old log gets the end it never had (not
            # retryable: the continuing run answers for it), and its stream ends OK there.
            continued = await collect(
                stub.StartRun(start_request("继续", run_id="open-2", thread_id="t-open"))
            )
            assert [
                f.assistant_final.member_id for f in continued if f.HasField("assistant_final")
            ] == ["a"]
            old = await collect(
                stub.StreamRun(pb.StreamRunRequest(run_id="open-log", tenant="tenant-1"))
            )
    assert [e.seq for e in old] == [1, 2, 3]
    closed = old[-1].run_failed
    assert (closed.code, closed.retryable) == ("RUN_INTERRUPTED", False)
    assert "open-2" in closed.message


async def test_a_run_is_reported_ended_only_once_its_end_is_written(server, stub, monkeypatch):
    """GetRun while the terminal event and the final row are being written says running;
    once they are, succeeded, and the stream's last event is the one written."""
    store = server.store
    real_end_run = store.end_run
    writing, release = asyncio.Event(), asyncio.Event()

    async def end_run(record, holder, event):
        writing.set()
        await release.wait()
        await real_end_run(record, holder, event)

    monkeypatch.setattr(store, "end_run", end_run)
    events = asyncio.create_task(collect(stub.StartRun(start_request("报数", run_id="end-1"))))
    await asyncio.wait_for(writing.wait(), 10)
    during = (await stub.GetRun(pb.GetRunRequest(run_id="end-1", tenant="tenant-1"))).run
    release.set()
    streamed = await asyncio.wait_for(events, 10)
    after = (await stub.GetRun(pb.GetRunRequest(run_id="end-1", tenant="tenant-1"))).run
    assert during.status == pb.RUN_STATUS_RUNNING
    assert kinds(streamed)[-1] == "run_completed"
    assert (after.status, after.last_seq) == (pb.RUN_STATUS_SUCCEEDED, streamed[-1].seq)
