"""What the tool harness costs a tool call: ToolHarness (breaker, retry, audit, span,
timeout, McpPool) ÷ the bare `mcp` SDK's `ClientSession.call_tool` on an open session
(issue 20's goal: ≤ 1.3).

    .venv/bin/python bench/tool_call.py [--calls 300] [--rounds 5] [--quick] [--out FILE]

Both sides call `weather` (read-only) on the same test MCP server process
(tests/support/mcp_server.py, JSON responses) on loopback, in the same run, alternating call
by call (which goes first swaps each round), so the machine's noise hits them alike:

- `bare`: one `streamable_http_client` + `ClientSession` opened here, `call_tool` with the
  same `_meta` key the harness sends (the floor: what any MCP client pays);
- `harness`: `ToolHarness.call` as the server would build it with no OTLP endpoint (no
  tracer), audit lines at INFO through the server's batched log writer into a file;
- `harness_traced`: the same with an SDK tracer whose spans are batched and dropped (what an
  exported trace costs on this side, without the exporter's network).

Prints p50 / p99 per side (ms per call, all rounds' calls together) and the ratios to
`bare`, plus the median of the per-round p50 ratios. The tool server shares the 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the test tool server

import httpx2
from benchlib import percentile
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from roundtable.domain.tools import IDEMPOTENCY_META_KEY
from roundtable.harness.request import CallMeta, ToolRequest
from roundtable.harness.tool_chain import ToolHarness
from roundtable.telemetry import logs
from roundtable.tools.mcp_pool import McpPool
from support.mcp_server import McpServerProcess
from support.tool_calls import call_ref

META = CallMeta(thread_id="t", run_id="bench", request_id="q", tenant="x", caller_node="dispatch")


class DropSpans(SpanExporter):
    """Takes every batch and keeps nothing."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def measure(
    sides: dict[str, Callable[[int], Awaitable[Any]]], calls: int, rounds: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per-call ms of each side over all rounds, and each round's p50 per side."""
    names = list(sides)
    n = 0
    for _ in range(warmup):
        for name in names:
            n += 1
            await sides[name](n)
    samples: dict[str, list[float]] = {name: [] for name in names}
    round_p50: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        this_round: dict[str, list[float]] = {name: [] for name in names}
        gc.collect()
        for _ in range(calls):
            for name in order:
                n += 1
                t0 = time.perf_counter()
                await sides[name](n)
                this_round[name].append((time.perf_counter() - t0) * 1000)
        for name in names:
            samples[name] += this_round[name]
            round_p50[name].append(percentile(this_round[name], 50))
    return samples, round_p50


async def main(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rt-bench-tool-"))
    # As `roundtable serve` logs: INFO, batched, into a file (one audit line per attempt).
    log_file = (work / "serve.log").open("w")
    writer = logs.configure("INFO", log_file)
    try:
        return await measure_tool_call(work, args.calls, args.rounds, args.warmup)
    finally:
        writer.stop()
        log_file.close()
        result_log = work / "serve.log"
        print(f"audit lines: {_audit_lines(result_log)}", file=sys.stderr)


def _audit_lines(path: Path) -> int:
    return sum(1 for line in path.open() if " roundtable.audit " in line)


async def measure_tool_call(work: Path, calls: int, rounds: int, warmup: int) -> dict[str, Any]:
    """The three sides against a test MCP server started here (its log in `work`); logs go
    wherever the process's logging is configured (bench/suite.py: INFO into a file)."""
    server = await McpServerProcess(work / "mcp-server.log").start()
    pool = McpPool()
    try:
        ref = call_ref(server, "weather", "k", city="Paris")
        plain = ToolHarness(pool)
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(DropSpans()))
        traced = ToolHarness(pool, tracer=provider.get_tracer("bench"))
        async with (
            httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=300.0)) as http,
            streamable_http_client(server.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()

            async def bare(n: int) -> None:
                await session.call_tool(
                    "weather", {"city": "Paris"}, meta={IDEMPOTENCY_META_KEY: f"b/{n}"}
                )

            def through(harness: ToolHarness) -> Callable[[int], Awaitable[Any]]:
                async def call(n: int) -> None:
                    request = ToolRequest(ref=_keyed(ref, f"h/{n}"), meta=META)
                    await harness.call(request)

                return call

            samples, round_p50 = await measure(
                {"bare": bare, "harness": through(plain), "harness_traced": through(traced)},
                calls,
                rounds,
                warmup,
            )
        provider.shutdown()
    finally:
        await pool.aclose()
        await server.stop()
    result: dict[str, Any] = {"calls": calls, "rounds": rounds}
    base = samples["bare"]
    for name, xs in samples.items():
        ratios = [a / b for a, b in zip(round_p50[name], round_p50["bare"], strict=True)]
        result[name] = {
            "p50_ms": round(percentile(xs, 50), 3),
            "p99_ms": round(percentile(xs, 99), 3),
            "ratio_p50": round(percentile(xs, 50) / percentile(base, 50), 3),
            "ratio_p99": round(percentile(xs, 99) / percentile(base, 99), 3),
            "round_p50_ms": [round(x, 4) for x in round_p50[name]],
            "round_p50_ratios": [round(r, 4) for r in ratios],
            "round_p50_ratio_median": round(sorted(ratios)[len(ratios) // 2], 3),
        }
    return result


def _keyed(ref: Any, key: str) -> Any:
    """`ref` with another idempotency key (spelled out: ToolCallRef is frozen)."""
    return type(ref)(tool=ref.tool, server=ref.server, arguments=ref.arguments, key=key)


def report(result: dict[str, Any]) -> str:
    lines = [
        f"tool call, {result['calls']} calls x {result['rounds']} rounds per side, alternating",
        "",
        "| side | p50 ms | p99 ms | p50 ÷ bare | p99 ÷ bare | per-round p50 ratio (median) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in ("bare", "harness", "harness_traced"):
        r = result[name]
        lines.append(
            f"| {name} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['ratio_p50']:.2f} "
            f"| {r['ratio_p99']:.2f} | {r['round_p50_ratio_median']:.2f} |"
        )
    goal = result["harness"]["ratio_p50"]
    lines += [
        "",
        f"goal harness ÷ bare ≤ 1.3 (p50): {goal:.2f} {'met' if goal <= 1.3 else 'NOT met'}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="100 calls x 2 rounds")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.rounds, args.warmup = 100, 2, 20
    figures = asyncio.run(main(args))
    print(report(figures))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
