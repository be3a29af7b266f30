"""B8 (issue 20): runs waiting for a person's approval, and the decision that resumes them.

Against a real `roundtable serve` on a SQLite file and the test MCP server
(tests/support/mcp_server.py), one fresh `serve` per repetition and variant:

1. warm-up: whole approval cycles (park, decide, run to the end); in full mode half of
   them with the client gone while the run waited (quick mode: all followed);
2. `no_stream`: N runs parked with no stream attached. Each is a StartRun whose member calls
   `note` (APPROVAL_POLICY_ALWAYS): the client reads until `permission_required`, then
   cancels its call; the run stays parked (the default disconnect policy is CONTINUE), which
   GetRun confirms for every run (RUN_STATUS_AWAITING_APPROVAL). VmRSS growth ÷ N;
3. `one_stream` (a server of its own): N runs, each StartRun kept open (its stream attached, idle). Growth ÷ N;
4. `resume`: on L of the runs of (3), one at a time: ResolvePermission(approve) sent → the
   next event on the run's stream (the resumed speaker's `speaker_started`: the tool runs
   after it), and → `assistant_final` (the tool call through MCP included).

`bench/suite.py` (`bench_b8`) runs these, B4's bare grpc.aio stream floor for the stream's
share, and bench/tool_call.py's ratio. See bench/README.md.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import Server, percentile, turn_request

NOTE_SCHEMA = json.dumps(
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
)
TEXT = "use note for buy milk"
"""The offline model calls the tool the user turn names, with the rest as its argument."""
TENANTS = 20
"""Runs are spread over tenants: the server caps runs of one tenant executing at once."""
CHANNELS = 10
CONCURRENCY = 16
"""Runs being started at once (until each waits)."""


def approval_request(mcp_url: str, run_id: str, tenant: str) -> Any:
    """A single chat whose one member calls `note`, which needs a person's approval."""
    from roundtable.v1 import snapshot_pb2 as spb

    request = turn_request(TEXT, run_id=run_id, tenant=tenant, members=1, kind="single")
    request.snapshot.members[0].tool_names.append("note")
    session = request.snapshot.session
    session.tool_servers.add(server_id="local", url=mcp_url)
    session.tools.add(
        name="note",
        description="Writes a note.",
        input_schema_json=NOTE_SCHEMA,
        server_id="local",
        approval=spb.APPROVAL_POLICY_ALWAYS,
    )
    return request


