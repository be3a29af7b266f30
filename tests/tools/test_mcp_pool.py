"""The MCP pool against a real tool server process: results, keys, credentials, failures
mapped into our errors, reconnection, and closing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import replace

import pytest
from roundtable.domain.errors import ToolRejected, ToolUnavailable
from roundtable.domain.tools import Tool, ToolResult, ToolServer
from roundtable.tools.mcp_connection import McpConnection
from roundtable.tools.mcp_pool import McpPool, pool_key
from support.mcp_server import REPO, McpServerProcess, StartMcpServer
from support.tool_calls import call_ref


async def test_a_call_answers_the_tools_text(mcp: McpServerProcess, pool: McpPool) -> None:
    result = await pool.call(
        call_ref(mcp, "weather", "r1/1", city="Paris"), token=None, timeout_s=5
    )
    assert result == ToolResult(text="Sunny, 21°C in Paris", is_error=False)


async def test_a_tool_that_raises_is_an_error_result_not_an_exception(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    result = await pool.call(call_ref(mcp, "fail", "r1/1"), token=None, timeout_s=5)
    assert result.is_error
    assert "Error executing tool fail" in result.text


async def test_an_unknown_tool_is_an_error_result_as_this_server_answers_it(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    # MCPServer answers an unknown tool with isError, not a JSON-RPC error; either way the
    # server was reached and is healthy.
    unknown = Tool(name="nope", description="", input_schema_json="{}", server_id="tools")
    result = await pool.call(call_ref(mcp, unknown, "r1/1"), token=None, timeout_s=5)
    assert result.is_error and "Unknown tool" in result.text


async def test_the_key_reaches_the_server_and_the_server_deduplicates_not_the_pool(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    await pool.call(call_ref(mcp, "note", "r1/1", text="a"), token=None, timeout_s=5)
    assert mcp.counts("note") == {"r1/1": 1}
    # The same key again is sent again: only a server that deduplicates on the key (this
    # one counts instead) makes a write run once. The store's records keep Roundtable
    # from sending a finished call twice; the key covers a call resent after a crash.
    await pool.call(call_ref(mcp, "note", "r1/1", text="a"), token=None, timeout_s=5)
    await pool.call(call_ref(mcp, "note", "r1/2", text="b"), token=None, timeout_s=5)
    assert mcp.counts("note") == {"r1/1": 2, "r1/2": 1}


async def test_concurrent_calls_share_one_session_and_get_their_own_answers(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    cities = [f"city-{i}" for i in range(20)]
    results = await asyncio.gather(
        *(
            pool.call(call_ref(mcp, "weather", f"r1/{i}", city=c), token=None, timeout_s=5)
            for i, c in enumerate(cities)
        )
    )
    assert [r.text for r in results] == [f"Sunny, 21°C in {c}" for c in cities]
    assert repr(pool) == "McpPool(1 connections)"


async def test_a_bearer_token_is_sent_and_a_missing_or_wrong_one_is_rejected(
    start_mcp_server: StartMcpServer, pool: McpPool
) -> None:
    async with start_mcp_server(token="tok-right") as server:
        ref = call_ref(server, "weather", "r1/1", credential_ref="tools", city="Oslo")
        assert (await pool.call(ref, token="tok-right", timeout_s=5)).text == "Sunny, 21°C in Oslo"
        with pytest.raises(ToolRejected) as missing:
            await pool.call(ref, token=None, timeout_s=5)
        with pytest.raises(ToolRejected) as wrong:
            await pool.call(ref, token="tok-wrong", timeout_s=5)
        assert missing.value.detail == wrong.value.detail == "HTTP 401"
        # Each credential has a session of its own; the right one still works.
        assert (await pool.call(ref, token="tok-right", timeout_s=5)).text == "Sunny, 21°C in Oslo"
        assert server.counts("weather") == {"r1/1": 2}


def test_the_pool_key_holds_a_hash_of_the_credential_never_the_credential() -> None:
    server = call_ref(McpServerProcess(REPO / "unused"), "weather", "k").server
    key = pool_key(server, "tok-secret")
    assert "tok-secret" not in repr(key)
    assert key != pool_key(server, "tok-other") and pool_key(server, None)[2] == ""


async def test_http_5xx_is_unavailable_and_4xx_rejected_and_the_session_survives_both(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    ref = call_ref(mcp, "note", "r1/1", text="x")
    await pool.call(ref, token=None, timeout_s=5)  # the session is open
    mcp.fault(503)
    with pytest.raises(ToolUnavailable) as unavailable:
        await pool.call(ref, token=None, timeout_s=5)
    mcp.fault(403)
    with pytest.raises(ToolRejected) as rejected:
        await pool.call(ref, token=None, timeout_s=5)
    assert (unavailable.value.detail, rejected.value.detail) == ("HTTP 503", "HTTP 403")
    await pool.call(ref, token=None, timeout_s=5)
    # The faulted requests never reached the tool.
    assert mcp.counts("note") == {"r1/1": 2}


async def test_a_404_on_the_session_is_sent_again_on_a_new_one_even_for_a_write(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    await pool.call(call_ref(mcp, "weather", "r1/0", city="x"), token=None, timeout_s=5)
    mcp.fault(404)  # the server forgot the session (idle expiry): it ran nothing
    result = await pool.call(call_ref(mcp, "note", "r1/1", text="x"), token=None, timeout_s=5)
    assert not result.is_error
    assert mcp.counts("note") == {"r1/1": 1}


async def test_a_url_that_is_no_mcp_endpoint_is_unavailable(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    ref = call_ref(mcp, "weather", "r1/1", city="x")
    wrong = replace(ref, server=replace(ref.server, url=f"{mcp.base_url}/nope"))
    with pytest.raises(ToolUnavailable) as caught:
        await pool.call(wrong, token=None, timeout_s=5)
    assert caught.value.detail == "HTTP 404" and type(caught.value) is ToolUnavailable


async def test_after_the_server_restarts_the_pool_reconnects(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    ref = call_ref(mcp, "weather", "r1/1", city="Rome")
    await pool.call(ref, token=None, timeout_s=5)
    await mcp.stop()
    with pytest.raises(ToolUnavailable):
        await pool.call(ref, token=None, timeout_s=5)  # nothing listens
    await mcp.start()
    # The broken connection was dropped: the next call opens a new session.
    assert (await pool.call(ref, token=None, timeout_s=5)).text == "Sunny, 21°C in Rome"


async def test_a_restart_between_two_calls_costs_at_most_the_call_that_found_it(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    ref = call_ref(mcp, "weather", "r1/1", city="Rome")
    await pool.call(ref, token=None, timeout_s=5)
    await mcp.stop()
    await mcp.start()
    outcomes: list[str] = []
    for _ in range(2):
        try:
            outcomes.append((await pool.call(ref, token=None, timeout_s=5)).text)
        except ToolUnavailable as exc:
            outcomes.append(f"unavailable: {exc.detail}")
    assert outcomes[-1] == "Sunny, 21°C in Rome", outcomes


async def test_aclose_ends_every_owner_task_even_opened_from_another_task(
    mcp: McpServerProcess,
) -> None:
    pool = McpPool()
    # Opened from a task that is gone by the time the pool closes (a run's task).
    await asyncio.create_task(
        pool.call(call_ref(mcp, "weather", "r1/1", city="x"), token=None, timeout_s=5)
    )
    assert any(t.get_name() == "mcp:tools" for t in asyncio.all_tasks())
    await pool.aclose()
    assert not any(t.get_name() == "mcp:tools" for t in asyncio.all_tasks())


async def test_a_cancelled_call_leaves_the_session_usable(
    mcp: McpServerProcess, pool: McpPool
) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await pool.call(call_ref(mcp, "slow", "r1/1", seconds=5), token=None, timeout_s=5)
    result = await pool.call(call_ref(mcp, "weather", "r1/2", city="x"), token=None, timeout_s=5)
    assert result.text == "Sunny, 21°C in x"
    assert repr(pool) == "McpPool(1 connections)"


def test_importing_the_server_harness_and_pool_does_not_load_the_mcp_sdk() -> None:
    code = (
        "import sys, roundtable.server, roundtable.harness.tool_chain, roundtable.tools.mcp_pool\n"
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


async def test_an_idle_session_and_its_credential_go_without_another_call(
    mcp: McpServerProcess,
) -> None:
    """A session holds its credential: it is closed once idle even if no call ever comes
    again (before, only a later connection swept the idle ones)."""
    pool = McpPool(idle_s=0.2)
    try:
        await pool.call(call_ref(mcp, "weather", "r1/1", city="x"), token="tok-1", timeout_s=5)
        assert repr(pool) == "McpPool(1 connections)"
        async with asyncio.timeout(5):
            while any(t.get_name() in ("mcp:tools", "mcp:sweep") for t in asyncio.all_tasks()):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert repr(pool) == "McpPool(0 connections)"
        # The next call opens a session again, and the sweep with it.
        await pool.call(call_ref(mcp, "weather", "r1/2", city="y"), token="tok-1", timeout_s=5)
        assert any(t.get_name() == "mcp:sweep" for t in asyncio.all_tasks())
    finally:
        await pool.aclose()


async def test_a_full_pool_never_closes_a_session_a_call_is_using(mcp: McpServerProcess) -> None:
    pool = McpPool(max_connections=1)
    try:
        slow = asyncio.ensure_future(
            pool.call(call_ref(mcp, "slow", "r1/1", seconds=1), token="tok-a", timeout_s=5)
        )
        await asyncio.sleep(0.3)  # tok-a's session is open, its call in flight
        other = await pool.call(
            call_ref(mcp, "weather", "r1/2", city="x"), token="tok-b", timeout_s=5
        )
        assert other.text == "Sunny, 21°C in x"
        assert not (await slow).is_error, "the busy session was not closed under its call"
        assert repr(pool) == "McpPool(2 connections)", "past its size while both were busy"
    finally:
        await pool.aclose()


async def test_a_full_pool_closes_its_least_recently_used_session(mcp: McpServerProcess) -> None:
    pool = McpPool(max_connections=2)
    try:
        for n, token in enumerate(("tok-a", "tok-b", "tok-a", "tok-c"), start=1):
            ref = call_ref(mcp, "weather", f"r1/{n}", city="x")
            await pool.call(ref, token=token, timeout_s=5)
        server = call_ref(mcp, "weather", "r1/9").server
        assert set(pool._connections) == {pool_key(server, "tok-a"), pool_key(server, "tok-c")}
    finally:
        await pool.aclose()


async def test_a_close_that_is_itself_cancelled_is_cancelled() -> None:
    # Review: after its wait ran out, aclose cancelled the owner task and suppressed every
    # CancelledError while it waited for it, the one aimed at the closing task too.
    connection = McpConnection(ToolServer(server_id="s", url="http://127.0.0.1:9/mcp"), None)
    connection._task.cancel()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # an owner task still closing its transport
            raise

    connection._task = asyncio.create_task(slow_to_stop())
    closing = asyncio.create_task(connection.aclose(wait_s=0.01))
    await asyncio.sleep(0.1)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
