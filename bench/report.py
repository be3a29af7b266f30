"""Merges the suite's and the peer's results, judges every goal of issues 7, 20 and 21, and writes
`<out>.json` and `<out>.md` (default bench/results/latest.*); prints the Markdown.

Usage: python bench/report.py --suite FILE --peer FILE [--out bench/results/latest]
(standard library only, so any Python 3.11 runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # nan
            return "nan"
        if value == float("inf"):
            return "inf"
        a = abs(value)
        if a >= 10_000:
            return f"{value:,.0f}"
        if a >= 100:
            return f"{value:.0f}"
        if a >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return str(value)


def error_line(text: str) -> str:
    """The most telling line of a traceback."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("details =") or ("Error" in line and not line.startswith("File ")):
            return line.replace("|", "\\|")
    return lines[-1].replace("|", "\\|") if lines else ""


def fig(results: dict[str, Any], bench: str, name: str, *path: str) -> dict[str, Any] | None:
    node: Any = results.get("benches", {}).get(bench, {})
    for key in path or ("figures",):
        node = node.get(key, {}) if isinstance(node, dict) else {}
    found = node.get(name) if isinstance(node, dict) else None
    return found if isinstance(found, dict) and found.get("median") is not None else None


def paired_ratio(num: dict[str, Any] | None, den: dict[str, Any] | None) -> dict[str, Any] | None:
    """Ratio per repetition when both were measured interleaved, else ratio of medians."""
    if not num or not den:
        return None
    a, b = num.get("samples") or [], den.get("samples") or []
    if a and len(a) == len(b):
        ratios = [x / y for x, y in zip(a, b, strict=True) if y]
        return {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)}
    r = num["median"] / den["median"]
    return {"min": r, "median": r, "max": r}


def goal(
    name: str,
    target: str,
    measured: dict[str, Any] | None,
    ok: Any,
    detail: str = "",
    unit: str = "",
) -> dict[str, Any]:
    met = None if ok is None else bool(ok)
    if measured is None and target != "report":
        detail = "not measured (see Errors)"
    return {
        "goal": name,
        "target": target,
        "median": measured.get("median") if measured else None,
        "min": measured.get("min") if measured else None,
        "max": measured.get("max") if measured else None,
        "unit": unit,
        "met": met,
        "detail": detail,
    }


def least_served(suite: dict[str, Any]) -> dict[str, Any] | None:
    """What a served turn would cost on this host if serving added nothing but gRPC's own
    server-side work: the in-process durable turn (B1 ii) plus the serve CPU per turn of
    the bare grpc.aio handler that answers the same messages (`grpc_floor`). The engine
    runs on one thread (the GIL), so the served turn cannot take less. B1 ii per
    repetition, plus the handler's CPU as one mean over the run (measured once a run)."""
    durable = fig(suite, "B1", "ii_durable")
    cpu = ((suite.get("benches") or {}).get("B1") or {}).get("server_cpu_ms_per_turn") or {}
    grpc_ms = cpu.get("grpc_floor")
    if not durable or not grpc_ms:
        return None
    samples = [x + grpc_ms for x in durable.get("samples") or []]
    if not samples:
        return None
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "samples": samples,
    }


