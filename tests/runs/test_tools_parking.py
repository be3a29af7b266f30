"""Runs parked for approval when the process is full, when their replica lost them, and
when a new turn of their thread arrives on another replica.

Over a real server (both stores, replicas on Postgres) and the test MCP server, whose
`note` counts its executions per idempotency key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from roundtable.server import RunningServer
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.approvals import (
    APPROVE,
    Reader,
    reason_of,
    resolve,
    sent_key,
    tool_request,
    waiting_run,
)
from support.builders import collect, finals, kinds, start_request
from support.mcp_server import McpServerProcess
from support.stores import query

SLOW_MS = 1500
"""How long the run that takes the process's only place keeps it."""


def slow_request(run_id: str) -> pb.StartRunRequest:
    """A single chat whose model answers after SLOW_MS: it holds a place that long."""
    slow = spb.ModelTarget(provider="offline", model="m", base_url=f"offline:?latency_ms={SLOW_MS}")
    return start_request(
        "hello",
        run_id=run_id,
        thread_id=f"t-{run_id}",
        default_model=spb.ModelRef(target=slow),
        kind=spb.SESSION_KIND_SINGLE,
    )


async def status_of(stub: pb_grpc.OrchestratorServiceStub, run_id: str) -> pb.Run:
    return (await stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant="tenant-1"))).run


async def until_status(stub: pb_grpc.OrchestratorServiceStub, run_id: str, status: int) -> None:
    """Returns once the run has `status` (a moment after its StartRun was sent); fails
    naming the status (or the error) last seen when it does not within 10 s."""
    seen: object = "nothing"
    try:
        async with asyncio.timeout(10):
            while True:
                try:
                    seen = (await status_of(stub, run_id)).status
                except grpc.aio.AioRpcError as error:  # NOT_FOUND: not started yet
                    seen = error.code()
                if seen == status:
                    return
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"{run_id}: status {status} never came; last seen {seen}") from None


@contextlib.asynccontextmanager
async def parked_in_a_full_process(
    start_server, request: pb.StartRunRequest
) -> AsyncIterator[tuple[pb_grpc.OrchestratorServiceStub, Reader, epb.PermissionRequired]]:
    """A server that runs one run at a time, with `request`'s run parked on its request."""
    async with (
        start_server(max_runs=1) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        reader = Reader(stub.StartRun(request))
        asked = (await reader.until("permission_required")).permission_required
        await waiting_run(stub, request.context.run_id)
        yield stub, reader, asked


@pytest.mark.parametrize("how", ["decision", "expiry"])
async def test_a_parked_run_that_finds_the_process_full_goes_on_once_a_place_frees(
    start_server, mcp: McpServerProcess, how: str
) -> None:
    """Its decision (or its request's expiry) comes while another run holds the process's
    only place: it goes on by itself once that run ends (before, it stayed parked)."""
    timeout = 1 if how == "expiry" else 0
    request = tool_request("use note for buy milk", mcp, "full", approval_timeout_s=timeout)
    async with parked_in_a_full_process(start_server, request) as (stub, reader, asked):
        busy = asyncio.ensure_future(collect(stub.StartRun(slow_request("busy"))))
        await until_status(stub, "busy", pb.RUN_STATUS_RUNNING)
        if how == "decision":
            answer = await stub.ResolvePermission(
                resolve("full", asked.permission_request_id, APPROVE)
            )
            assert answer.resumed, "it goes on without another StartRun"
        else:
            await asyncio.sleep(1.1)  # the request's time runs out while busy runs
            # Nobody can decide the expired request any more.
            assert not (await status_of(stub, "full")).pending_permissions
        assert (await status_of(stub, "full")).status == pb.RUN_STATUS_AWAITING_APPROVAL
        assert mcp.counts("note") == {}
        assert kinds(await busy)[-1] == "run_completed"
        events = await reader.end()
    assert kinds(events)[-1] == "run_completed"
    (final,) = finals(events)
    if how == "decision":
        assert "noted 'buy milk' (1)" in final.content
        assert mcp.counts("note") == {sent_key("full", asked.permission_request_id): 1}
    else:
        assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_EXPIRED]
        assert mcp.counts("note") == {}


