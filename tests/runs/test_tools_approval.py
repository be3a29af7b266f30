"""Members call tools over MCP, and a person approves the risky calls: what a gateway sees,
over a real server (both stores) and a real MCP tool server process.

The offline model calls a tool the user turn names ("use weather for Paris"), with the
rest of the sentence as its argument, and answers quoting the result; the test server's
`note` counts its executions per idempotency key, so "ran once" is read from the server.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from roundtable.domain.tools import ToolCallRecord
from roundtable.server import RunningServer
from roundtable.store.base import StoredEvent
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from support.approvals import (
    APPROVE,
    DENY,
    WEATHER_SCHEMA,
    Reader,
    group_tool_request,
    one_waits_while_others_answer,
    reason_of,
    resolve,
    sent_key,
    tool_request,
    waiting_run,
)
from support.builders import finals, kinds, of_kind
from support.mcp_server import McpServerProcess
from support.rejections import rejection
from support.stores import query


async def test_a_read_only_tool_runs_without_approval_and_the_reply_quotes_it(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    events = [
        r.event async for r in stub.StartRun(tool_request("use weather for Paris", mcp, "w1"))
    ]
    assert kinds(events)[-1] == "run_completed"
    (final,) = finals(events)
    assert "Sunny, 21°C in Paris" in final.content
    assert [(t.call_id, t.tool_name, t.outcome) for t in final.tool_calls] == [
        (f"{final.reply_id}/1", "weather", epb.TOOL_CALL_OUTCOME_OK)
    ]
    assert mcp.counts("weather") == {sent_key("w1", f"{final.reply_id}/1"): 1}
    assert not of_kind(events, "permission_required")


async def test_a_tool_result_holding_a_nul_is_recorded_on_either_store(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    # Outside testing: on Postgres the result's row could not be written ("DataError"), so
    # the run failed, retryably, at every resume, and ran the tool again each time.
    events = [
        r.event async for r in stub.StartRun(tool_request("use weather for Par\x00is", mcp, "nul"))
    ]
    assert kinds(events)[-1] == "run_completed"
    (final,) = finals(events)
    assert "Sunny, 21°C in Par\ufffdis" in final.content
    assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_OK]


async def test_the_same_run_id_in_two_tenants_sends_two_idempotency_keys(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    # Run ids are unique within a tenant only: a tool server that deduplicates on the key
    # must never answer one tenant's call with another's result.
    notes = {}
    for tenant, text in (("tenant-1", "buy milk"), ("tenant-2", "sell the house")):
        request = tool_request(f"use note for {text}", mcp, "same-run")
        request.context.tenant = tenant
        reader = Reader(stub.StartRun(request))
        asked = (await reader.until("permission_required")).permission_required
        await stub.ResolvePermission(
            resolve("same-run", asked.permission_request_id, APPROVE, tenant=tenant)
        )
        (final,) = finals(await reader.end())
        notes[tenant] = (asked.permission_request_id, final.content)
    assert notes["tenant-1"][0] == notes["tenant-2"][0]  # the same call within its run
    assert "noted 'buy milk' (1)" in notes["tenant-1"][1]
    assert "noted 'sell the house' (1)" in notes["tenant-2"][1]
    call = notes["tenant-1"][0]
    assert mcp.counts("note") == {
        sent_key("same-run", call, tenant="tenant-1"): 1,
        sent_key("same-run", call, tenant="tenant-2"): 1,
    }


async def test_an_approved_call_waits_for_the_decision_then_runs_once(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    reader = Reader(stub.StartRun(tool_request("use note for buy milk", mcp, "a1")))
    asked = (await reader.until("permission_required")).permission_required
    assert asked.tool_name == asked.action == "note"
    assert json.loads(asked.arguments_json) == {"text": "buy milk"}
    assert dict(asked.arguments) == {"text": "buy milk"}
    assert asked.permission_request_id == f"{asked.reply_id}/1"
    assert asked.expires_at.seconds > 0
    # Nothing ran, and the run says it waits, listing the request.
    assert mcp.counts("note") == {}
    run = await waiting_run(stub, "a1")
    assert [p.permission_request_id for p in run.pending_permissions] == [
        asked.permission_request_id
    ]

    answer = await stub.ResolvePermission(resolve("a1", asked.permission_request_id, APPROVE))
    assert answer.decision == APPROVE and answer.resumed
    assert answer.decided_at.seconds > 0

    events = await reader.end()
    assert kinds(events)[-1] == "run_completed"
    assert kinds(events).count("run_started") == 1  # one execution: it waited, then went on
    (final,) = finals(events)
    assert "noted 'buy milk' (1)" in final.content
    assert [(t.tool_name, t.outcome) for t in final.tool_calls] == [
        ("note", epb.TOOL_CALL_OUTCOME_OK)
    ]
    assert mcp.counts("note") == {sent_key("a1", asked.permission_request_id): 1}
    run = (await stub.GetRun(pb.GetRunRequest(run_id="a1", tenant="tenant-1"))).run
    assert run.status == pb.RUN_STATUS_SUCCEEDED and not run.pending_permissions

    # The same decision again answers the same; a different one names the recorded one.
    again = await stub.ResolvePermission(resolve("a1", asked.permission_request_id, APPROVE))
    assert again.decision == APPROVE
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ResolvePermission(resolve("a1", asked.permission_request_id, DENY))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(refused.value) == "PERMISSION_DECIDED"
    assert "approve" in (refused.value.details() or "")


async def test_a_denied_call_never_runs_and_the_member_hears_why(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    reader = Reader(stub.StartRun(tool_request("用 note 记 买牛奶", mcp, "d1")))
    asked = (await reader.until("permission_required")).permission_required
    assert json.loads(asked.arguments_json) == {"text": "买牛奶"}
    await stub.ResolvePermission(
        resolve("d1", asked.permission_request_id, DENY, reason="not today")
    )
    events = await reader.end()
    (final,) = finals(events)
    assert "not today" in final.content and "note 的结果" in final.content
    assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_DENIED]
    assert mcp.counts("note") == {}


async def test_an_approval_with_edited_arguments_runs_the_edit(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    reader = Reader(stub.StartRun(tool_request("use note for buy milk", mcp, "e1")))
    asked = (await reader.until("permission_required")).permission_required
    await waiting_run(stub, "e1")
    edited = json.dumps({"text": "buy oat milk"})
    decide = resolve("e1", asked.permission_request_id, APPROVE, edited_arguments_json=edited)
    await stub.ResolvePermission(decide)
    assert (await stub.ResolvePermission(decide)).decision == APPROVE, "the same, answered"
    # The same arguments serialized again (spaces, key order) are the same decision.
    again = json.dumps({"text": "buy oat milk"}, separators=(",", ":"), indent=1)
    assert again != edited
    resent = resolve("e1", asked.permission_request_id, APPROVE, edited_arguments_json=again)
    assert (await stub.ResolvePermission(resent)).decision == APPROVE, "the same, re-encoded"
    # The same verdict with other arguments is another decision: refused, not answered OK
    # while the first edit runs (as it was before).
    other = json.dumps({"text": "sell the car"})
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ResolvePermission(
            resolve("e1", asked.permission_request_id, APPROVE, edited_arguments_json=other)
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(refused.value) == "PERMISSION_DECIDED"
    assert "other arguments" in (refused.value.details() or "")
    (final,) = finals(await reader.end())
    assert "noted 'buy oat milk' (1)" in final.content


async def test_a_request_nobody_answers_expires_and_counts_as_denied(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    request = tool_request("use note for buy milk", mcp, "x1", approval_timeout_s=1)
    reader = Reader(stub.StartRun(request))
    asked = (await reader.until("permission_required")).permission_required
    events = await reader.end(wait_s=15)
    (final,) = finals(events)
    assert [t.outcome for t in final.tool_calls] == [epb.TOOL_CALL_OUTCOME_EXPIRED]
    assert kinds(events)[-1] == "run_completed"
    assert mcp.counts("note") == {}
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await stub.ResolvePermission(resolve("x1", asked.permission_request_id, APPROVE))
    assert late.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "expired" in (late.value.details() or "")


async def test_cancel_while_waiting_ends_the_run_and_the_call_never_runs(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    reader = Reader(stub.StartRun(tool_request("use note for buy milk", mcp, "c1")))
    asked = (await reader.until("permission_required")).permission_required
    await waiting_run(stub, "c1")
    cancel = await stub.CancelRun(pb.CancelRunRequest(run_id="c1", tenant="tenant-1"))
    assert cancel.outcome == pb.CANCEL_OUTCOME_REQUESTED
    # The answer shows the run ended (outside testing: it said RUNNING).
    assert cancel.run.status == pb.RUN_STATUS_CANCELLED
    events = await reader.end()
    assert kinds(events)[-1] == "run_cancelled"
    assert mcp.counts("note") == {}
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await stub.ResolvePermission(resolve("c1", asked.permission_request_id, APPROVE))
    assert "cancelled" in (late.value.details() or "")
    run = (await stub.GetRun(pb.GetRunRequest(run_id="c1", tenant="tenant-1"))).run
    assert run.status == pb.RUN_STATUS_CANCELLED and not run.pending_permissions


async def test_an_immediate_cancel_denies_a_call_waiting_in_a_parallel_group(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess, store_url: str
) -> None:
    # Outside testing: the immediate cancel ended the speakers before their tool loop
    # could deny the call; GetRun listed it as waiting on the cancelled run, the same
    # StartRun then waited on it, and a later approval ran the tool.
    request = one_waits_while_others_answer(mcp, "c-imm")
    reader = Reader(stub.StartRun(request))
    asked = (await reader.until("permission_required")).permission_required
    await stub.CancelRun(
        pb.CancelRunRequest(run_id="c-imm", tenant="tenant-1", mode=pb.CANCEL_MODE_IMMEDIATE)
    )
    events = await reader.end()
    assert kinds(events)[-1] == "run_cancelled"
    assert not finals(events), "Kai and Lin were still answering"
    run = (await stub.GetRun(pb.GetRunRequest(run_id="c-imm", tenant="tenant-1"))).run
    assert run.status == pb.RUN_STATUS_CANCELLED and not run.pending_permissions
    assert query(store_url, "SELECT verdict FROM rt_tool_calls WHERE run_id = 'c-imm'") == [
        ("cancelled",)
    ]
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await stub.ResolvePermission(resolve("c-imm", asked.permission_request_id, APPROVE))
    assert "cancelled" in (late.value.details() or "")
    # The same StartRun resumes it: Mei hears the call was denied, and all three answer.
    again = Reader(stub.StartRun(request))
    resumed = await again.end()
    assert kinds(resumed)[-1] == "run_completed"
    assert sorted(f.member_id for f in finals(resumed)) == ["kai", "lin", "mei"]
    (mei,) = [f for f in finals(resumed) if f.member_id == "mei"]
    assert [t.outcome for t in mei.tool_calls] == [epb.TOOL_CALL_OUTCOME_DENIED]
    assert mcp.counts("note") == {}


@pytest.mark.parametrize("decided", [True, False], ids=["approved-then-resumed", "resumed"])
async def test_a_call_a_failed_cancel_left_waiting_is_denied_all_the_same(
    server: RunningServer,
    stub: pb_grpc.OrchestratorServiceStub,
    mcp: McpServerProcess,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    decided: bool,
) -> None:
    # Review: when the store failed as a cancel denied the waiting calls, the call stayed
    # waiting on the cancelled run: GetRun listed it, a person's approval was recorded, and
    # the same StartRun ran the tool.
    run_id = f"c-lost-{decided}"
    request = one_waits_while_others_answer(mcp, run_id)
    reader = Reader(stub.StartRun(request))
    asked = (await reader.until("permission_required")).permission_required
    failed = []
    read_calls = server.store.tool_calls

    async def fails_once(tenant: str, run: str) -> list[ToolCallRecord]:
        if not failed:
            failed.append(run)
            raise ConnectionError("store unreachable")
        return await read_calls(tenant, run)

    monkeypatch.setattr(server.store, "tool_calls", fails_once)
    await stub.CancelRun(
        pb.CancelRunRequest(run_id=run_id, tenant="tenant-1", mode=pb.CANCEL_MODE_IMMEDIATE)
    )
    assert kinds(await reader.end())[-1] == "run_cancelled"
    assert failed == [run_id], "the denial met the store error"
    run = (await stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant="tenant-1"))).run
    assert run.status == pb.RUN_STATUS_CANCELLED and not run.pending_permissions
    if decided:
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await stub.ResolvePermission(resolve(run_id, asked.permission_request_id, APPROVE))
        assert "cancelled" in (late.value.details() or "")
    resumed = await Reader(stub.StartRun(request)).end()
    assert kinds(resumed)[-1] == "run_completed"
    (mei,) = [f for f in finals(resumed) if f.member_id == "mei"]
    assert [t.outcome for t in mei.tool_calls] == [epb.TOOL_CALL_OUTCOME_DENIED]
    assert mcp.counts("note") == {}
    assert query(store_url, f"SELECT verdict FROM rt_tool_calls WHERE run_id = '{run_id}'") == [
        ("cancelled",)
    ]


async def test_unknown_requests_and_other_tenants_runs_are_not_found(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    reader = Reader(stub.StartRun(tool_request("use note for buy milk", mcp, "n1")))
    asked = (await reader.until("permission_required")).permission_required
    for wrong in (
        resolve("n1", "no-such-request", APPROVE),
        resolve("n1", asked.permission_request_id, APPROVE, tenant="other"),
        resolve("no-such-run", asked.permission_request_id, APPROVE),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.ResolvePermission(wrong)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    await stub.CancelRun(pb.CancelRunRequest(run_id="n1", tenant="tenant-1"))
    await reader.end()


async def test_bad_tool_declarations_are_invalid_argument_naming_each_field(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    request = tool_request("use weather for Paris", mcp, "v1")
    session = request.snapshot.session
    session.tools[0].input_schema_json = '{"type": "object", "properties": {"city": {"type": 7}}}'
    session.tools[1].server_id = "nowhere"
    session.tools.add(name="weather", input_schema_json=WEATHER_SCHEMA, server_id="local")
    session.tool_servers.add(server_id="vault", url="ftp://x", credential_ref="missing")
    request.snapshot.members[0].tool_names.append("teleport")
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        async for _ in stub.StartRun(request):
            pass
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(bad.value)
    assert status is not None
    fields = set()
    for detail in status.details:
        info = error_details_pb2.BadRequest()
        if detail.Unpack(info):
            fields |= {v.field for v in info.field_violations}
    assert fields == {
        "snapshot.session.tools[0].input_schema_json",
        "snapshot.session.tools[1].server_id",
        "snapshot.session.tools[2].name",
        "snapshot.session.tool_servers[1].url",
        "snapshot.session.tool_servers[1].credential_ref",
        "snapshot.members[0].tool_names[2]",
    }
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.GetRun(pb.GetRunRequest(run_id="v1", tenant="tenant-1"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_bad_decisions_are_invalid_argument(stub: pb_grpc.OrchestratorServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await stub.ResolvePermission(
            pb.ResolvePermissionRequest(
                run_id="r", tenant="tenant-1", edited_arguments_json="[1]", decision=DENY
            )
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(bad.value)
    assert status is not None
    fields = set()
    for detail in status.details:
        info = error_details_pb2.BadRequest()
        if detail.Unpack(info):
            fields |= {v.field for v in info.field_violations}
    assert fields == {"permission_request_id", "edited_arguments_json"}


@pytest.mark.parametrize(
    ("decision", "field", "value"),
    [
        # Outside testing: accepted and kept, so the same approval sent again without its
        # reason was refused as another decision.
        (APPROVE, "reason", "because"),
        # Outside testing: Python's json took it; no gateway can print NaN as JSON.
        (APPROVE, "edited_arguments_json", '{"text": "x", "n": NaN}'),
        (APPROVE, "edited_arguments_json", '{"n": -Infinity}'),
    ],
)
async def test_a_decision_carrying_what_it_may_not_is_invalid_argument(
    stub: pb_grpc.OrchestratorServiceStub, decision: int, field: str, value: str
) -> None:
    bad = await rejection(stub.ResolvePermission(resolve("r", "r#0/1", decision, **{field: value})))
    assert bad.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(bad.violations) == {field}


async def test_a_stop_turn_ends_a_run_waiting_on_its_thread(
    stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    reader = Reader(stub.StartRun(tool_request("use note for buy milk", mcp, "s1")))
    asked = (await reader.until("permission_required")).permission_required
    await waiting_run(stub, "s1")
    stop = tool_request("停止", mcp, "s2")  # the same thread, t-s1
    stop.context.thread_id = "t-s1"
    stopped = [r.event async for r in stub.StartRun(stop)]
    assert kinds(stopped)[-1] == "run_completed"
    events = await reader.end()
    assert kinds(events)[-1] == "run_cancelled"
    assert events[-1].run_cancelled.reason == "stop_directive"
    assert mcp.counts("note") == {}
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await stub.ResolvePermission(resolve("s1", asked.permission_request_id, APPROVE))
    assert "cancelled" in (late.value.details() or "")


def watches() -> list[asyncio.Task[object]]:
    """The parked runs' watch tasks running in this process (named "parked")."""
    return [t for t in asyncio.all_tasks() if t.get_name() == "parked" and not t.done()]