class Stream:
    """A StartRun read in the background: each event's kind and arrival time."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.events: list[tuple[float, str]] = []
        self.permission_id = ""
        self._arrived = asyncio.Event()
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            event = response.event
            kind = event.WhichOneof("payload") or ""
            if kind == "permission_required":
                self.permission_id = event.permission_required.permission_request_id
            self.events.append((time.perf_counter(), kind))
            self._arrived.set()

    async def until(self, predicate: Any, wait_s: float = 60.0) -> int:
        """The index of the first event for which `predicate(index, kind)` holds."""
        async with asyncio.timeout(wait_s):
            while True:
                for i, (_, kind) in enumerate(self.events):
                    if predicate(i, kind):
                        return i
                if self.task.done():
                    self.task.result()
                    raise RuntimeError(f"stream ended: {[k for _, k in self.events]}")
                self._arrived.clear()
                await self._arrived.wait()

    def index_of(self, kind: str) -> int:
        return next(i for i, (_, k) in enumerate(self.events) if k == kind)

    async def close(self) -> None:
        self.call.cancel()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@dataclass
class Parked:
    tenant: str
    run_id: str
    stream: Stream | None = None
    permission_id: str = ""


async def park(stub: Any, request: Any, *, keep: bool) -> Parked:
    """Starts a run and reads its stream until `permission_required`; without `keep` the
    client then goes away (the call cancelled)."""
    ctx = request.context
    stream = Stream(stub.StartRun(request))
    try:
        await stream.until(lambda _i, kind: kind == "permission_required")
    except BaseException:
        await stream.close()
        raise
    parked = Parked(ctx.tenant, ctx.run_id, permission_id=stream.permission_id)
    if keep:
        parked.stream = stream
    else:
        await stream.close()
    return parked


async def wait_parked(stub: Any, runs: Sequence[Parked], wait_s: float = 60.0) -> None:
    """Polls GetRun until every run is RUN_STATUS_AWAITING_APPROVAL (it parks a moment after
    permission_required is sent); raises when one is anything but that or running."""
    from roundtable.v1 import orchestrator_service_pb2 as pb

    waiting = list(runs)
    async with asyncio.timeout(wait_s):
        while waiting:
            left = []
            for run in waiting:
                answer = await stub.GetRun(pb.GetRunRequest(run_id=run.run_id, tenant=run.tenant))
                status = answer.run.status
                if status == pb.RUN_STATUS_RUNNING:
                    left.append(run)
                elif status != pb.RUN_STATUS_AWAITING_APPROVAL:
                    raise RuntimeError(f"run {run.run_id} is {pb.RunStatus.Name(status)}")
            waiting = left
            if waiting:
                await asyncio.sleep(0.05)


async def park_many(
    stubs: Sequence[Any], mcp_url: str, n: int, prefix: str, *, keep: bool, offset: int = 0
) -> list[Parked]:
    """n runs parked, CONCURRENCY being started at once, spread over channels and tenants;
    confirmed waiting by GetRun."""
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> Parked:
        tenant = f"bench-{i % TENANTS}"
        async with limit:
            return await park(
                stubs[i % len(stubs)],
                approval_request(mcp_url, f"{prefix}-{i}", tenant),
                keep=keep,
            )

    runs = await asyncio.gather(*(one(offset + i) for i in range(n)))
    await wait_parked(stubs[0], runs)
    return list(runs)


async def resolve(stub: Any, run: Parked) -> Any:
    from roundtable.v1 import orchestrator_service_pb2 as pb

    return await stub.ResolvePermission(
        pb.ResolvePermissionRequest(
            run_id=run.run_id,
            tenant=run.tenant,
            permission_request_id=run.permission_id,
            decision=pb.PERMISSION_DECISION_APPROVE,
        )
    )


async def wait_succeeded(stub: Any, run: Parked, wait_s: float = 30.0) -> None:
    from roundtable.v1 import orchestrator_service_pb2 as pb

    async with asyncio.timeout(wait_s):
        while True:
            answer = await stub.GetRun(pb.GetRunRequest(run_id=run.run_id, tenant=run.tenant))
            if answer.run.status == pb.RUN_STATUS_SUCCEEDED:
                return
            if answer.run.status not in (pb.RUN_STATUS_RUNNING, pb.RUN_STATUS_AWAITING_APPROVAL):
                raise RuntimeError(f"run {run.run_id} is {pb.RunStatus.Name(answer.run.status)}")
            await asyncio.sleep(0.01)


async def approve_and_follow(stub: Any, run: Parked) -> dict[str, Any]:
    """Approves a parked run whose stream is attached; times the stream's next events."""
    assert run.stream is not None
    stream = run.stream
    asked = stream.index_of("permission_required")
    t0 = time.perf_counter()
    answer = await resolve(stub, run)
    answered = time.perf_counter()
    if not answer.resumed:
        raise RuntimeError(f"run {run.run_id} was not resumed here")
    first = await stream.until(lambda i, _kind: i > asked)
    final = await stream.until(lambda i, kind: i > asked and kind == "assistant_final")
    end = await stream.until(lambda i, kind: i > asked and kind == "run_completed")
    return {
        "first_event_ms": (stream.events[first][0] - t0) * 1000,
        "first_kind": stream.events[first][1],
        "answer_ms": (answered - t0) * 1000,
        "final_ms": (stream.events[final][0] - t0) * 1000,
        "completed_ms": (stream.events[end][0] - t0) * 1000,
        "after": [k for _, k in stream.events[asked + 1 :]],
    }


