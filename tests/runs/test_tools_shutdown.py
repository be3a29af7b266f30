"""Runs with tool calls when their server drains: a shutdown interrupts a run; unlike a
cancel or 停止, it decides nothing for the person asked (or about to be asked).

Over a real server (both stores) and the test MCP server (tests/support/mcp_server.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
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
    one_waits_while_others_answer,
    resolve,
    sent_key,
    tool_request,
)
from support.builders import collect, finals, kinds, last_execution, of_kind, start_request
from support.mcp_server import McpServerProcess
from support.stores import query

ServerFactory = Callable[..., AbstractAsyncContextManager[RunningServer]]


@asynccontextmanager
async def serving(start_server: ServerFactory) -> AsyncIterator[pb_grpc.OrchestratorServiceStub]:
    """A client of a new server with default settings."""
    async with (
        start_server() as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        yield pb_grpc.OrchestratorServiceStub(channel)


@asynccontextmanager
async def draining_with_a_stream_open(
    start_server: ServerFactory,
    request: pb.StartRunRequest,
    until: str,
    prepare: Callable[[RunningServer], None] = lambda _: None,
) -> AsyncIterator[tuple[Reader, pb_grpc.OrchestratorServiceStub]]:
    """A server (`prepare`d) with `request`'s stream open; once the stream has brought
    `until`, the server drains (a 5 s grace) while the client keeps its stream: the run is
    stopped by the shutdown alone (a client that left would have cancelled it). Yields the
    stream and a client of the server, for calls during the drain."""
    channel: grpc.aio.Channel | None = None
    try:
        async with start_server(grace_seconds=5.0) as server:
            prepare(server)
            channel = grpc.aio.insecure_channel(server.address)
            stub = pb_grpc.OrchestratorServiceStub(channel)
            reader = Reader(stub.StartRun(request))
            await reader.until(until)
            yield reader, stub
        await asyncio.wait({reader.task}, timeout=5)  # the drain ended the stream
    finally:
        if channel is not None:
            await channel.close()


async def approve_on_a_new_server(
    start_server: ServerFactory, request: pb.StartRunRequest, mcp: McpServerProcess
) -> None:
    """The next server lists the call as waiting; approved there, the same StartRun runs the
    tool once and completes the run."""
    run_id = request.context.run_id
    async with serving(start_server) as stub:
        run = (await stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant="tenant-1"))).run
        assert run.status == pb.RUN_STATUS_AWAITING_APPROVAL
        (asked,) = run.pending_permissions
        await stub.ResolvePermission(resolve(run_id, asked.permission_request_id, APPROVE))
        events = await collect(stub.StartRun(request))
    assert kinds(events)[-1] == "run_completed"
    (final,) = finals(events)
    assert "noted 'buy milk' (1)" in final.content
    assert mcp.counts("note") == {sent_key(run_id, asked.permission_request_id): 1}


async def cancelled_in_the_drain(
    start_server: ServerFactory, request: pb.StartRunRequest, until: str
) -> Reader:
    """`request`'s stream once it ended: its server drains once the stream brought `until`,
    and the run is cancelled 0.2 s into the drain's grace (its speakers still answer)."""
    cancel = pb.CancelRunRequest(run_id=request.context.run_id, tenant="tenant-1")
    async with draining_with_a_stream_open(start_server, request, until) as (reader, stub):

        async def cancel_in_the_grace() -> None:
            await asyncio.sleep(0.2)
            await stub.CancelRun(cancel)

        cancelled = asyncio.ensure_future(cancel_in_the_grace())
    await cancelled
    return reader


def assert_told_to_resend(reader: Reader) -> None:
    """The drain ended the stream telling the client to send the same StartRun again."""
    error = reader.task.exception()
    assert isinstance(error, grpc.aio.AioRpcError), error
    assert error.code() == grpc.StatusCode.UNAVAILABLE


