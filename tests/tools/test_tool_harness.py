"""The tool harness (breaker, retry, audit, span, timeout) over the real pool and a real
MCP tool server process."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import fields

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from roundtable.domain.errors import (
    ToolCircuitOpen,
    ToolRateLimited,
    ToolRejected,
    ToolTimeout,
    ToolUnavailable,
)
from roundtable.domain.tools import Tool, ToolCallRef
from roundtable.harness.audit import AUDIT_LOGGER, ToolAuditRecord
from roundtable.harness.policies import (
    BreakerPolicy,
    RetryPolicy,
    ToolPolicy,
    ToolTimeoutPolicy,
)
from roundtable.harness.request import CallMeta, ToolRequest
from roundtable.harness.tool_chain import ToolHarness
from roundtable.harness.tool_layers import breaker_key
from roundtable.telemetry.logs import QUIET
from roundtable.tools.mcp_pool import McpPool
from support.mcp_server import McpServerProcess, StartMcpServer
from support.tool_calls import TOOLS, call_ref

META = CallMeta(thread_id="t", run_id="r", request_id="q", tenant="x", caller_node="dispatch")
POLICY = ToolPolicy(
    timeout=ToolTimeoutPolicy(default_s=5.0),
    retry=RetryPolicy(max_retries=2, initial_backoff_s=0.001),
    breaker=BreakerPolicy(failure_threshold=3, cooldown_s=60.0),
)


def tool_request(ref: ToolCallRef, token: str | None = None) -> ToolRequest:
    return ToolRequest(ref=ref, meta=META, token=token)


def audit(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == AUDIT_LOGGER]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def harness(pool: McpPool, exporter: InMemorySpanExporter) -> ToolHarness:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return ToolHarness(pool, policy=POLICY, tracer=provider.get_tracer("test"))


@pytest.fixture
def audited(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    return caplog


async def test_a_call_succeeds_with_one_audit_line_and_one_span(
    mcp: McpServerProcess,
    harness: ToolHarness,
    audited: pytest.LogCaptureFixture,
    exporter: InMemorySpanExporter,
) -> None:
    ref = call_ref(mcp, "weather", "reply-1/1", city="Lisbon")
    result = await harness.call(tool_request(ref))
    assert result.text == "Sunny, 21°C in Lisbon" and not result.is_error
    (line,) = audit(audited)
    assert line["status"] == "success" and line["attempt"] == 1 and line["is_error"] is False
    assert {k: line[k] for k in ("operation", "tool", "server_id", "call_key", "run_id")} == {
        "operation": "execute_tool",
        "tool": "weather",
        "server_id": "tools",
        "call_key": "reply-1/1",
        "run_id": "r",
    }
    assert set(line) == {f.name for f in fields(ToolAuditRecord)}
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    assert span.name == "execute_tool weather"
    assert dict(span.attributes or {}) == {
        "roundtable.thread_id": "t",
        "roundtable.run_id": "r",
        "roundtable.request_id": "q",
        "roundtable.tenant": "x",
        "roundtable.caller_node": "dispatch",
        "gen_ai.conversation.id": "t",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "weather",
        "gen_ai.tool.call.id": "reply-1/1",
        "gen_ai.tool.type": "extension",
        "roundtable.tool.server_id": "tools",
        "roundtable.attempt": 1,
    }
    assert span.status.status_code is StatusCode.UNSET


async def test_an_error_result_is_a_success_for_the_breaker_but_an_error_span(
    mcp: McpServerProcess,
    harness: ToolHarness,
    audited: pytest.LogCaptureFixture,
    exporter: InMemorySpanExporter,
) -> None:
    for n in range(POLICY.breaker.failure_threshold + 1):
        result = await harness.call(tool_request(call_ref(mcp, "fail", f"r/{n}")))
        assert result.is_error
    assert harness.breakers.get(breaker_key(call_ref(mcp, "fail", "").server)).state == "closed"
    assert [(line["status"], line["is_error"]) for line in audit(audited)] == [
        ("success", True)
    ] * (POLICY.breaker.failure_threshold + 1)
    span = exporter.get_finished_spans()[-1]
    assert span.attributes is not None and span.attributes["error.type"] == "tool_error"
    assert span.status.status_code is StatusCode.ERROR


async def test_a_timeout_is_retried_for_a_read_only_tool_with_an_audit_line_per_attempt(
    mcp: McpServerProcess, harness: ToolHarness, audited: pytest.LogCaptureFixture
) -> None:
    slow = Tool(**{**_fields(TOOLS["slow"]), "timeout_s": 0.3})
    with pytest.raises(ToolTimeout) as caught:
        await harness.call(tool_request(call_ref(mcp, slow, "r/1", seconds=3)))
    assert caught.value.attempts == 3
    lines = audit(audited)
    assert [(line["attempt"], line["status"], line["error_code"]) for line in lines] == [
        (1, "timeout", "TOOL_TIMEOUT"),
        (2, "timeout", "TOOL_TIMEOUT"),
        (3, "timeout", "TOOL_TIMEOUT"),
    ]
    assert all(250 <= line["latency_ms"] < 2000 for line in lines)


async def test_a_timeout_of_a_write_tool_is_not_retried(
    mcp: McpServerProcess, harness: ToolHarness, audited: pytest.LogCaptureFixture
) -> None:
    slow_write = Tool(**{**_fields(TOOLS["slow"]), "read_only": False, "timeout_s": 0.3})
    with pytest.raises(ToolTimeout):
        await harness.call(tool_request(call_ref(mcp, slow_write, "r/1", seconds=3)))
    assert [line["status"] for line in audit(audited)] == ["timeout"]
    assert mcp.counts("slow") == {"r/1": 1}


async def test_a_read_only_tool_is_retried_after_5xx_and_a_write_tool_is_not(
    mcp: McpServerProcess, harness: ToolHarness, audited: pytest.LogCaptureFixture
) -> None:
    await harness.call(tool_request(call_ref(mcp, "weather", "warm/1", city="x")))
    audited.clear()
    mcp.fault(503, times=2)
    result = await harness.call(tool_request(call_ref(mcp, "weather", "r/1", city="Oslo")))
    assert result.text == "Sunny, 21°C in Oslo"
    assert [(line["attempt"], line["status"]) for line in audit(audited)] == [
        (1, "error"),
        (2, "error"),
        (3, "success"),
    ]
    assert mcp.counts("weather")["r/1"] == 1  # the 503s never reached the tool
    audited.clear()
    mcp.fault(503)
    with pytest.raises(ToolUnavailable) as caught:
        await harness.call(tool_request(call_ref(mcp, "note", "r/2", text="x")))
    assert caught.value.attempts == 1
    assert [(line["status"], line["error_code"]) for line in audit(audited)] == [
        ("error", "TOOL_UNAVAILABLE")
    ]
    assert "note" not in mcp.counts()


async def test_the_breaker_opens_after_failures_and_then_sends_nothing(
    mcp: McpServerProcess, harness: ToolHarness, audited: pytest.LogCaptureFixture
) -> None:
    note = call_ref(mcp, "note", "r/1", text="x")
    await harness.call(tool_request(note))
    audited.clear()
    mcp.fault(503, times=POLICY.breaker.failure_threshold + 5)
    for _ in range(POLICY.breaker.failure_threshold):
        with pytest.raises(ToolUnavailable):
            await harness.call(tool_request(note))
    with pytest.raises(ToolCircuitOpen):
        await harness.call(tool_request(note))
    statuses = [line["status"] for line in audit(audited)]
    assert statuses == ["error"] * POLICY.breaker.failure_threshold + ["breaker_open"]
    assert audit(audited)[-1]["error_code"] == "TOOL_CIRCUIT_OPEN"
    assert mcp.counts("note") == {"r/1": 1}


async def test_the_breaker_is_the_servers_not_the_server_ids_a_session_gives_it(
    mcp: McpServerProcess, start_mcp_server: StartMcpServer, harness: ToolHarness
) -> None:
    # Outside review: two tenants' servers both called "tools" shared one breaker, so one
    # server being down refused every call to the other.
    mcp.fault(503, times=POLICY.breaker.failure_threshold * (POLICY.retry.max_retries + 1))
    down = call_ref(mcp, "note", "r/1", text="x")
    for _ in range(POLICY.breaker.failure_threshold):
        with pytest.raises(ToolUnavailable):
            await harness.call(tool_request(down))
    with pytest.raises(ToolCircuitOpen):
        await harness.call(tool_request(down))
    async with start_mcp_server() as other:
        up = call_ref(other, "note", "r/2", text="y")
        assert up.server.server_id == down.server.server_id
        assert not (await harness.call(tool_request(up))).is_error
    assert breaker_key(down.server) == f"mcp:{mcp.url}"


async def test_a_rejection_is_not_retried_and_does_not_open_the_breaker(
    start_mcp_server: StartMcpServer, harness: ToolHarness, audited: pytest.LogCaptureFixture
) -> None:
    async with start_mcp_server(token="tok-1") as server:
        ref = call_ref(server, "weather", "r/1", credential_ref="tools", city="x")
        for _ in range(POLICY.breaker.failure_threshold + 1):
            with pytest.raises(ToolRejected):
                await harness.call(tool_request(ref, token="tok-0"))
        assert harness.breakers.get(breaker_key(ref.server)).state == "closed"
        assert {line["attempt"] for line in audit(audited)} == {1}


@pytest.fixture
def everything_logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger at DEBUG, except those the server's log set-up holds at WARNING."""
    caplog.set_level(logging.DEBUG)
    levels = {name: logging.getLogger(name).level for name in QUIET}
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    yield caplog
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


