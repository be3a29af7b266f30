"""One turn of the Go gateway (examples/gateway-go) against a running sidecar, and what its
trace must look like wherever the spans of both processes were collected."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roundtable.telemetry.attributes import CALLER_NODE, REQUEST_ID, TENANT, THREAD_ID

from support.otlp import Span

RPC = "/roundtable.v1.OrchestratorService/StartRun"
GATEWAY_SERVICE = "gateway-go"
ROUNDTABLE_SERVICE = "roundtable"


@dataclass(frozen=True)
class Turn:
    """The correlation fields the gateway sends with its turn."""

    tenant: str = "acme"
    thread_id: str = "dinner-thread"
    request_id: str = "req-from-go-42"
    run_id: str = "trace-run-1"
    text: str = "@Mei what is for dinner?"


async def run_gateway_turn(
    binary: Path, target: str, workdir: Path, otel: Mapping[str, str], turn: Turn
) -> dict[str, Any]:
    """Runs one turn with the gateway, exporting its spans as `gateway-go`; returns its
    SUMMARY line."""
    gateway = await asyncio.create_subprocess_exec(
        str(binary),
        *("-target", target, "-db", str(workdir / "gw.json"), "-text", turn.text),
        *("-tenant", turn.tenant, "-thread-id", turn.thread_id),
        *("-request-id", turn.request_id, "-run-id", turn.run_id),
        env={**os.environ, **otel, "OTEL_SERVICE_NAME": GATEWAY_SERVICE},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(gateway.communicate(), 60)
    assert gateway.returncode == 0, err.decode()
    line = next(line for line in out.decode().splitlines() if line.startswith("SUMMARY "))
    return dict(json.loads(line.removeprefix("SUMMARY ")))


def otel_env(endpoint: str, **more: str) -> dict[str, str]:
    """The OTEL_* variables both processes get: export to `endpoint` soon after each span."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        **more,
    }


async def turn_through_a_sidecar(
    binary: Path, workdir: Path, otel: Mapping[str, str], turn: Turn
) -> dict[str, Any]:
    """Starts `roundtable serve` with `otel`, runs the gateway's turn against it, and stops
    it gracefully (which exports the spans and metrics it still holds); the turn's SUMMARY."""
    from support.process import ServerProcess

    sidecar = ServerProcess(workdir / "rt.db", workdir / "rt.log", env=dict(otel))
    await sidecar.start()
    try:
        return await run_gateway_turn(binary, sidecar.address, workdir, otel, turn)
    finally:
        sidecar.terminate()
        await sidecar.wait()


def assert_summary_names_trace(summary: Mapping[str, Any], trace_id: str) -> None:
    """The gateway's SUMMARY gives the trace id of its turn (a summary without one fails)."""
    assert summary.get("trace_id") == trace_id, (
        f"SUMMARY trace_id {summary.get('trace_id')!r}, the gateway's span has {trace_id!r}"
    )


def assert_one_trace(spans: list[Span], summary: Mapping[str, Any], turn: Turn) -> None:
    """One trace across both processes: the gateway's turn span, its gRPC client span,
    Roundtable's StartRun span as that client span's child, and every Roundtable span
    carrying the turn's correlation fields."""
    (gateway_turn,) = [s for s in spans if s.name == "gateway.turn"]
    assert gateway_turn.service == GATEWAY_SERVICE
    assert_summary_names_trace(summary, gateway_turn.trace_id)
    ours = [s for s in spans if s.service == ROUNDTABLE_SERVICE]
    assert ours, "no Roundtable span arrived"
    assert {s.trace_id for s in ours} == {gateway_turn.trace_id}, "one trace across both"
    by_id = {s.span_id: s for s in spans}
    (server_rpc,) = [s for s in ours if s.name == RPC]
    client = by_id[server_rpc.parent_span_id]
    assert client.service == GATEWAY_SERVICE, "the RPC span is a child of the Go client span"
    assert by_id[client.parent_span_id] is gateway_turn
    expected = {TENANT: turn.tenant, REQUEST_ID: turn.request_id, THREAD_ID: turn.thread_id}
    for span in ours:
        assert {k: span.attributes.get(k) for k in expected} == expected, span.name
        assert span.attributes.get(CALLER_NODE), f"{span.name} has no {CALLER_NODE}"