def slow_tool_request(mcp: McpServerProcess, run_id: str) -> pb.StartRunRequest:
    """`tool_request` whose model answers 600 ms after it is asked: the drain begins while
    it answers."""
    request = tool_request("use note for buy milk", mcp, run_id)
    slow = spb.ModelTarget(provider="offline", model="m", base_url="offline:?latency_ms=600")
    request.snapshot.session.default_model.CopyFrom(spb.ModelRef(target=slow))
    return request


def verdicts(store_url: str, run_id: str) -> list[Any]:
    return query(store_url, f"SELECT verdict FROM rt_tool_calls WHERE run_id = '{run_id}'")


async def park_then_restart(
    start_server: ServerFactory, request: pb.StartRunRequest
) -> pb.PermissionRequired:
    """Runs `request` until it waits for approval, then stops its server (and lets a
    replica's lease of it run out, on Postgres)."""
    async with (
        start_server(lease_seconds=1.0) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        reader = Reader(pb_grpc.OrchestratorServiceStub(channel).StartRun(request))
        asked = (await reader.until("permission_required")).permission_required
    await asyncio.sleep(1.2)
    return asked


async def test_a_call_asked_for_during_the_drain_waits_for_the_person(
    start_server: ServerFactory, store_url: str, mcp: McpServerProcess
) -> None:
    # Review: the shutdown's stop counted as a cancel; a speaker still answering when the
    # drain began, whose model then asked for a call that needs approval, recorded it
    # denied: nobody was asked, and the model was told the person said no.
    request = slow_tool_request(mcp, "drain-asks")
    async with draining_with_a_stream_open(start_server, request, "speaker_started") as (reader, _):
        pass
    assert kinds(reader.events)[-1] == "permission_required", "asked, and the stream ended"
    assert_told_to_resend(reader)
    assert not finals(reader.events)
    assert verdicts(store_url, "drain-asks") == [("",)]
    await approve_on_a_new_server(start_server, request, mcp)


async def test_a_call_announced_as_the_drain_begins_is_not_denied(
    start_server: ServerFactory,
    store_url: str,
    mcp: McpServerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Review: the run announced its request and was writing its parked row when the drain
    # began; the park-time check took the shutdown for a cancel and denied the call the
    # person had just been asked about.
    request = tool_request("use note for buy milk", mcp, "drain-parks")

    def slow_parks(server: RunningServer) -> None:
        park = server.store.park_run

        async def slow_park(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0.5)  # the drain begins meanwhile
            return await park(*args, **kwargs)

        monkeypatch.setattr(server.store, "park_run", slow_park)

    async with draining_with_a_stream_open(
        start_server, request, "permission_required", slow_parks
    ) as (reader, _):
        pass
    assert kinds(reader.events)[-1] == "permission_required"
    assert_told_to_resend(reader)
    assert verdicts(store_url, "drain-parks") == [("",)]
    await approve_on_a_new_server(start_server, request, mcp)


async def test_a_cancel_during_the_drain_still_denies_the_call(
    start_server: ServerFactory, store_url: str, mcp: McpServerProcess
) -> None:
    # Review: the shutdown's stop came first, and the first reason won: a cancel sent
    # during the drain's grace was dropped, the call the model asked for then waited, and
    # the next server asked the person about a run its user had cancelled.
    request = slow_tool_request(mcp, "drain-cancel")
    reader = await cancelled_in_the_drain(start_server, request, "speaker_started")
    # A graceful cancel: the one speaker answers, told the call was denied.
    (final,) = finals(reader.events)
    assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_DENIED]
    assert verdicts(store_url, "drain-cancel") == [("cancelled",)]
    assert mcp.counts("note") == {}


async def test_a_cancel_during_the_drain_ends_a_parallel_group_waiting_for_a_person(
    start_server: ServerFactory, store_url: str, mcp: McpServerProcess
) -> None:
    # Outside testing: Mei's call waited while Kai and Lin answered; the drain began, then
    # a cancel. The call was denied, but the run parked (its stream ended UNAVAILABLE,
    # with no end) and the next server completed the run its user had cancelled.
    request = one_waits_while_others_answer(mcp, "drain-group")
    reader = await cancelled_in_the_drain(start_server, request, "permission_required")
    assert reader.task.exception() is None, "the stream ends with the run's end"
    assert kinds(reader.events)[-1] == "run_cancelled"
    assert sorted(f.member_id for f in finals(reader.events)) == ["kai", "lin"]
    assert verdicts(store_url, "drain-group") == [("cancelled",)]
    async with serving(start_server) as stub:
        run = (await stub.GetRun(pb.GetRunRequest(run_id="drain-group", tenant="tenant-1"))).run
    assert run.status == pb.RUN_STATUS_CANCELLED and not run.pending_permissions
    assert mcp.counts("note") == {}


async def test_a_speaker_cut_short_after_its_approval_starts_again_on_the_next_server(
    start_server: ServerFactory, mcp: McpServerProcess
) -> None:
    # Review: it went on there with no speaker_started, its deltas reusing the dead
    # execution's counter, so a client appended the new text to the half-spoken one.
    request = tool_request("use note for buy milk", mcp, "restart-approved")
    slow = spb.ModelTarget(provider="offline", model="m", base_url="offline:?token_delay_ms=150")
    request.snapshot.session.default_model.CopyFrom(spb.ModelRef(target=slow))
    async with (
        start_server(grace_seconds=0.3) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        reader = Reader(stub.StartRun(request))
        asked = (await reader.until("permission_required")).permission_required
        await stub.ResolvePermission(
            resolve("restart-approved", asked.permission_request_id, APPROVE)
        )
        await reader.until("assistant_delta", nth=2)  # answering, told the tool's result
    await asyncio.wait({reader.task}, timeout=5)
    assert not finals(reader.events), "the drain stopped it mid-answer"
    before = [e.speaker_started.attempt for e in of_kind(reader.events, "speaker_started")]
    assert before == [1, 2], "it started, then started again after the decision"
    async with serving(start_server) as stub:
        events = last_execution(await collect(stub.StartRun(request)))
    assert kinds(events)[-1] == "run_completed"
    assert [e.speaker_started.attempt for e in of_kind(events, "speaker_started")] == [3]
    assert mcp.counts("note") == {sent_key("restart-approved", asked.permission_request_id): 1}


async def test_after_a_restart_a_run_waiting_for_approval_is_still_its_threads(
    start_server: ServerFactory, mcp: McpServerProcess
) -> None:
    # Outside testing: after a restart the waiting run was nobody's, so a new turn of its
    # thread started beside it, 停止 on the thread completed without stopping it, and a
    # person then approved its write, which ran when its StartRun came again.
    request = tool_request("use note for buy milk", mcp, "dormant")
    thread = request.context.thread_id
    asked = await park_then_restart(start_server, request)
    async with serving(start_server) as stub:
        turn = start_request("hello", run_id="dormant-2", thread_id=thread)
        with pytest.raises(grpc.aio.AioRpcError) as busy:
            await collect(stub.StartRun(turn))
        assert busy.value.code() is grpc.StatusCode.FAILED_PRECONDITION  # THREAD_BUSY
        stop = start_request("停止", run_id="dormant-3", thread_id=thread)
        assert kinds(await collect(stub.StartRun(stop)))[-1] == "run_completed"
        waiting = await stub.GetRun(pb.GetRunRequest(run_id="dormant", tenant="tenant-1"))
        with pytest.raises(grpc.aio.AioRpcError) as decided:
            await stub.ResolvePermission(resolve("dormant", asked.permission_request_id, APPROVE))
        again = await collect(stub.StartRun(request))
        after = await collect(stub.StartRun(turn))
    assert waiting.run.status == pb.RUN_STATUS_CANCELLED and not waiting.run.pending_permissions
    assert decided.value.code() is grpc.StatusCode.FAILED_PRECONDITION  # PERMISSION_DECIDED
    assert "cancelled" in (decided.value.details() or "")
    # Sent again, a cancelled run goes on (as after any cancel): its call stays denied.
    (final,) = finals(last_execution(again))
    assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_DENIED]
    assert kinds(after)[-1] == "run_completed", "the thread is free once it ended"
    assert mcp.counts("note") == {}


async def test_a_run_left_waiting_stands_in_nobodys_way_once_its_approval_expired(
    start_server: ServerFactory, mcp: McpServerProcess
) -> None:
    # Review: a run whose StartRun never came again held its thread for good.
    request = tool_request("use note for buy milk", mcp, "expired", approval_timeout_s=2)
    await park_then_restart(start_server, request)
    await asyncio.sleep(1.0)  # past its expiry
    async with serving(start_server) as stub:
        turn = start_request("hello", run_id="expired-2", thread_id=request.context.thread_id)
        events = await collect(stub.StartRun(turn))
        # A stop turn still stops it (review): sent again later, it must not answer then.
        stop = start_request("停止", run_id="expired-3", thread_id=request.context.thread_id)
        await collect(stub.StartRun(stop))
        ended = await stub.GetRun(pb.GetRunRequest(run_id="expired", tenant="tenant-1"))
        again = await collect(stub.StartRun(request))
    assert kinds(events)[-1] == "run_completed"
    assert ended.run.status == pb.RUN_STATUS_CANCELLED
    (final,) = finals(last_execution(again))
    assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_DENIED]
    assert mcp.counts("note") == {}


