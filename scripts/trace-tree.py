#!/usr/bin/env python3
"""Prints what the collector of `make collector` wrote: each trace as a tree of spans (service,
name, Roundtable's correlation attributes), then the metrics received, by service.

    python3 scripts/trace-tree.py [var/otelcol]

Reads traces.jsonl and metrics.jsonl from the folder (the file exporter's OTLP/JSON, one
export request per line). Standard library only, so it runs without the venv.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The attributes worth a glance in a tree; the rest stay in the file.
SHOWN = ("thread_id", "request_id", "tenant", "caller_node")


@dataclass(frozen=True)
class Span:
    """One exported span, with just what the tree shows."""

    trace_id: str
    span_id: str
    parent_id: str
    service: str
    name: str
    start: int
    attributes: dict[str, Any]


def requests(path: Path) -> Iterator[dict[str, Any]]:
    """The export requests in one of the file exporter's files (none when it is absent)."""
    if path.exists():
        for line in path.read_text("utf-8").splitlines():
            if line.strip():
                yield json.loads(line)


def attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP/JSON key-value list as a dict; each value is {"stringValue": ...} or the like."""
    return {a["key"]: next(iter(a.get("value", {}).values()), None) for a in items}


def spans(path: Path) -> list[Span]:
    """Every span in traces.jsonl."""
    found = []
    for request in requests(path):
        for resource_spans in request.get("resourceSpans", []):
            resource = attributes(resource_spans.get("resource", {}).get("attributes", []))
            for scope in resource_spans.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    found.append(
                        Span(
                            trace_id=span["traceId"],
                            span_id=span["spanId"],
                            parent_id=span.get("parentSpanId", ""),
                            service=str(resource.get("service.name", "?")),
                            name=span["name"],
                            start=int(span.get("startTimeUnixNano", 0)),
                            attributes=attributes(span.get("attributes", [])),
                        )
                    )
    return found


def label(span: Span) -> str:
    """`service  name  thread_id=... request_id=...` (Roundtable's attributes only)."""
    shown = " ".join(
        f"{key}={span.attributes[f'roundtable.{key}']}"
        for key in SHOWN
        if f"roundtable.{key}" in span.attributes
    )
    return f"{span.service:<11} {span.name}  {shown}".rstrip()


def tree(trace: list[Span]) -> list[str]:
    """The lines of one trace: children under their parent, in start order; a span whose
    parent was not exported is printed as a root."""
    ids = {s.span_id for s in trace}
    children: dict[str, list[Span]] = defaultdict(list)
    for span in sorted(trace, key=lambda s: s.start):
        children[span.parent_id if span.parent_id in ids else ""].append(span)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for span in children[parent]:
            lines.append("  " * depth + label(span))
            walk(span.span_id, depth + 1)

    walk("", 0)
    return lines


def metric_names(path: Path) -> dict[str, set[str]]:
    """Metric names received, by service."""
    names: dict[str, set[str]] = defaultdict(set)
    for request in requests(path):
        for resource_metrics in request.get("resourceMetrics", []):
            resource = attributes(resource_metrics.get("resource", {}).get("attributes", []))
            for scope in resource_metrics.get("scopeMetrics", []):
                for metric in scope.get("metrics", []):
                    names[str(resource.get("service.name", "?"))].add(metric["name"])
    return names


def main(argv: list[str]) -> int:
    folder = Path(argv[1] if len(argv) > 1 else "var/otelcol")
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for span in spans(folder / "traces.jsonl"):
        by_trace[span.trace_id].append(span)
    if not by_trace:
        print(f"no spans in {folder / 'traces.jsonl'}", file=sys.stderr)
        return 1
    for trace_id, trace in by_trace.items():
        print(f"trace {trace_id} ({len(trace)} spans)")
        print("\n".join("  " + line for line in tree(trace)))
    for service, names in sorted(metric_names(folder / "metrics.jsonl").items()):
        print(f"metrics from {service}: {', '.join(sorted(names))}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except BrokenPipeError:  # `| head` closed the pipe: not an error of this script
        sys.exit(0)