def judge(suite: dict[str, Any], peer: dict[str, Any]) -> list[dict[str, Any]]:
    goals: list[dict[str, Any]] = []
    # B1
    floor = fig(suite, "B1", "i_floor")
    e2e = fig(suite, "B1", "iii_grpc")
    r = paired_ratio(e2e, floor)
    goals.append(
        goal(
            "B1 end to end over gRPC ÷ in-process floor",
            "≤ 2.0",
            r,
            r and r["median"] <= 2.0,
            f"(iii) {fmt(e2e and e2e['median'])} ms vs (i) {fmt(floor and floor['median'])} ms",
            "x",
        )
    )
    pg = fig(suite, "B1", "iii_grpc_postgres")
    if pg:
        goals.append(
            goal(
                "B1 end to end, a replica on Postgres ÷ on SQLite (iii_grpc_postgres ÷ iii_grpc)",
                "report",
                paired_ratio(pg, e2e),
                None,
                f"{fmt(pg['median'])} ms vs {fmt(e2e and e2e['median'])} ms",
                "x",
            )
        )
    for variant, label in (
        ("grpc_floor", "B1 gRPC floor (bare grpc.aio handler, same client and messages) ÷ floor"),
        ("iii_grpc_go", "B1 end to end, Go gRPC client (bench/goclient) ÷ floor"),
        ("ii_durable", "B1 in-process durable ÷ floor (ii ÷ i)"),
        ("ii_durable_sync_full", "B1 durable with synchronous=FULL (LangGraph default) ÷ floor"),
        (
            "ii_durable_async",
            "B1 durable, durability='async' (checkpoints at plan and round) ÷ floor",
        ),
    ):
        v = fig(suite, "B1", variant)
        rr = paired_ratio(v, floor)
        goals.append(goal(label, "report", rr, None, f"{fmt(v and v['median'])} ms", "x"))
    least = least_served(suite)
    if least:
        goals.append(
            goal(
                "B1 least served turn on this host ((ii) + the bare gRPC handler's CPU) ÷ floor",
                "report",
                paired_ratio(least, floor),
                None,
                f"{fmt(least['median'])} ms: the served turn if serving cost nothing but "
                "gRPC's own server-side work",
                "x",
            )
        )
    # B2
    for key, label in (
        (
            "ratio_langchain_vs_raw",
            "B2 streamed tokens/s ÷ raw gRPC msgs/s (LangChain provider path)",
        ),
        (
            "ratio_native_vs_raw",
            "B2 streamed tokens/s ÷ raw gRPC msgs/s (native provider: Roundtable's pipe)",
        ),
        (
            "ratio_native_reads_vs_raw",
            "B2 the same, the model's tokens arriving 64 per network read",
        ),
        (
            "ratio_native_whole_reads_vs_raw",
            "B2 the same, the provider handing over each read's 64 tokens at once",
        ),
    ):
        v = fig(suite, "B2", key)
        goals.append(goal(label, "≥ 20", v, v and v["median"] >= 20, "", "x"))
    paced = fig(suite, "B2", "paced_latency_p99_ms")
    cfg = suite.get("benches", {}).get("B2", {}).get("paced", {})
    goals.append(
        goal(
            "B2 token produced → received latency p99, at model pace",
            "≤ 30 ms",
            paced,
            paced and paced["median"] <= 30,
            f"{cfg.get('token_delay_ms', '?')} ms/token, default 20 ms window / 1,024 B cap",
            "ms",
        )
    )
    flood = fig(suite, "B2", "flood_langchain_latency_p99_ms")
    goals.append(
        goal(
            "B2 token latency p99 while flooding (LangChain path)",
            "≤ 30 ms",
            flood,
            flood and flood["median"] <= 30,
            "",
            "ms",
        )
    )
    for key, label in (
        ("flood_native_reads_latency_p99_ms", "native, 64 tokens per read"),
        ("flood_native_whole_reads_latency_p99_ms", "native, whole reads handed over"),
    ):
        reads = fig(suite, "B2", key)
        goals.append(
            goal(
                f"B2 token latency p99 while flooding ({label})",
                "≤ 30 ms",
                reads,
                reads and reads["median"] <= 30,
                "",
                "ms",
            )
        )
    # B3
    b3_body = suite.get("benches", {}).get("B3", {})
    b3 = b3_body.get("figures", {})
    if b3:
        rate = b3.get("max_rate_per_s")
        below = [
            fmt(s["rate_per_s"])
            for s in b3_body.get("steps", [])
            if not s["passed"] and s["rate_per_s"] < (rate or 0)
        ]
        goals.append(
            goal(
                "B3 highest open-loop rate with every run completed and TTFE p99 ≤ 100 ms",
                "report",
                {"median": float(rate or 0), "min": None, "max": None},
                None,
                f"CPU {fmt(b3.get('cpu_s_per_turn_at_max'))} s/turn at that rate"
                + (f"; lower rate(s) that failed: {', '.join(below)}/s" if below else ""),
                "turns/s",
            )
        )
    # B4
    b4 = fig(suite, "B4", "kb_per_parked_run")
    runs = suite.get("benches", {}).get("B4", {}).get("runs")
    goals.append(
        goal(
            "B4 RSS per in-flight run (parked in a model call)",
            "≤ 64 KB",
            b4,
            b4 and b4["median"] <= 64,
            f"{fmt(runs)} runs parked",
            "KB",
        )
    )
    floors = (
        ("floor_grpc", "B4 floor: a bare grpc.aio stream parked after one event"),
        (
            "floor_grpc_langgraph",
            "B4 floor: the same stream holding a bare LangGraph run parked in a node",
        ),
        ("run_over_floor", "B4 Roundtable's own share (run less the LangGraph floor)"),
    )
    for name, label in floors:
        value = fig(suite, "B4", f"kb_per_parked_{name}")
        if value is not None:
            goals.append(goal(label, "report", value, None, "same run, fresh servers", "KB"))
    # B5
    h10, h10k = fig(suite, "B5", "history_10"), fig(suite, "B5", "history_10000")
    r = paired_ratio(h10k, h10)
    goals.append(
        goal(
            "B5 turn with 10,000 history messages ÷ with 10",
            "≤ 1.2",
            r,
            r and r["median"] <= 1.2,
            f"{fmt(h10k and h10k['median'])} ms vs {fmt(h10 and h10['median'])} ms "
            "(the client sends a serialized snapshot it keeps)",
            "x",
        )
    )
    own = fig(suite, "B5", "own_history_10000_over_10")
    f10 = fig(suite, "B5", "grpc_floor_history_10")
    f10k = fig(suite, "B5", "grpc_floor_history_10000")
    if own and f10 and f10k:
        goals.append(
            goal(
                "B5 the same less gRPC's own cost of each turn (Roundtable's part)",
                "report",
                own,
                None,
                f"a bare grpc.aio handler took {fmt(f10k['median'])} ms vs "
                f"{fmt(f10['median'])} ms for the same bytes and responses",
                "x",
            )
        )
    h64 = fig(suite, "B5", "history_64")
    r64 = paired_ratio(h10k, h64)
    if r64:
        goals.append(
            goal(
                "B5 10,000 history messages ÷ 64 (the prompt's window full in both)",
                "report",
                r64,
                None,
                f"{fmt(h10k and h10k['median'])} ms vs {fmt(h64 and h64['median'])} ms",
                "x",
            )
        )
    c10 = fig(suite, "B5", "client_serializes_history_10")
    c10k = fig(suite, "B5", "client_serializes_history_10000")
    rc = paired_ratio(c10k, c10)
    goals.append(
        goal(
            "B5 the same with the client serializing the whole request per turn",
            "report",
            rc,
            None,
            f"{fmt(c10k and c10k['median'])} ms vs {fmt(c10 and c10['median'])} ms",
            "x",
        )
    )
    s1, s4, s16 = (fig(suite, "B5", f"speakers_{n}") for n in (1, 4, 16))
    if s1 and s4 and s16:
        inc_low = (s4["median"] - s1["median"]) / 3
        inc_high = (s16["median"] - s4["median"]) / 12
        # Judged repetition by repetition (the three were measured interleaved): a speaker
        # costs ~0.5 ms against a ~9 ms turn, so unpaired medians mostly measure noise.
        reps = list(zip(*(f.get("samples") or [] for f in (s1, s4, s16)), strict=False))
        paired = [((c - b) / 12) / ((b - a) / 3) if b > a else float("inf") for a, b, c in reps]
        if paired:
            measured = {
                "median": statistics.median(paired),
                "min": min(paired),
                "max": max(paired),
            }
        else:
            ratio = inc_high / inc_low if inc_low > 0 else float("inf")
            measured = {"median": ratio, "min": None, "max": None}
        goals.append(
            goal(
                "B5 speakers 1/4/16 linear: ms per added speaker, 4→16 ÷ 1→4",
                "≤ 1.25",
                measured,
                measured["median"] <= 1.25,
                f"{fmt(s1['median'])} / {fmt(s4['median'])} / {fmt(s16['median'])} ms; "
                f"+{fmt(inc_low)} ms/speaker (1→4), +{fmt(inc_high)} ms/speaker (4→16)",
                "x",
            )
        )
    # B6
    calls = fig(suite, "B6", "model_calls_speakers_1_8")
    reps = suite.get("benches", {}).get("B6", {}).get("reps", [])
    all_done = bool(reps) and all(r.get("completed") and r.get("resumed_flag") for r in reps)
    ttfe = fig(suite, "B6", "time_to_first_event_ms")
    goals.append(
        goal(
            "B6 model calls for speakers 1-8 after SIGKILL + resume",
            "= 0, and the resumed run completes",
            calls,
            (calls["max"] == 0 and all_done) if calls else None,
            f"resume completed in {sum(1 for r in reps if r.get('completed'))}/{len(reps)}; "
            f"first new event after {fmt(ttfe and ttfe['median'])} ms",
            "calls",
        )
    )
    goals.append(goal("B6 time to first new event after resume", "report", ttfe, None, "", "ms"))
    # B8: tools and approval (issue 20)
    b8 = suite.get("benches", {}).get("B8", {})
    if b8 or "B8" in suite.get("errors", {}):
        goals += judge_b8(suite, b8)
    # B9: parallel speakers
    for name, target, limit in (
        ("parallel_4_over_one", "≤ 1.25", 1.25),
        ("parallel_16_over_one", "≤ 1.5", 1.5),
    ):
        ratio = fig(suite, "B9", name)
        goals.append(
            goal(
                f"B9 {name.replace('_over_one', '').replace('_', ' ')} turn ÷ one speaker's turn",
                target,
                ratio,
                ratio and ratio["median"] <= limit,
                "sequential 4: "
                f"{fmt((fig(suite, 'B9', 'sequential_4_over_one') or {}).get('median'))}x",
                "x",
            )
        )
    cpu = fig(suite, "B9", "cpu_parallel_4_over_sequential_4")
    goals.append(
        goal(
            "B9 Roundtable CPU per parallel turn ÷ per sequential turn (4 speakers)",
            "≤ 1.1",
            cpu,
            cpu and cpu["median"] <= 1.1,
            "",
            "x",
        )
    )
    # B7: AutoGen's batches interleaved with B1's (paired per repetition) when the suite
    # ran them; else the peer's own run after the suite (ratio of medians, unpaired).
    paired = fig(suite, "B1", "peer_autogen")
    autogen = paired or (peer.get("figures") or {}).get("autogen_turn_ms")
    left_out = ((suite.get("benches") or {}).get("B1") or {}).get("peer_autogen_left_out")
    how = (
        "interleaved with B1, paired per repetition"
        if paired
        else "AutoGen measured after the suite, unpaired" + (f": {left_out}" if left_out else "")
    )

    def versus(ours: dict[str, Any] | None) -> dict[str, Any] | None:
        if not ours or not autogen:
            return None
        if paired:
            return paired_ratio(ours, autogen)
        return {
            "median": ours["median"] / autogen["median"],
            "min": ours["min"] / autogen["max"],
            "max": ours["max"] / autogen["min"],
        }

    go_e2e = fig(suite, "B1", "iii_grpc_go")
    if autogen and go_e2e:
        goals.append(
            goal(
                "B7 the same, Roundtable driven by the Go client ÷ AutoGen",
                "report",
                versus(go_e2e),
                None,
                f"{fmt(go_e2e['median'])} ms vs {fmt(autogen['median'])} ms",
                "x",
            )
        )
    grpc_floor = fig(suite, "B1", "grpc_floor")
    if paired and autogen and e2e and grpc_floor:
        # What is Roundtable's own in the served turn: the same client and messages from a
        # bare grpc.aio handler cost `grpc_floor`, repetition by repetition.
        a, f, p = (x.get("samples") or [] for x in (e2e, grpc_floor, autogen))
        if a and len(a) == len(f) == len(p):
            own = [(x - y) / z for x, y, z in zip(a, f, p, strict=True) if z]
            goals.append(
                goal(
                    "B7 Roundtable's own part of the served turn (iii_grpc − gRPC floor) ÷ AutoGen",
                    "report",
                    {"median": statistics.median(own), "min": min(own), "max": max(own)},
                    None,
                    f"gRPC floor {fmt(grpc_floor['median'])} ms: a bare grpc.aio handler "
                    "replaying the turn's responses to the same Python client",
                    "x",
                )
            )
    least = least_served(suite)
    bound = versus(least)
    if least and bound:
        goals.append(
            goal(
                "B7 least served turn on this host ((ii) + the bare gRPC handler's CPU) ÷ AutoGen",
                "report",
                bound,
                None,
                f"{fmt(least['median'])} ms vs {fmt(autogen and autogen['median'])} ms"
                + (
                    ": above 1.0, no change to serving alone can meet B7 on this host"
                    if bound["median"] > 1.0
                    else ""
                ),
                "x",
            )
        )
    alone = (peer.get("figures") or {}).get("autogen_turn_ms")
    if paired and alone and e2e:
        goals.append(
            goal(
                "B7 the same against AutoGen's own run after the suite (unpaired, warm loop)",
                "report",
                {
                    "median": e2e["median"] / alone["median"],
                    "min": e2e["min"] / alone["max"],
                    "max": e2e["max"] / alone["min"],
                },
                None,
                f"{fmt(e2e['median'])} ms vs {fmt(alone['median'])} ms",
                "x",
            )
        )
    r = versus(e2e)
    goals.append(
        goal(
            "B7 Roundtable durable turn over gRPC ÷ AutoGen RoundRobinGroupChat in process",
            "≤ 1.0",
            r,
            r and r["median"] <= 1.0,
            f"{fmt(e2e and e2e['median'])} ms vs {fmt(autogen and autogen['median'])} ms ({how})",
            "x",
        )
    )
    return goals