async def test_canary_no_token_or_argument_in_logs_spans_errors_or_reprs(
    start_mcp_server: StartMcpServer,
    harness: ToolHarness,
    everything_logged: pytest.LogCaptureFixture,
    exporter: InMemorySpanExporter,
) -> None:
    token, argument = "tok-CANARY-7f3a", "arg-CANARY-91bd"
    async with start_mcp_server(token=token) as server:
        ok = tool_request(
            call_ref(server, "weather", "r/1", credential_ref="tools", city=argument), token=token
        )
        assert argument in (await harness.call(ok)).text  # the result is the model's to see
        await harness.call(
            tool_request(
                call_ref(server, "note", "r/2", credential_ref="tools", text=argument), token
            )
        )
        wrong = tool_request(
            call_ref(server, "note", "r/3", credential_ref="tools", text=argument),
            token=token + "-old",
        )
        with pytest.raises(ToolRejected) as rejected:
            await harness.call(wrong)
        server.fault(503)
        with pytest.raises(ToolUnavailable) as unavailable:
            await harness.call(
                tool_request(
                    call_ref(server, "note", "r/4", credential_ref="tools", text=argument), token
                )
            )
    texts = [record.getMessage() for record in everything_logged.records]
    assert any('"status":"success"' in text for text in texts)  # the audit lines are there
    for error in (rejected.value, unavailable.value):
        texts += [str(error), repr(error), str(error.__context__), str(error.__cause__)]
    texts += [repr(ok), repr(wrong), repr(harness), repr(harness.caller)]
    for span in exporter.get_finished_spans():
        texts += [span.name, repr(dict(span.attributes or {})), repr(span.events)]
    for text in texts:
        assert token not in text and argument not in text, text