async def test_a_cancel_ends_a_parked_run_at_once_in_a_full_process(
    start_server, mcp: McpServerProcess
) -> None:
    """A cancelled parked run only writes its end (no model, no tool): it needs no place.
    Review: it waited for one; CancelRun answered with the run still AWAITING_APPROVAL,
    and its stream and its thread stayed busy until another run ended."""
    request = tool_request("use note for buy milk", mcp, "full-cancel")
    async with parked_in_a_full_process(start_server, request) as (stub, reader, _):
        busy = asyncio.ensure_future(collect(stub.StartRun(slow_request("busy-cancel"))))
        await until_status(stub, "busy-cancel", pb.RUN_STATUS_RUNNING)
        answer = await stub.CancelRun(pb.CancelRunRequest(run_id="full-cancel", tenant="tenant-1"))
        assert answer.run.status == pb.RUN_STATUS_CANCELLED
        events = await reader.end()
        assert not busy.done(), "it ended while the other run held the place"
        assert kinds(await busy)[-1] == "run_completed"
    assert kinds(events)[-1] == "run_cancelled"
    assert mcp.counts("note") == {}


async def test_a_run_is_said_to_wait_only_once_its_place_is_free(
    start_server, mcp: McpServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GetRun says AWAITING_APPROVAL once the parked run has let its place go: said while
    its row was still being written (slow under load, as in a CI run on Postgres), the
    next run a gateway started on that word was refused for want of room."""
    request = tool_request("use note for buy milk", mcp, "slow-park")
    async with (
        start_server(max_runs=1) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        real = server.store.park_run

        async def slow_park(*args: object, **kwargs: object) -> bool:
            await asyncio.sleep(0.5)
            return await real(*args, **kwargs)

        monkeypatch.setattr(server.store, "park_run", slow_park)
        stub = pb_grpc.OrchestratorServiceStub(channel)
        reader = Reader(stub.StartRun(request))
        await reader.until("permission_required")
        await waiting_run(stub, "slow-park")
        busy = await collect(stub.StartRun(slow_request("busy-after-park")))
        assert kinds(busy)[-1] == "run_completed"
        await stub.CancelRun(pb.CancelRunRequest(run_id="slow-park", tenant="tenant-1"))
        assert kinds(await reader.end(wait_s=10))[-1] == "run_cancelled"


async def test_a_parked_run_a_queued_run_of_its_thread_waits_for_goes_on_in_a_full_process(
    start_server, mcp: McpServerProcess
) -> None:
    """At max-runs 1 the next turn of the thread (ENQUEUE) takes the only place to wait for
    the parked run: the parked run must still go on once decided, or both wait forever."""
    first = tool_request("use note for buy milk", mcp, "q-1")
    second = tool_request("use weather for Rome", mcp, "q-2")
    second.context.thread_id = first.context.thread_id
    second.options.busy_thread_policy = pb.BUSY_THREAD_POLICY_ENQUEUE
    async with parked_in_a_full_process(start_server, first) as (stub, reader, asked):
        queued = Reader(stub.StartRun(second))
        await until_status(stub, "q-2", pb.RUN_STATUS_QUEUED)
        await stub.ResolvePermission(resolve("q-1", asked.permission_request_id, APPROVE))
        first_events = await reader.end(wait_s=10)
        second_events = await queued.end(wait_s=10)
    assert kinds(first_events)[-1] == "run_completed"
    assert kinds(second_events)[-1] == "run_completed"
    assert mcp.counts("note") == {sent_key("q-1", asked.permission_request_id): 1}


def resume_fails_once(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The store's next `resume_parked` fails (the store went away), later ones go through;
    the list holds the failed call's arguments once it happened."""
    real, failures = server.store.resume_parked, []

    async def fails_once(*args: object, **kwargs: object) -> bool:
        if not failures:
            failures.append(args)
            raise OSError("the store went away")
        return await real(*args, **kwargs)

    monkeypatch.setattr(server.store, "resume_parked", fails_once)
    return failures


async def test_a_decision_made_as_the_run_parks_is_acted_on_when_the_store_fails_to_say(
    server: RunningServer,
    stub: pb_grpc.OrchestratorServiceStub,
    mcp: McpServerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decision lands while the run writes its parked row; the look for decisions made
    meanwhile then meets a store error. Review: the error escaped, and the run waited
    for the decision it had until its request expired."""
    parked, failed = asyncio.Event(), []
    park, tool_call = server.store.park_run, server.store.tool_call

    async def slow_park(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.5)  # the decision comes meanwhile
        try:
            return await park(*args, **kwargs)
        finally:
            parked.set()

    async def fails_once_parked(*args: Any, **kwargs: Any) -> Any:
        if parked.is_set() and not failed:
            failed.append(args)
            raise OSError("the store is gone for a moment")
        return await tool_call(*args, **kwargs)

    monkeypatch.setattr(server.store, "park_run", slow_park)
    monkeypatch.setattr(server.store, "tool_call", fails_once_parked)
    reader = Reader(stub.StartRun(tool_request("use note for buy milk", mcp, "meanwhile")))
    asked = (await reader.until("permission_required")).permission_required
    await stub.ResolvePermission(resolve("meanwhile", asked.permission_request_id, APPROVE))
    events = await reader.end(wait_s=10)
    assert failed, "the store failed as the run looked"
    assert kinds(events)[-1] == "run_completed"
    assert mcp.counts("note") == {sent_key("meanwhile", asked.permission_request_id): 1}


async def test_a_resume_that_meets_a_store_error_stays_parked_and_tries_again(
    start_server, mcp: McpServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision is recorded, but the store fails as the run's row goes back to running:
    the decision stands (answered OK, `resumed`: the run goes on without another StartRun),
    the run stays parked for now (the tool does not run), and it goes on by itself a
    second later, once, without another decision or StartRun."""
    request = tool_request("use note for buy milk", mcp, "flaky")
    async with (
        start_server() as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        reader = Reader(stub.StartRun(request))
        asked = (await reader.until("permission_required")).permission_required
        await waiting_run(stub, "flaky")
        failures = resume_fails_once(server, monkeypatch)
        answer = await stub.ResolvePermission(
            resolve("flaky", asked.permission_request_id, APPROVE)
        )
        assert answer.resumed and answer.decision == APPROVE
        assert answer.run.status == pb.RUN_STATUS_AWAITING_APPROVAL
        assert (await status_of(stub, "flaky")).status == pb.RUN_STATUS_AWAITING_APPROVAL
        assert mcp.counts("note") == {}
        events = await reader.end(wait_s=10)
    assert len(failures) == 1
    assert kinds(events)[-1] == "run_completed"
    (final,) = finals(events)
    assert "noted 'buy milk' (1)" in final.content
    assert mcp.counts("note") == {sent_key("flaky", asked.permission_request_id): 1}


async def test_a_cancel_whose_resume_meets_a_store_error_is_answered_and_ends_the_run(
    start_server, mcp: McpServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CancelRun of a parked run whose row fails to go back to running: the cancel is
    recorded (answered OK, not INTERNAL), and the run ends cancelled by itself a second
    later, its waiting tool never run (outside review)."""
    request = tool_request("use note for buy milk", mcp, "flaky-cancel")
    async with (
        start_server() as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        reader = Reader(stub.StartRun(request))
        await reader.until("permission_required")
        await waiting_run(stub, "flaky-cancel")
        failures = resume_fails_once(server, monkeypatch)
        cancel = pb.CancelRunRequest(run_id="flaky-cancel", tenant="tenant-1")
        answer = await stub.CancelRun(cancel)
        assert answer.outcome == pb.CANCEL_OUTCOME_REQUESTED
        events = await reader.end(wait_s=10)
    assert len(failures) == 1
    assert kinds(events)[-1] == "run_cancelled"
    assert mcp.counts("note") == {}


def replicas_only(store_url: str) -> None:
    if not store_url.startswith("postgres"):
        pytest.skip("replicas share a Postgres store (one process owns a SQLite file)")


@pytest.mark.parametrize("noticed_by", ["a decision", "the watch", "a cancel"])
async def test_a_replica_that_lost_a_parked_run_leaves_it_to_the_one_that_took_it(
    start_server, store_url: str, mcp: McpServerProcess, noticed_by: str
) -> None:
    """A keeps a run parked but cannot renew its lease (its store is unreachable for that);
    B takes the run over at the gateway's StartRun and parks it again. A finds out, from a
    decision sent to it, from its watch once the store answers again, or after the run
    ended on B (cancelled there), and lets the run go: its stream ends RunOrphaned, and it
    never writes the row back to running nor runs the call (it did both before)."""
    replicas_only(store_url)
    row = "SELECT status, owner FROM rt_runs WHERE run_id = 'lost-1'"
    request = tool_request("use note for buy milk", mcp, "lost-1")
    async with (
        start_server(lease_seconds=1, replica_id="A") as a,
        start_server(lease_seconds=1, replica_id="B") as b,
        grpc.aio.insecure_channel(a.address) as to_a,
        grpc.aio.insecure_channel(b.address) as to_b,
    ):
        on_a = pb_grpc.OrchestratorServiceStub(to_a)
        on_b = pb_grpc.OrchestratorServiceStub(to_b)
        reader_a = Reader(on_a.StartRun(request))
        asked = (await reader_a.until("permission_required")).permission_required
        await waiting_run(on_a, "lost-1")
        renew = a.store.renew_parked

        async def unreachable(*args: object, **kwargs: object) -> set[tuple[str, str]]:
            raise ConnectionError("the store does not answer")

        a.store.renew_parked = unreachable  # type: ignore[method-assign]
        await asyncio.sleep(1.3)  # A's lease runs out
        reader_b = Reader(on_b.StartRun(request))
        async with asyncio.timeout(10):
            while query(store_url, row) != [("awaiting_approval", "B")]:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        if noticed_by == "a cancel":
            cancel = pb.CancelRunRequest(run_id="lost-1", tenant="tenant-1")
            await on_b.CancelRun(cancel)
            assert kinds(await reader_b.end())[-1] == "run_cancelled"
        if noticed_by == "the watch":
            a.store.renew_parked = renew  # type: ignore[method-assign]
        else:
            decision = resolve("lost-1", asked.permission_request_id, APPROVE)
            if noticed_by == "a decision":
                assert (await on_a.ResolvePermission(decision)).resumed, "B keeps the run"
            else:
                with pytest.raises(grpc.aio.AioRpcError) as late:
                    await on_a.ResolvePermission(decision)
                assert reason_of(late.value) == "PERMISSION_DECIDED"  # cancelled on B
        with pytest.raises(grpc.aio.AioRpcError) as orphaned:
            await reader_a.end()
        if noticed_by == "the watch":
            await on_b.ResolvePermission(resolve("lost-1", asked.permission_request_id, APPROVE))
        events_b = await reader_b.end()
    assert orphaned.value.code() == grpc.StatusCode.UNAVAILABLE
    assert reason_of(orphaned.value) == "RUN_ORPHANED"
    ended = "run_cancelled" if noticed_by == "a cancel" else "run_completed"
    assert kinds(events_b)[-1] == ended
    status = "cancelled" if noticed_by == "a cancel" else "succeeded"
    assert query(store_url, "SELECT status FROM rt_runs WHERE run_id = 'lost-1'") == [(status,)]
    ran = {} if noticed_by == "a cancel" else {sent_key("lost-1", asked.permission_request_id): 1}
    assert mcp.counts("note") == ran


async def test_a_stop_turn_on_another_replica_ends_a_run_parked_on_this_one(
    start_server, store_url: str, mcp: McpServerProcess
) -> None:
    replicas_only(store_url)
    first = tool_request("use note for buy milk", mcp, "tp-1")
    async with (
        start_server(replica_id="A") as a,
        start_server(replica_id="B") as b,
        grpc.aio.insecure_channel(a.address) as to_a,
        grpc.aio.insecure_channel(b.address) as to_b,
    ):
        on_a = pb_grpc.OrchestratorServiceStub(to_a)
        on_b = pb_grpc.OrchestratorServiceStub(to_b)
        reader = Reader(on_a.StartRun(first))
        await reader.until("permission_required")
        await waiting_run(on_a, "tp-1")
        # The thread is busy on every replica, not only on the one keeping the run.
        for stub, run_id in ((on_a, "tp-2"), (on_b, "tp-3")):
            other = tool_request("use weather for Rome", mcp, run_id)
            other.context.thread_id = first.context.thread_id
            other.options.busy_thread_policy = pb.BUSY_THREAD_POLICY_REJECT
            with pytest.raises(grpc.aio.AioRpcError) as busy:
                await collect(stub.StartRun(other))
            assert reason_of(busy.value) == "THREAD_BUSY", run_id
        stop = tool_request("停止", mcp, "tp-4")
        stop.context.thread_id = first.context.thread_id
        stopped = await collect(on_b.StartRun(stop))
        assert kinds(stopped)[-1] == "run_completed"
        events = await reader.end()
    assert kinds(events)[-1] == "run_cancelled"
    assert events[-1].run_cancelled.reason == "stop_directive"
    assert mcp.counts("note") == {}


async def test_a_cancel_on_another_replica_ends_a_parked_run_at_once_in_a_full_process(
    start_server, store_url: str, mcp: McpServerProcess
) -> None:
    """As a cancel here does: the cancel another replica recorded wakes the run without
    stopping it here, and (review) it waited for a place to write its end."""
    replicas_only(store_url)
    request = tool_request("use note for buy milk", mcp, "full-remote")
    async with (
        start_server(replica_id="A", max_runs=1) as a,
        start_server(replica_id="B") as b,
        grpc.aio.insecure_channel(a.address) as to_a,
        grpc.aio.insecure_channel(b.address) as to_b,
    ):
        on_a = pb_grpc.OrchestratorServiceStub(to_a)
        reader = Reader(on_a.StartRun(request))
        await reader.until("permission_required")
        await waiting_run(on_a, "full-remote")
        busy = asyncio.ensure_future(collect(on_a.StartRun(slow_request("busy-remote"))))
        await until_status(on_a, "busy-remote", pb.RUN_STATUS_RUNNING)
        on_b = pb_grpc.OrchestratorServiceStub(to_b)
        await on_b.CancelRun(pb.CancelRunRequest(run_id="full-remote", tenant="tenant-1"))
        events = await reader.end()
        assert not busy.done(), "it ended while the other run held the place"
        assert kinds(await busy)[-1] == "run_completed"
    assert kinds(events)[-1] == "run_cancelled"
    assert mcp.counts("note") == {}


@dataclasses.dataclass
class FullReplica:
    """Replica A, which runs one run at a time, with a run parked on its request and a
    slow run holding the place."""

    server: RunningServer
    stub: pb_grpc.OrchestratorServiceStub
    reader: Reader
    """The parked run's stream."""
    asked: epb.PermissionRequired
    busy: asyncio.Future[list[epb.RunEvent]]
    """The slow run's events to come."""


@contextlib.asynccontextmanager
async def a_full_replica_with_a_run_parked(
    start_server, request: pb.StartRunRequest
) -> AsyncIterator[FullReplica]:
    """`FullReplica`, with `request`'s run the one parked."""
    run_id = request.context.run_id
    async with (
        start_server(replica_id="A", max_runs=1) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        reader = Reader(stub.StartRun(request))
        asked = (await reader.until("permission_required")).permission_required
        await waiting_run(stub, run_id)
        busy = asyncio.ensure_future(collect(stub.StartRun(slow_request(f"busy-{run_id}"))))
        await until_status(stub, f"busy-{run_id}", pb.RUN_STATUS_RUNNING)
        yield FullReplica(server, stub, reader, asked, busy)


async def test_a_run_waiting_for_a_place_is_not_woken_by_the_watch_for_its_own_decision(
    start_server, store_url: str, mcp: McpServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decided while the process is full, the run waits for a place. The watch of parked
    runs kept finding its decision and waking it every 0.2 s, each time for a lock and a
    read of its row that only found no room again (review). It goes on once room frees."""
    replicas_only(store_url)
    request = tool_request("use note for buy milk", mcp, "full-quiet")
    async with a_full_replica_with_a_run_parked(start_server, request) as full:
        reads: list[str] = []
        real_get_run = full.server.store.get_run

        async def counted(tenant: str, run_id: str) -> object:
            reads.append(run_id)
            return await real_get_run(tenant, run_id)

        monkeypatch.setattr(full.server.store, "get_run", counted)
        await full.stub.ResolvePermission(
            resolve("full-quiet", full.asked.permission_request_id, APPROVE)
        )
        await asyncio.sleep(1.0)  # five of the watch's polls, the busy run still running
        assert not full.busy.done()
        assert reads.count("full-quiet") <= 1, reads  # the decision's own look, not one a poll
        assert kinds(await full.busy)[-1] == "run_completed"
        events = await full.reader.end(wait_s=10)
    assert kinds(events)[-1] == "run_completed"
    assert mcp.counts("note") == {sent_key("full-quiet", full.asked.permission_request_id): 1}


async def test_a_place_freed_while_a_decided_run_looks_for_a_cancel_is_not_lost(
    start_server, store_url: str, mcp: McpServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: with no room, the decided run reads its row for a cancel; a place that
    freed during that read found nobody waiting, and the watch no longer wakes a run that
    waits for room, so it waited for another run to end, on an idle replica forever."""
    replicas_only(store_url)
    request = tool_request("use note for buy milk", mcp, "race-room")
    async with a_full_replica_with_a_run_parked(start_server, request) as full:
        coordination = full.server.manager.coordination
        real_look, real_decided = coordination.cancel_recorded, full.server.store.decided_parked
        looking = False

        async def slow_look(record):  # the busy run ends while this read is in flight
            nonlocal looking
            reason = await real_look(record)
            if record.run_id == "race-room":
                looking = True
                await full.busy
                await asyncio.sleep(0.05)
            looking = False
            return reason

        async def decided(owner):  # the real read takes ms: no poll of the watch falls in it
            rows = await real_decided(owner)
            return [] if looking else rows

        monkeypatch.setattr(coordination, "cancel_recorded", slow_look)
        monkeypatch.setattr(full.server.store, "decided_parked", decided)
        await full.stub.ResolvePermission(
            resolve("race-room", full.asked.permission_request_id, APPROVE)
        )
        assert kinds(await full.busy)[-1] == "run_completed"
        events = await full.reader.end(wait_s=5)
    assert kinds(events)[-1] == "run_completed"