def rss_parts(pid: int) -> dict[str, int]:
    """VmRSS and its parts (anonymous, file-backed, shared memory), bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[name] = int(value.split()[0]) * 1024
    return out


async def warm_up(stubs: Sequence[Any], mcp_url: str, n: int, prefix: str) -> None:
    """n whole approval cycles: parked, approved, run to the end. The first few one at a
    time with their streams attached (timed like the measured resumes), the rest with their
    clients gone while they waited, approved all at once."""
    followed = min(n, 10)
    for run in await park_many(stubs, mcp_url, followed, f"{prefix}f", keep=True):
        await approve_and_follow(stubs[0], run)
        assert run.stream is not None
        await run.stream.close()
    runs = await park_many(stubs, mcp_url, n - followed, f"{prefix}d", keep=False)
    limit = asyncio.Semaphore(CONCURRENCY)

    async def approve(i: int, run: Parked) -> None:
        async with limit:
            await resolve(stubs[i % len(stubs)], run)
            await wait_succeeded(stubs[i % len(stubs)], run)

    await asyncio.gather(*(approve(i, run) for i, run in enumerate(runs)))


async def measure_parked(
    work: Path,
    mcp_url: str,
    name: str,
    *,
    runs: int,
    keep: bool,
    warmup: int,
    resumes: int = 0,
    collect_every: int = 0,
    flood_server: Path | None = None,
) -> dict[str, Any]:
    """A fresh server: warm-up, then `runs` runs parked for approval, with their streams
    attached (`keep`) or not, in ten chunks (VmRSS read after each); VmRSS growth ÷ runs,
    and the growth over the second half ÷ its runs. Then `resumes` of them approved one at
    a time, each timed on its stream.

    With `collect_every`, the server is bench/flood_server.py (the same composition root)
    and runs a full `gc.collect()` before the first run and after every `collect_every`
    runs parked: the growth without the garbage the parking executions leave behind.
    """
    import grpc

    db = work / f"b8-{name}.db"
    server = await Server(db, work / f"b8-{name}.log", script=flood_server).start()
    channels = [server.channel() for _ in range(CHANNELS)]
    stubs = [server.stub(c) for c in channels]
    raw = grpc.aio.insecure_channel(f"127.0.0.1:{server.raw_port}") if collect_every else None
    collected: list[int] = []
    tracked: list[int] = []

    async def collect() -> None:
        assert raw is not None
        answer = await raw.unary_unary("/bench.Raw/Collect")(b"")
        n, objects = answer.decode().split()
        collected.append(int(n))
        tracked.append(int(objects))

    parked: list[Parked] = []
    try:
        await warm_up(stubs, mcp_url, warmup, f"{name}-w")
        if raw is not None:
            await collect()
            collected.clear()
        gc.collect()
        await asyncio.sleep(1.0)
        before = rss_parts(server.pid)
        chunk = collect_every or max(1, runs // 10)
        steps = [(0, before["VmRSS"])]
        t0 = time.perf_counter()
        for first in range(0, runs, chunk):
            parked += await park_many(
                stubs, mcp_url, min(chunk, runs - first), name, keep=keep, offset=first
            )
            if raw is not None:
                await collect()
            steps.append((len(parked), rss_parts(server.pid)["VmRSS"]))
        park_s = time.perf_counter() - t0
        await asyncio.sleep(1.0)
        after = rss_parts(server.pid)
        gc.collect()
        timed = [
            await approve_and_follow(stubs[i % len(stubs)], run)
            for i, run in enumerate(parked[:resumes])
        ]
    finally:
        server.kill()
        for run in parked:
            if run.stream is not None:
                run.stream.call.cancel()
        await asyncio.gather(
            *(run.stream.task for run in parked if run.stream is not None),
            return_exceptions=True,
        )
        for c in channels:
            await c.close()
        if raw is not None:
            await raw.close()
        await server.wait()
    half_n, half_rss = steps[len(steps) // 2]
    out: dict[str, Any] = {
        "kb_per_run": (after["VmRSS"] - before["VmRSS"]) / 1024 / runs,
        "kb_per_run_second_half": (after["VmRSS"] - half_rss) / 1024 / (runs - half_n),
        "parts_kb_per_run": {k: (after[k] - before[k]) / 1024 / runs for k in before},
        "rss_mb_by_runs": [(n, round(rss / 2**20, 2)) for n, rss in steps],
        "rss_before_mb": before["VmRSS"] / 2**20,
        "park_all_s": park_s,
        "resumes": timed,
    }
    if collected:
        out["garbage_objects_per_run"] = sum(collected) / runs
        out["tracked_objects_per_run"] = (tracked[-1] - tracked[0]) / runs
    return out


def resume_figures(resumes: list[dict[str, Any]]) -> dict[str, Any]:
    """One repetition's resumes: p50 / p99 (ms), and what the stream got after the decision."""
    first = [r["first_event_ms"] for r in resumes]
    final = [r["final_ms"] for r in resumes]
    answer = [r["answer_ms"] for r in resumes]
    return {
        "first_p50": percentile(first, 50),
        "first_p99": percentile(first, 99),
        "answer_p50": percentile(answer, 50),
        "answer_p99": percentile(answer, 99),
        "final_p50": percentile(final, 50),
        "final_p99": percentile(final, 99),
        "first_kinds": dict(Counter(r["first_kind"] for r in resumes)),
        "sequences": dict(Counter(" ".join(r["after"]) for r in resumes)),
    }
