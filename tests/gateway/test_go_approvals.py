"""The Go gateway (examples/gateway-go) with tools: a real `roundtable serve`, the test MCP
server (tests/support/mcp_server.py) and the gateway binary, run as a user would.

`-tool-server URL` declares the MCP server with `weather` (read-only, runs as called) and
`note` (each call approved by a person); `-approve` decides the requests (ask the person at
the terminal, or always / never). The offline model calls the tool the user names ("use
note to buy milk") and quotes its result; the MCP server counts its executions per
idempotency key (GET /counts), so "ran once" is read from the tool's side.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from roundtable.v1 import orchestrator_service_pb2 as pb
from support.approvals import sent_key
from support.mcp_server import McpServerProcess
from support.process import ServerProcess

from .test_go_gateway import run_gateway

pytestmark = [pytest.mark.go, pytest.mark.e2e]


@pytest.fixture
async def sidecar(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    server = await ServerProcess(
        tmp_path / "rt.db", tmp_path / "rt.log", "--offline-token-delay-ms", "2"
    ).start()
    try:
        yield server
    finally:
        await server.stop()


def stored(db: Path) -> dict[str, Any]:
    return dict(json.loads(db.read_text("utf-8")))


async def test_approved_call_runs_once_and_the_reply_quotes_it(
    gateway_binary: Path, sidecar: ServerProcess, mcp: McpServerProcess, tmp_path: Path
) -> None:
    db = tmp_path / "gateway.json"
    args = ("-run-id", "appr-1", "-tool-server", mcp.url, "-text", "@Mei use note to buy milk")
    run = await run_gateway(gateway_binary, sidecar, db, *args, "-approve", "always")
    s = run.summary
    assert s["status"] == "completed", run.stdout
    assert s["permissions"] == [
        {
            "permission_request_id": "appr-1#0/1",
            "reply_id": "appr-1#0",
            "member_id": "mei",
            "tool_name": "note",
            "arguments_json": '{"text": "buy milk"}',
            "decision": "approve",
            "decided_by": "-approve=always",
            "result": "recorded",
        }
    ]
    (reply,) = s["replies"]
    assert reply["member_id"] == "mei" and "noted 'buy milk' (1)" in reply["content"]
    assert reply["tool_calls"] == [{"call_id": "appr-1#0/1", "tool_name": "note", "outcome": "ok"}]
    assert mcp.counts("note") == {sent_key("appr-1", "appr-1#0/1", tenant="demo"): 1}, (
        "the approved call ran exactly once"
    )
    lines = run.stdout.splitlines()
    assert (
        '── Mei wants to run note {"text": "buy milk"} (request appr-1#0/1, expires ' in run.stdout
    )
    assert "   ✓ Mei's note approved (-approve=always)" in lines
    assert "   Mei used note: ok" in lines
    data = stored(db)
    (decision,) = data["decisions"]
    assert (decision["permission_request_id"], decision["decision"], decision["decided_by"]) == (
        "appr-1#0/1",
        "approve",
        "-approve=always",
    )
    (message,) = [m for m in data["messages"] if m["role"] == "assistant"]
    assert message["tool_calls"] == reply["tool_calls"]

    # Retried (a replay of the finished run): the request is in the log again, but no longer
    # pending: nothing is decided or run again, whatever -approve says.
    replay = await run_gateway(gateway_binary, sidecar, db, *args, "-approve", "never")
    r = replay.summary
    assert r["status"] == "completed" and r["retried_run"]
    assert [(p["decision"], p["result"]) for p in r["permissions"]] == [("", "already_decided")]
    assert r["replies"][0]["content"] == reply["content"] and not r["replies"][0]["persisted"]
    assert mcp.counts("note") == {sent_key("appr-1", "appr-1#0/1", tenant="demo"): 1}
    assert len(stored(db)["decisions"]) == 1
    # -approve=never would deny a pending request: nothing was pending, so nothing denied.
    assert "denied" not in replay.stdout, replay.stdout


async def test_a_read_only_tool_runs_without_asking(
    gateway_binary: Path, sidecar: ServerProcess, mcp: McpServerProcess, tmp_path: Path
) -> None:
    run = await run_gateway(
        gateway_binary,
        sidecar,
        tmp_path / "gateway.json",
        *("-run-id", "wx-1", "-tool-server", mcp.url, "-text", "@Bo use weather for Paris"),
        stdin=b"",  # -approve=ask with nobody there: nothing may be asked
    )
    s = run.summary
    assert s["status"] == "completed" and s["permissions"] == []
    (reply,) = s["replies"]
    assert "Sunny, 21°C in Paris" in reply["content"]
    assert reply["tool_calls"] == [{"call_id": "wx-1#0/1", "tool_name": "weather", "outcome": "ok"}]
    assert mcp.counts("weather") == {sent_key("wx-1", "wx-1#0/1", tenant="demo"): 1}
    assert "   Bo used weather: ok" in run.stdout.splitlines()


async def test_the_person_at_the_terminal_denies_with_a_reason(
    gateway_binary: Path, sidecar: ServerProcess, mcp: McpServerProcess, tmp_path: Path
) -> None:
    run = await run_gateway(
        gateway_binary,
        sidecar,
        tmp_path / "gateway.json",
        *("-run-id", "deny-1", "-tool-server", mcp.url, "-text", "@Mei use note to sell the car"),
        stdin=b"maybe\nn\nnot on a Friday\n",
    )
    s = run.summary
    assert s["status"] == "completed", run.stdout
    (permission,) = s["permissions"]
    assert (permission["decision"], permission["reason"], permission["decided_by"]) == (
        "deny",
        "not on a Friday",
        "terminal",
    )
    assert permission["result"] == "recorded"
    lines = run.stdout.splitlines()
    assert '   allow Mei to run note {"text": "sell the car"}? [y/n] maybe' in lines
    assert "   please answer y or n: n" in lines
    assert "   ✗ Mei's note denied (terminal): not on a Friday" in lines
    (reply,) = s["replies"]
    assert reply["tool_calls"] == [
        {"call_id": "deny-1#0/1", "tool_name": "note", "outcome": "denied"}
    ]
    assert "not on a Friday" in reply["content"], "the member was told why"
    assert mcp.counts("note") == {}, "a denied call never runs"


async def test_no_answer_leaves_the_run_waiting_and_a_retry_decides_it(
    gateway_binary: Path, sidecar: ServerProcess, mcp: McpServerProcess, tmp_path: Path
) -> None:
    db = tmp_path / "gateway.json"
    first = await run_gateway(
        gateway_binary,
        sidecar,
        db,
        *("-run-id", "wait-1", "-tool-server", mcp.url, "-text", "@Kai use note to buy milk"),
        stdin=b"",  # stdin closed before anyone answered
        exit_code=1,
    )
    s = first.summary
    assert s["status"] == "error" and "-run-id wait-1" in s["error"], first.stderr
    assert [(p["result"], p["note"]) for p in s["permissions"]] == [("unanswered", "stdin closed")]
    async with sidecar.channel() as channel:
        waiting = (
            await sidecar.stub(channel).GetRun(pb.GetRunRequest(run_id="wait-1", tenant="demo"))
        ).run
    assert waiting.status == pb.RUN_STATUS_AWAITING_APPROVAL
    assert [p.permission_request_id for p in waiting.pending_permissions] == ["wait-1#0/1"]
    assert mcp.counts("note") == {}

    retry = await run_gateway(
        gateway_binary, sidecar, db, "-run-id", "wait-1", "-approve", "always"
    )
    r = retry.summary
    assert r["status"] == "completed" and r["retried_run"], retry.stdout
    assert [(p["decision"], p["result"]) for p in r["permissions"]] == [("approve", "recorded")]
    assert "noted 'buy milk' (1)" in r["replies"][0]["content"]
    assert mcp.counts("note") == {sent_key("wait-1", "wait-1#0/1", tenant="demo"): 1}
