"""The Go gateway and `roundtable serve` against a real OpenTelemetry Collector (the one
`make collector` builds, with the project's config): what its file exporter writes is one
trace across both services, and Roundtable's metrics.

Skipped when the collector is not built; `make test-collector` builds it and names it in
$ROUNDTABLE_OTELCOL, and then a missing binary fails instead."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from support.gateway import (
    GATEWAY_SERVICE,
    ROUNDTABLE_SERVICE,
    RPC,
    Turn,
    assert_one_trace,
    otel_env,
    turn_through_a_sidecar,
)
from support.otelcol import BINARY_ENV, Collector, collector_binary

pytestmark = [pytest.mark.go, pytest.mark.e2e, pytest.mark.collector]

# Instruments every run records (the in-process receiver's test checks the full list).
RUN_METRICS = {"roundtable.runs", "roundtable.run.duration", "roundtable.events.streamed"}


@pytest.fixture
def otelcol() -> Path:
    """The collector binary; skips the test when there is none, unless it was named."""
    binary, why = collector_binary()
    if binary is None:
        if os.environ.get(BINARY_ENV):
            pytest.fail(why)
        pytest.skip(why)
    return binary


async def test_one_trace_across_gateway_and_roundtable_in_a_real_collector(
    otelcol: Path, gateway_binary: Path, tmp_path: Path
) -> None:
    turn = Turn()
    collector = await Collector(otelcol, tmp_path / "otelcol").start()
    try:
        otel = otel_env(collector.endpoint, OTEL_METRIC_EXPORT_INTERVAL="500")
        summary = await turn_through_a_sidecar(gateway_binary, tmp_path, otel, turn)
    finally:
        # The collector's graceful stop writes out all it received: both processes have
        # exported everything by now (each flushes when it stops).
        stopped = await collector.stop()
    assert stopped == 0, collector.log()
    exported = collector.exported()

    assert {s.service for s in exported.spans} == {GATEWAY_SERVICE, ROUNDTABLE_SERVICE}
    assert len({s.trace_id for s in exported.spans}) == 1, "one trace in the collector"
    assert_one_trace(exported.spans, summary, turn)
    assert set(exported.metric_points) >= RUN_METRICS, sorted(exported.metric_points)
    assert ROUNDTABLE_SERVICE in exported.metric_services
    assert exported.counts("roundtable.runs", by="roundtable.status") == {"succeeded": 1}
    # The README shows this script's tree of the same files.
    tree = _trace_tree(collector.out)
    assert f"{ROUNDTABLE_SERVICE}  {RPC}  thread_id={turn.thread_id}" in tree, tree
    assert f"metrics from {ROUNDTABLE_SERVICE}: " in tree, tree


async def test_the_collector_takes_otlp_over_http_too(otelcol: Path, tmp_path: Path) -> None:
    # Both exporters in this test speak gRPC; the shipped config also opens OTLP/HTTP for
    # the SDKs that default to it (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf).
    collector = await Collector(otelcol, tmp_path / "otelcol").start()
    try:
        request = {
            "resourceSpans": [
                {
                    "resource": {
                        "attributes": [{"key": "service.name", "value": {"stringValue": "curl"}}]
                    },
                    "scopeSpans": [{"spans": [HTTP_SPAN]}],
                }
            ]
        }
        status = await asyncio.to_thread(_post_json, f"{collector.http_url}/v1/traces", request)
        assert status == 200
    finally:
        stopped = await collector.stop()
    assert stopped == 0, collector.log()
    (span,) = collector.exported().spans
    assert (span.service, span.name, span.trace_id) == ("curl", "over-http", HTTP_SPAN["traceId"])


def _trace_tree(folder: Path) -> str:
    """What scripts/trace-tree.py prints for the collector's files."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "trace-tree.py"
    done = subprocess.run(
        [sys.executable, str(script), str(folder)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


HTTP_SPAN = {
    "traceId": "5b8efff798038103d269b633813fc60c",
    "spanId": "eee19b7ec3c1b174",
    "name": "over-http",
    "kind": 1,
    "startTimeUnixNano": "1700000000000000000",
    "endTimeUnixNano": "1700000000100000000",
}


def _post_json(url: str, body: object) -> int:
    """POSTs OTLP/JSON; returns the HTTP status."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)