def judge_b8(suite: dict[str, Any], b8: dict[str, Any]) -> list[dict[str, Any]]:
    """B8's goals: RSS per run awaiting approval, decision → first resumed event, and a tool
    call through the harness ÷ the bare MCP client call."""
    out = []

    def f(name: str) -> dict[str, Any] | None:
        return fig(suite, "B8", name)

    def med(name: str) -> Any:
        return (f(name) or {}).get("median")

    runs = b8.get("runs")
    every = f"every {b8.get('collect_every', '?')} runs"
    for key, target, limit, label in (
        ("no_stream", "≤ 8 KB", 8, "no stream attached"),
        ("one_stream", "≤ 32 KB", 32, "one stream attached (its StartRun open)"),
    ):
        value = f(f"kb_per_parked_run_{key}")
        detail = (
            f"{fmt(runs)} runs; second half alone "
            f"{fmt(med(f'kb_per_parked_run_{key}_second_half'))} KB/run; with the server's "
            f"garbage collected {every} {fmt(med(f'kb_per_parked_run_{key}_collected'))}"
        )
        if key == "one_stream":
            detail += f"; a bare grpc.aio stream alone {fmt(med('kb_per_stream_floor_grpc'))}"
        else:
            detail += (
                f"; the collections freed {fmt(med('garbage_objects_per_parked_run'))} "
                "objects per run"
            )
        out.append(
            goal(
                f"B8 RSS per run awaiting approval, {label}",
                target,
                value,
                value and value["median"] <= limit,
                detail,
                "KB",
            )
        )
    for key, label in (
        ("no_stream_collected", f"B8 the same, no stream, garbage collected {every}"),
        ("one_stream_collected", f"B8 the same, one stream, garbage collected {every}"),
    ):
        value = f(f"kb_per_parked_run_{key}")
        if value is not None:
            out.append(goal(label, "report", value, None, "bench/flood_server.py", "KB"))
    first = f("resume_first_event_p99_ms")
    kinds = b8.get("resume_first_kinds") or {}
    out.append(
        goal(
            "B8 decision → first resumed event on the stream, p99 (SQLite)",
            "≤ 20 ms",
            first,
            first and first["median"] <= 20,
            f"p50 {fmt(med('resume_first_event_p50_ms'))} ms; first event: "
            + (", ".join(f"{k} ({v})" for k, v in kinds.items()) or "—")
            + f"; ResolvePermission answered p50 {fmt(med('resolve_answer_p50_ms'))} ms; "
            f"→ assistant_final (the tool ran through MCP) p99 "
            f"{fmt(med('resume_final_p99_ms'))} ms",
            "ms",
        )
    )
    ratio = f("tool_call_harness_over_bare")
    out.append(
        goal(
            "B8 a tool call through the harness ÷ the bare mcp ClientSession.call_tool (p50)",
            "≤ 1.3",
            ratio,
            ratio and ratio["median"] <= 1.3,
            f"{fmt(med('tool_call_harness_p50_ms'))} ms vs {fmt(med('tool_call_bare_p50_ms'))} "
            f"ms; p99 ratio {fmt(med('tool_call_harness_over_bare_p99'))}; traced "
            f"{fmt(med('tool_call_harness_traced_over_bare'))}",
            "x",
        )
    )
    return out


