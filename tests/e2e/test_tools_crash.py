"""Tool calls across crashes: a real `roundtable serve` (process A) is SIGKILLed, and a new
server on the same store (a SQLite file, or Postgres as a second replica) carries the run on.

- Killed while it waits for approval: the decision is taken by B (ResolvePermission answers
  `resumed = false`: nothing holds the run), the gateway sends the same StartRun, and the
  run goes on from the call: the tool runs once and the reply completes.
- Killed after the tool ran but before the reply's final: B replays the recorded call; the
  write tool's execution count for its key stays 1.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb
from support.approvals import APPROVE, Reader, resolve, sent_key, tool_request, waiting_run
from support.builders import collect, finals, kinds, of_kind
from support.mcp_server import McpServerProcess
from support.process import ServerProcess
from support.stores import drop_schema, new_schema, postgres_dsn, query

pytestmark = pytest.mark.e2e

LEASE = ("--lease-seconds", "1")
"""On Postgres, B takes the run over once A's lease has run out."""


async def test_killed_while_waiting_then_approved_on_another_server_runs_the_tool_once(
    tmp_path: Path, store_url: str, mcp: McpServerProcess
) -> None:
    request = tool_request("use note for buy milk", mcp, "kill-wait")
    a = await ServerProcess(store_url, tmp_path / "a.log", *LEASE).start()
    a_events: list[epb.RunEvent] = []
    try:
        async with a.channel() as channel:
            stub = a.stub(channel)
            async for response in stub.StartRun(request):
                a_events.append(response.event)
                if response.event.HasField("permission_required"):
                    await waiting_run(stub, "kill-wait")
                    parked = "SELECT status FROM rt_runs WHERE run_id = 'kill-wait'"
                    async with asyncio.timeout(10):  # A parked it: its row says so
                        while query(store_url, parked) != [("awaiting_approval",)]:  # noqa: ASYNC110
                            await asyncio.sleep(0.02)
                    a.kill()
                    break
        asked = of_kind(a_events, "permission_required")[0].permission_required
        b = await ServerProcess(store_url, tmp_path / "b.log", *LEASE).start()
        try:
            async with b.channel() as channel:
                stub = b.stub(channel)
                run = (
                    await stub.GetRun(pb.GetRunRequest(run_id="kill-wait", tenant="tenant-1"))
                ).run
                assert run.status == pb.RUN_STATUS_AWAITING_APPROVAL, "a wait survives a crash"
                assert [p.permission_request_id for p in run.pending_permissions] == [
                    asked.permission_request_id
                ]
                answer = await stub.ResolvePermission(
                    resolve("kill-wait", asked.permission_request_id, APPROVE)
                )
                assert not answer.resumed, "no server holds the run: the next StartRun resumes it"
                events = await collect(stub.StartRun(request))
        finally:
            await b.stop()
        ran = mcp.counts("note")
    finally:
        await a.stop()
    assert kinds(events)[-1] == "run_completed"
    # One execution across both servers: it waited, and went on where it waited.
    assert kinds(events).count("run_started") == 1
    assert len(of_kind(events, "permission_required")) == 1
    (final,) = finals(events)
    assert "noted 'buy milk' (1)" in final.content
    assert ran == {sent_key("kill-wait", asked.permission_request_id): 1}


async def test_killed_after_the_tool_ran_replays_its_result_instead_of_running_it_again(
    tmp_path: Path, store_url: str, mcp: McpServerProcess
) -> None:
    request = tool_request("use note for buy milk", mcp, "kill-ran")
    # Every model call of the member takes 1.5 s: A dies while the model writes the reply
    # after the tool answered.
    request.snapshot.members[0].model.CopyFrom(
        spb.ModelRef(
            target=spb.ModelTarget(
                provider="offline", model="m", base_url="offline:?latency_ms=1500"
            )
        )
    )
    a = await ServerProcess(store_url, tmp_path / "a.log", *LEASE).start()
    try:
        async with a.channel() as channel:
            stub = a.stub(channel)
            call = stub.StartRun(request)
            async for response in call:
                if response.event.HasField("permission_required"):
                    asked = response.event.permission_required
                    await stub.ResolvePermission(
                        resolve("kill-ran", asked.permission_request_id, APPROVE)
                    )
                    break
            # The server ran it and A recorded the result: A now asks the model (1.5 s),
            # and dies during that call. (Killed before the record, B would send the call
            # again with the same key: at least once, as the contract says.)
            recorded = "SELECT status FROM rt_tool_calls WHERE run_id = 'kill-ran'"
            async with asyncio.timeout(20):
                while query(store_url, recorded) != [("finished",)]:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            assert mcp.counts("note") == {sent_key("kill-ran", asked.permission_request_id): 1}
            a.kill()
            call.cancel()
        b = await ServerProcess(store_url, tmp_path / "b.log", *LEASE).start()
        try:
            async with b.channel() as channel:
                events = await collect(b.stub(channel).StartRun(request))
        finally:
            await b.stop()
        ran = mcp.counts("note")
    finally:
        await a.stop()
    assert kinds(events)[-1] == "run_completed"
    (final,) = finals(events)
    assert "noted 'buy milk' (1)" in final.content, "the model saw the recorded result"
    assert ran == {sent_key("kill-ran", asked.permission_request_id): 1}, "the write ran once"
    assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_OK]


async def test_a_run_waiting_on_replica_a_is_approved_and_cancelled_through_replica_b(
    tmp_path: Path, mcp: McpServerProcess
) -> None:
    """Both replicas live on one Postgres: A keeps the run parked; B follows it, takes the
    decision (`resumed`: the replica keeping it goes on), and A's watch of its parked runs
    resumes it; a second run waiting on A is cancelled through B."""
    dsn = postgres_dsn()
    store = new_schema(dsn)
    a = await ServerProcess(store, tmp_path / "a.log", *LEASE).start()
    b = await ServerProcess(store, tmp_path / "b.log", *LEASE).start()
    try:
        async with a.channel() as a_channel, b.channel() as b_channel:
            a_stub, b_stub = a.stub(a_channel), b.stub(b_channel)
            request = tool_request("use note for buy milk", mcp, "two-a")
            on_a = Reader(a_stub.StartRun(request))
            asked = (await on_a.until("permission_required")).permission_required
            await waiting_run(a_stub, "two-a")
            # B follows the run A keeps parked: the same StartRun there does not run it.
            on_b = Reader(b_stub.StartRun(request))
            await on_b.until("permission_required")
            answer = await b_stub.ResolvePermission(
                resolve("two-a", asked.permission_request_id, APPROVE)
            )
            assert answer.resumed, "A keeps the run and resumes it"
            a_events, b_events = await on_a.end(), await on_b.end()
            ran = mcp.counts("note")

            second = Reader(a_stub.StartRun(tool_request("use note for more milk", mcp, "two-c")))
            await second.until("permission_required")
            await waiting_run(a_stub, "two-c")
            cancel = await b_stub.CancelRun(pb.CancelRunRequest(run_id="two-c", tenant="tenant-1"))
            assert cancel.outcome == pb.CANCEL_OUTCOME_REQUESTED
            cancelled = await second.end()
            ran_after = mcp.counts("note")
    finally:
        await a.stop()
        await b.stop()
        drop_schema(dsn, store)
    for events in (a_events, b_events):
        assert kinds(events)[-1] == "run_completed"
        (final,) = finals(events)
        assert "noted 'buy milk' (1)" in final.content
    assert ran == {sent_key("two-a", asked.permission_request_id): 1}
    assert kinds(cancelled)[-1] == "run_cancelled"
    assert ran_after == ran, "the cancelled run's call never ran"
