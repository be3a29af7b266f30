"""A real OpenTelemetry Collector for tests: the one `make collector` builds, started with the
project's config (otelcol/config.yaml) on free loopback ports, and the OTLP/JSON files its
file exporter writes, read back into the `Span` records the in-process receiver gives."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.otlp import Span

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "otelcol" / "config.yaml"
BUILT = REPO / ".tools" / "bin" / "roundtable-otelcol"
BINARY_ENV = "ROUNDTABLE_OTELCOL"
"""Names the collector binary; when set, a missing binary is an error, not a skip."""

# What the collector logs once every pipeline is up and the receivers listen.
_READY = "Everything is ready"


def collector_binary() -> tuple[Path | None, str]:
    """The collector to test against and, when there is none, why: $ROUNDTABLE_OTELCOL
    if set (`make test-collector` sets it), else the binary `make collector` builds."""
    named = os.environ.get(BINARY_ENV)
    path = Path(named) if named else BUILT
    if path.is_file() and os.access(path, os.X_OK):
        return path, ""
    return None, f"no OpenTelemetry Collector at {path} (build it with `make collector`)"


def free_port() -> int:
    """A loopback port nothing listens on now (the collector binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Exported:
    """What the collector wrote: spans, and the data points of each metric by name."""

    spans: list[Span] = field(default_factory=list)
    metric_points: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    metric_services: set[str] = field(default_factory=set)

    def counts(self, name: str, by: str) -> dict[str, int]:
        """A cumulative integer sum's latest value for each value of the attribute `by`
        (later export requests come later in the file)."""
        latest: dict[str, int] = {}
        for point in self.metric_points.get(name, []):
            key = str(_attributes(point.get("attributes", [])).get(by))
            latest[key] = int(point.get("asInt", 0))
        return latest


class Collector:
    """`roundtable-otelcol --config=otelcol/config.yaml`, receiving OTLP/gRPC and OTLP/HTTP
    on free loopback ports and writing traces.jsonl and metrics.jsonl into `out`."""

    def __init__(self, binary: Path, out: Path) -> None:
        self.binary = binary
        self.out = out
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.log_path = out / "otelcol.log"
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def endpoint(self) -> str:
        """What OTEL_EXPORTER_OTLP_ENDPOINT takes (OTLP/gRPC)."""
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        """The OTLP/HTTP receiver (POST /v1/traces, /v1/metrics)."""
        return f"http://127.0.0.1:{self.http_port}"

    async def start(self, wait_s: float = 30.0) -> Collector:
        """Starts the collector and waits until it says its pipelines are ready."""
        self.out.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "OTELCOL_GRPC_ENDPOINT": f"127.0.0.1:{self.grpc_port}",
            "OTELCOL_HTTP_ENDPOINT": f"127.0.0.1:{self.http_port}",
            "OTELCOL_OUT": str(self.out),
        }
        with self.log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                str(self.binary), f"--config={CONFIG}", stdout=log, stderr=log, env=env
            )
        async with asyncio.timeout(wait_s):
            while _READY not in self.log():
                if self.proc.returncode is not None:
                    raise RuntimeError(f"the collector exited:\n{self.log()}")
                await asyncio.sleep(0.05)
        return self

    def log(self) -> str:
        """What the collector printed so far."""
        return self.log_path.read_text("utf-8", "replace")

    async def stop(self, wait_s: float = 15.0) -> int:
        """SIGTERM, the collector's graceful stop (its file exporter writes what it holds),
        then waits; returns the exit code."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(wait_s):
            return await self.proc.wait()

    def exported(self) -> Exported:
        """The spans and metrics in the files written so far."""
        result = Exported()
        for request in _lines(self.out / "traces.jsonl"):
            result.spans.extend(_spans(request))
        for request in _lines(self.out / "metrics.jsonl"):
            _add_metrics(request, result)
        return result


def _lines(path: Path) -> list[dict[str, Any]]:
    """One OTLP/JSON export request per line (the file exporter's default format)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _value(value: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue: {"stringValue": "x"}, {"intValue": "3"} (a string, as
    protojson writes 64-bit integers), {"arrayValue": {"values": [...]}}..."""
    if "arrayValue" in value:
        return [_value(v) for v in value["arrayValue"].get("values", [])]
    if "intValue" in value:
        return int(value["intValue"])
    return next(iter(value.values()), None)


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value", {})) for a in items}


def _service(resource: dict[str, Any]) -> str:
    return str(_attributes(resource.get("attributes", [])).get("service.name", ""))


def _spans(request: dict[str, Any]) -> list[Span]:
    """The spans of one export request; trace and span ids are hex in OTLP/JSON."""
    spans = []
    for resource_spans in request.get("resourceSpans", []):
        service = _service(resource_spans.get("resource", {}))
        for scope in resource_spans.get("scopeSpans", []):
            for span in scope.get("spans", []):
                spans.append(
                    Span(
                        name=span["name"],
                        trace_id=span["traceId"],
                        span_id=span["spanId"],
                        parent_span_id=span.get("parentSpanId", ""),
                        attributes=_attributes(span.get("attributes", [])),
                        links=[(l["traceId"], l["spanId"]) for l in span.get("links", [])],  # noqa: E741
                        service=service,
                        status_code=int(span.get("status", {}).get("code", 0)),
                    )
                )
    return spans


def _add_metrics(request: dict[str, Any], into: Exported) -> None:
    """Adds one export request's data points, by metric name (sum, gauge, histogram...)."""
    for resource_metrics in request.get("resourceMetrics", []):
        into.metric_services.add(_service(resource_metrics.get("resource", {})))
        for scope in resource_metrics.get("scopeMetrics", []):
            for metric in scope.get("metrics", []):
                points = into.metric_points.setdefault(metric["name"], [])
                for kind in ("sum", "gauge", "histogram", "exponentialHistogram", "summary"):
                    points.extend(metric.get(kind, {}).get("dataPoints", []))