def all_figures(suite: dict[str, Any], peer: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []

    def add(bench: str, name: str, f: Any) -> None:
        if isinstance(f, dict) and "median" in f and "unit" in f:
            rows.append(
                {
                    "bench": bench,
                    "name": name,
                    **{k: f.get(k) for k in ("min", "median", "max", "unit", "n")},
                }
            )

    for bench, body in suite.get("benches", {}).items():
        for name, f in body.get("figures", {}).items():
            add(bench, name, f)
        for name, f in body.get("components", {}).get("figures", {}).items():
            add(bench + " parts", name, f)
    for name, f in (peer.get("figures") or {}).items():
        add("B7", name, f)
    return rows


def markdown(
    suite: dict[str, Any],
    peer: dict[str, Any],
    goals: list[dict[str, Any]],
    figures: list[dict[str, Any]],
) -> str:
    m = suite.get("machine", {})
    v = m.get("versions", {})
    lines = [
        f"# Roundtable benchmark ({suite.get('mode', '?')} mode)",
        "",
        f"- date: {m.get('date_utc')}; HEAD {m.get('commit')} (the work tree may hold uncommitted changes)",
        f"- machine: {m.get('nproc')} cores, {m.get('memory_gib')} GiB, {m.get('cpu_model')}, kernel {m.get('kernel')}"
        + (f" ({m['cpu_idle']})" if m.get("cpu_idle") else ""),
        f"- load average (1/5/15 min) at start {' / '.join(m.get('loadavg_start') or ['?'])}, "
        f"at end {' / '.join(m.get('loadavg_end') or ['?'])} (other work on the machine widens min-max)",
        f"- Python {m.get('python')}; "
        + ", ".join(f"{k} {val}" for k, val in v.items())
        + (
            "; AutoGen peer: "
            + ", ".join(f"{k} {val}" for k, val in (peer.get("versions") or {}).items())
            if peer
            else "; AutoGen peer: not run"
        ),
        f"- suite {fmt(suite.get('seconds'))} s, peer {fmt(peer.get('seconds') if peer else None)} s"
        + (
            "; quick mode: fewer repetitions and shorter runs, figures are a smoke test only"
            if suite.get("mode") == "quick"
            else ""
        ),
        "",
        "## Goals (issues 7, 20, 21)",
        "",
        "| goal | target | median | min | max | unit | met | detail |",
        "| --- | --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for g in goals:
        met = {True: "**met**", False: "**not met**", None: "—"}[g["met"]]
        lines.append(
            f"| {g['goal']} | {g['target']} | {fmt(g['median'])} | {fmt(g['min'])} | {fmt(g['max'])} | {g['unit']} | {met} | {g['detail']} |"
        )
    lines += [
        "",
        "## Every figure (min / median / max over repetitions)",
        "",
        "| bench | figure | min | median | max | unit | n |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for f in figures:
        lines.append(
            f"| {f['bench']} | {f['name']} | {fmt(f['min'])} | {fmt(f['median'])} | {fmt(f['max'])} | {f['unit']} | {fmt(f.get('n'))} |"
        )
    b1 = suite.get("benches", {}).get("B1", {})
    if b1.get("server_cpu_ms_per_turn"):
        lines += [
            "",
            "### B1 CPU per end-to-end turn",
            "",
            "| variant | serve process CPU ms/turn | bench client CPU ms/turn |",
            "| --- | ---: | ---: |",
        ]
        for name, ms in b1["server_cpu_ms_per_turn"].items():
            lines.append(
                f"| {name} | {fmt(ms)} | {fmt((b1.get('client_cpu_ms_per_turn') or {}).get(name))} |"
            )
    if b1.get("rows_per_turn"):
        lines += [
            "",
            "### B1 store rows written per turn",
            "",
            "| variant | checkpoints | writes | events |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name, r in b1["rows_per_turn"].items():
            lines.append(
                f"| {name} | {fmt(r.get('checkpoints'))} | {fmt(r.get('writes'))} | {fmt(r.get('rt_events'))} |"
            )
    b3 = suite.get("benches", {}).get("B3", {})
    for title, steps in (("B3 open-loop steps", b3.get("steps", [])),):
        if not steps:
            continue
        lines += [
            "",
            f"### {title} ({fmt(b3.get('step_s'))} s each)",
            "",
            "| rate/s | started | completed | TTFE p50 ms | TTFE p99 ms | p99 by fifth (min/med/max) | turn p99 s | server CPU s/turn | server CPU util | passed |",
            "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |",
        ]
        for s in steps:
            w = s.get("ttfe_p99_by_window_ms", {})
            lines.append(
                f"| {fmt(s['rate_per_s'])} | {s['started']} | {s['completed']} | {fmt(s['ttfe_p50_ms'])} | {fmt(s['ttfe_p99_ms'])} | "
                f"{fmt(w.get('min'))} / {fmt(w.get('median'))} / {fmt(w.get('max'))} | {fmt(s['turn_p99_s'])} | "
                f"{fmt(s['cpu_s_per_turn'])} | {fmt(s['server_cpu_util'])} | {fmt(s['passed'])} |"
            )
    reps = suite.get("benches", {}).get("B6", {}).get("reps", [])
    if reps:
        lines += [
            "",
            "### B6 repetitions",
            "",
            "| first event ms | first speaker ms | calls 1-8 | finals in B (steps) | resumed | completed |",
            "| ---: | ---: | ---: | --- | --- | --- |",
        ]
        for r in reps:
            lines.append(
                f"| {fmt(r['ttfe_ms'])} | {fmt(r['first_speaker_ms'])} | {r['model_calls_speakers_1_8']} | "
                f"{','.join(map(str, r['b_finals']))} | {fmt(r['resumed_flag'])} | {fmt(r['completed'])} |"
            )
    errors = dict(suite.get("errors", {}))
    comp_errors = b1.get("components", {}).get("errors", {})
    if comp_errors:
        errors["B1 parts"] = json.dumps(comp_errors)
    if peer.get("error"):
        errors["B7"] = peer["error"]
    if errors:
        lines += ["", "## Errors", ""]
        for name, text in errors.items():
            lines.append(f"- {name}: {error_line(text)}")
    lines += ["", "## How each figure is measured", ""]
    for bench, body in suite.get("benches", {}).items():
        if body.get("notes"):
            lines.append(f"- **{bench}** ({fmt(body.get('seconds'))} s): {body['notes']}")
    if peer.get("notes"):
        lines.append(f"- **B7**: {peer['notes']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", default=str(HERE / "results" / "latest.suite.json"))
    parser.add_argument("--peer", default=str(HERE / "results" / "latest.peer.json"))
    parser.add_argument("--out", default=str(HERE / "results" / "latest"))
    args = parser.parse_args()
    suite = json.loads(Path(args.suite).read_text()) if Path(args.suite).exists() else {}
    peer_path = Path(args.peer)
    try:
        peer = json.loads(peer_path.read_text()) if peer_path.exists() else {}
    except ValueError as exc:
        peer = {"error": f"unreadable peer results: {exc}"}
    goals = judge(suite, peer)
    figures = all_figures(suite, peer)
    text = markdown(suite, peer, goals, figures)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.md").write_text(text)
    Path(f"{out}.json").write_text(
        json.dumps(
            {
                "schema": 1,
                "mode": suite.get("mode"),
                "machine": suite.get("machine"),
                "peer_versions": peer.get("versions"),
                "goals": goals,
                "figures": figures,
                "suite": suite,
                "peer": peer,
            },
            indent=2,
            default=float,
        )
    )
    print(text)
    print(f"wrote {out}.md and {out}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