async def watching() -> asyncio.Task[object]:
    """The parked runs' watch, once on (the row says "waiting" a moment before the run
    takes its place among the parked, which starts the watch)."""
    async with asyncio.timeout(5):
        while not watches():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    (watch,) = watches()
    return watch


async def test_the_watch_of_runs_parked_on_a_replica_runs_only_while_one_is_parked(
    server: RunningServer, stub: pb_grpc.OrchestratorServiceStub, mcp: McpServerProcess
) -> None:
    """Replicas (Postgres): the one watch of a replica's parked runs stops once none is
    left, so an idle replica makes no query; the next park starts it again, and it still
    hears a cancel another replica records; once the process is stopping, a park starts
    no watch."""
    if not server.store.shared:
        pytest.skip("one process on SQLite: every decision lands where the run is parked")
    reader = Reader(stub.StartRun(tool_request("use note for buy milk", mcp, "p1")))
    asked = (await reader.until("permission_required")).permission_required
    await waiting_run(stub, "p1")
    first = await watching()
    await stub.ResolvePermission(resolve("p1", asked.permission_request_id, APPROVE))
    assert kinds(await reader.end())[-1] == "run_completed"
    async with asyncio.timeout(5):
        await first  # nothing parked: it ends by itself

    second = Reader(stub.StartRun(tool_request("use note for more milk", mcp, "p2")))
    await second.until("permission_required")
    await waiting_run(stub, "p2")
    assert await watching() is not first, "started again"
    # As another replica records it: only the watch can bring it to the run parked here.
    assert await server.store.request_cancel("tenant-1", "p2", "graceful", "stop_turn")
    assert kinds(await second.end())[-1] == "run_cancelled"
    assert mcp.counts("note") == {sent_key("p1", asked.permission_request_id): 1}

    async with asyncio.timeout(5):
        while watches():  # noqa: ASYNC110 (nothing parked: it ends within a poll)
            await asyncio.sleep(0.01)
    server.manager.parking.close()  # as a drain does first
    third = Reader(stub.StartRun(tool_request("use note for tea", mcp, "p3")))
    await third.until("permission_required")
    await waiting_run(stub, "p3")
    await asyncio.sleep(0.3)  # longer than a poll: a watch started by the park would be on
    assert not watches(), "a stopping process starts no watch"