def _fields(tool: Tool) -> dict[str, object]:
    return {f.name: getattr(tool, f.name) for f in fields(tool)}


async def test_a_rate_limit_is_not_the_servers_health_and_opens_no_breaker(
    mcp: McpServerProcess, harness: ToolHarness, audited: pytest.LogCaptureFixture
) -> None:
    # Review: a 429 counted as a failure of the server, and the breaker is the server's,
    # shared by every tenant: one tenant's rate limit refused everyone's calls for its
    # cooldown (the model side already left 429s out).
    note = call_ref(mcp, "note", "r/1", text="x")
    await harness.call(tool_request(note))
    audited.clear()
    mcp.fault(429, times=POLICY.breaker.failure_threshold + 1)
    for _ in range(POLICY.breaker.failure_threshold + 1):
        with pytest.raises(ToolRateLimited):
            await harness.call(tool_request(note))
    assert {line["error_code"] for line in audit(audited)} == {"TOOL_RATE_LIMITED"}
    result = await harness.call(tool_request(call_ref(mcp, "note", "r/2", text="y")))
    assert not result.is_error
    assert mcp.counts("note")["r/2"] == 1, "the call reached the server"


async def test_a_token_no_header_can_carry_is_our_requests_fault_and_opens_no_breaker(
    mcp: McpServerProcess, harness: ToolHarness
) -> None:
    # Outside testing: it was TOOL_UNAVAILABLE, counted by the server's breaker, which
    # then refused every tenant's calls (the edge now refuses such a token first).
    note = call_ref(mcp, "note", "r/1", text="x")
    for _ in range(POLICY.breaker.failure_threshold + 1):
        with pytest.raises(ToolRejected) as caught:
            await harness.call(tool_request(note, token="tok\nen"))
        assert "tok" not in str(caught.value)
    result = await harness.call(tool_request(call_ref(mcp, "note", "r/2", text="y")))
    assert not result.is_error and mcp.counts("note") == {"r/2": 1}
