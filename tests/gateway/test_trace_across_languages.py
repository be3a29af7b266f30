"""One trace across two languages: the Go gateway's span and Roundtable's spans, received by
one OTLP collector (the in-process receiver) from both processes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from roundtable.telemetry.attributes import REQUEST_ID, TENANT, THREAD_ID
from support.otlp import OtlpReceiver
from support.process import ServerProcess

pytestmark = [pytest.mark.go, pytest.mark.e2e]

RPC = "/roundtable.v1.OrchestratorService/StartRun"


async def test_gateway_span_and_roundtable_spans_share_one_trace(
    gateway_binary: Path, tmp_path: Path
) -> None:
    with OtlpReceiver() as receiver:
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        sidecar = ServerProcess(tmp_path / "rt.db", tmp_path / "rt.log", env=otel)
        await sidecar.start()
        try:
            gateway = await asyncio.create_subprocess_exec(
                str(gateway_binary),
                "-target",
                sidecar.address,
                "-db",
                str(tmp_path / "gw.json"),
                "-text",
                "@Mei what is for dinner?",
                "-tenant",
                "acme",
                "-thread-id",
                "dinner-thread",
                "-request-id",
                "req-from-go-42",
                "-run-id",
                "trace-run-1",
                env={**os.environ, **otel, "OTEL_SERVICE_NAME": "gateway-go"},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(gateway.communicate(), 60)
            assert gateway.returncode == 0, err.decode()
            summary = json.loads(
                next(
                    line for line in out.decode().splitlines() if line.startswith("SUMMARY ")
                ).removeprefix("SUMMARY ")
            )
        finally:
            sidecar.terminate()  # a graceful stop flushes the sidecar's spans
            await sidecar.wait()
        for _ in range(50):
            if any(s.name == RPC and s.service == "roundtable" for s in receiver.spans):
                break
            await asyncio.sleep(0.1)

    spans = receiver.spans
    (turn,) = [s for s in spans if s.name == "gateway.turn"]
    assert turn.service == "gateway-go"
    assert summary.get("trace_id", turn.trace_id) == turn.trace_id
    ours = [s for s in spans if s.service == "roundtable"]
    assert ours and {s.trace_id for s in ours} == {turn.trace_id}, "one trace across both processes"
    by_id = {s.span_id: s for s in spans}
    (server_rpc,) = [s for s in ours if s.name == RPC]
    client = by_id[server_rpc.parent_span_id]
    assert client.service == "gateway-go", "Roundtable's RPC span is a child of the Go client span"
    assert by_id[client.parent_span_id] is turn
    checked = [
        s
        for s in ours
        if s.name in ("dispatch", "deterministic_router") or s.name.startswith("chat ")
    ]
    assert checked
    for span in checked:
        assert span.attributes[TENANT] == "acme", span.name
        assert span.attributes[REQUEST_ID] == "req-from-go-42", span.name
        assert span.attributes[THREAD_ID] == "dinner-thread", span.name