async def test_a_decision_in_a_parallel_group_starts_only_its_own_speaker_again(
    server: RunningServer,
    stub: pb_grpc.OrchestratorServiceStub,
    mcp: McpServerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Outside testing: each decision started every speaker of the group still waiting
    # again (speaker_started, then nothing), so the stream said they spoke while they
    # waited for a person.
    request = group_tool_request("@all use note for buy milk", mcp, "pg1", parallel=True)
    reader = Reader(stub.StartRun(request))
    await reader.until("permission_required", nth=3)
    await waiting_run(stub, "pg1")
    asked = [e.permission_required for e in of_kind(reader.events, "permission_required")]
    assert len(asked) == 3
    first, *others = asked
    seen = len(reader.events)
    reads: list[str] = []
    read_calls = server.store.tool_calls

    async def counted(tenant: str, run_id: str) -> list[ToolCallRecord]:
        reads.append(run_id)
        return await read_calls(tenant, run_id)

    monkeypatch.setattr(server.store, "tool_calls", counted)
    await stub.ResolvePermission(resolve("pg1", first.permission_request_id, APPROVE))
    await reader.until("assistant_final")
    # The decision's answer (its pending list) reads the run's calls once, and each
    # resumed speaker once, the one that goes on included (twice before).
    assert len(reads) == 4
    run = await waiting_run(stub, "pg1")
    assert len(run.pending_permissions) == 2
    # The decided speaker starts again as attempt 2 (review: it said attempt 1 again, as if
    # it had never begun); the others wait, saying nothing.
    started = [e.speaker_started for e in of_kind(reader.events[seen:], "speaker_started")]
    assert [(s.reply_id, s.attempt) for s in started] == [(first.reply_id, 2)]
    assert any(
        f.assistant_final.reply_id == first.reply_id
        for f in of_kind(reader.events[seen:], "assistant_final")
    )
    for request_left in others:
        await stub.ResolvePermission(resolve("pg1", request_left.permission_request_id, APPROVE))
    events = await reader.end()
    assert kinds(events)[-1] == "run_completed"
    assert sorted(f.member_id for f in finals(events)) == ["kai", "lin", "mei"]


@pytest.mark.parametrize(
    ("recorded", "sent", "same"),
    [
        ('{"a": 1, "b": [1, 2]}', '{"b":[1,2],"a":1}', True),
        ('{"confirm": true}', '{"confirm": 1}', False),  # Python's True == 1
        ("[1]", "[1.0]", False),
        ("", '{"a": 1}', False),
    ],
)
def test_edited_arguments_are_the_same_only_as_the_same_json_text_values(
    recorded: str, sent: str, same: bool
) -> None:
    # Outside review: compared as parsed values, true was 1, so a second person's other
    # arguments were answered as the same decision while the first's ran.
    from roundtable.runs.approvals import _same_json

    assert _same_json(recorded, sent) is same


async def test_a_stream_attached_as_the_run_parks_gets_every_event(
    server: RunningServer,
    stub: pb_grpc.OrchestratorServiceStub,
    mcp: McpServerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Review: StreamRun reads the events of the run's earlier executions from the log,
    # then takes the rest from memory. A run that parked while that read was on its way
    # (a round trip on Postgres) dropped from memory the event the read came too early
    # for (its permission_required): the stream skipped that seq.
    run_id = "attach-park"
    first = Reader(stub.StartRun(group_tool_request("@all use note for buy milk", mcp, run_id)))
    asked = (await first.until("permission_required")).permission_required
    await waiting_run(stub, run_id)
    await stub.ResolvePermission(resolve(run_id, asked.permission_request_id, APPROVE))
    await first.until("speaker_started", nth=2)  # Kai, in the run's second execution
    read_events, parked = server.store.read_events, asyncio.Event()

    async def answers_once_parked(tenant: str, rid: str, after_seq: int) -> list[StoredEvent]:
        rows = await read_events(tenant, rid, after_seq)
        async with asyncio.timeout(10):
            await parked.wait()
        return rows

    monkeypatch.setattr(server.store, "read_events", answers_once_parked)
    second = Reader(stub.StreamRun(pb.StreamRunRequest(run_id=run_id, tenant="tenant-1")))
    asked = (await first.until("permission_required", nth=2)).permission_required
    await waiting_run(stub, run_id)
    parked.set()  # the read made before the park answers now
    await stub.ResolvePermission(resolve(run_id, asked.permission_request_id, APPROVE))
    asked = (await first.until("permission_required", nth=3)).permission_required
    await waiting_run(stub, run_id)
    await stub.ResolvePermission(resolve(run_id, asked.permission_request_id, APPROVE))
    events = await first.end()
    assert kinds(events)[-1] == "run_completed"
    assert [e.seq for e in await second.end()] == [e.seq for e in events]


async def test_a_cancel_as_a_decided_group_goes_on_denies_the_calls_left(
    server: RunningServer,
    stub: pb_grpc.OrchestratorServiceStub,
    mcp: McpServerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Review: a graceful cancel landing as the run went on from one decision, before its
    # first speaker boundary, ended it without denying the other two calls: GetRun still
    # listed them, and the same StartRun waited on them again.
    request = group_tool_request("@all use note for buy milk", mcp, "pgc", parallel=True)
    reader = Reader(stub.StartRun(request))
    await reader.until("permission_required", nth=3)
    await waiting_run(stub, "pgc")
    first = of_kind(reader.events, "permission_required")[0].permission_required
    real = server.store.resume_parked

    async def resume_then_cancel(*args: object, **kwargs: object) -> bool:
        resumed = await real(*args, **kwargs)
        await server.manager.cancel("tenant-1", "pgc", immediate=False, reason="")
        return resumed

    monkeypatch.setattr(server.store, "resume_parked", resume_then_cancel)
    await stub.ResolvePermission(resolve("pgc", first.permission_request_id, APPROVE))
    assert kinds(await reader.end())[-1] == "run_cancelled"
    run = (await stub.GetRun(pb.GetRunRequest(run_id="pgc", tenant="tenant-1"))).run
    assert run.status == pb.RUN_STATUS_CANCELLED and not run.pending_permissions
    monkeypatch.setattr(server.store, "resume_parked", real)
    events = await Reader(stub.StartRun(request)).end(wait_s=10)
    assert kinds(events)[-1] == "run_completed"
    outcomes = {f.member_id: [t.outcome for t in f.tool_calls] for f in finals(events)}
    ok, denied = [epb.TOOL_CALL_OUTCOME_OK], [epb.TOOL_CALL_OUTCOME_DENIED]
    assert outcomes == {m: ok if m == first.member_id else denied for m in ("mei", "kai", "lin")}
    assert mcp.counts("note") == {sent_key("pgc", first.permission_request_id): 1}