async def test_a_run_approved_while_nobody_held_it_still_holds_its_thread(
    start_server: ServerFactory, mcp: McpServerProcess
) -> None:
    # Review: once decided it waited for nobody, so it stood in nobody's way, and its
    # approved write ran after a turn that came later.
    request = tool_request("use note for buy milk", mcp, "approved")
    asked = await park_then_restart(start_server, request)
    async with serving(start_server) as stub:
        answer = await stub.ResolvePermission(
            resolve("approved", asked.permission_request_id, APPROVE)
        )
        turn = start_request("hello", run_id="approved-2", thread_id=request.context.thread_id)
        with pytest.raises(grpc.aio.AioRpcError) as busy:
            await collect(stub.StartRun(turn))
        resumed = await collect(stub.StartRun(request))
    assert not answer.resumed
    assert busy.value.code() is grpc.StatusCode.FAILED_PRECONDITION  # THREAD_BUSY
    assert kinds(resumed)[-1] == "run_completed"
    assert mcp.counts("note") == {sent_key("approved", asked.permission_request_id): 1}


async def test_a_run_left_waiting_sent_again_goes_before_a_turn_queued_behind_it(
    start_server: ServerFactory, mcp: McpServerProcess
) -> None:
    # Review: the queued turn refused the waiting run's own StartRun (THREAD_BUSY) while
    # it waited for that run: each waited for the other.
    request = tool_request("use note for buy milk", mcp, "first")
    asked = await park_then_restart(start_server, request)
    async with serving(start_server) as stub:
        turn = start_request("hello", run_id="queued", thread_id=request.context.thread_id)
        turn.options.busy_thread_policy = pb.BUSY_THREAD_POLICY_ENQUEUE
        behind = Reader(stub.StartRun(turn))
        async with asyncio.timeout(10):  # until it is recorded, queued behind the first
            while True:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    got = await stub.GetRun(pb.GetRunRequest(run_id="queued", tenant="tenant-1"))
                    if got.run.status == pb.RUN_STATUS_QUEUED:
                        break
                await asyncio.sleep(0.02)
        resent = Reader(stub.StartRun(request))
        await resent.until("permission_required")
        await stub.ResolvePermission(resolve("first", asked.permission_request_id, APPROVE))
        first = await resent.end()
        queued = await behind.end()
    assert kinds(first)[-1] == "run_completed"
    assert kinds(queued)[-1] == "run_completed"
    assert mcp.counts("note") == {sent_key("first", asked.permission_request_id): 1}
    # The queued turn spoke only once the first had ended.
    first_end = first[-1].emitted_at.ToNanoseconds()
    assert of_kind(queued, "speaker_started")
    assert all(
        e.emitted_at.ToNanoseconds() >= first_end for e in of_kind(queued, "speaker_started")
    )
