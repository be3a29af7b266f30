"""Where a group turn's time goes: a profile of 4-member count-off turns, grouped by area.

Two modes (the main venv; cProfile from the standard library, pyinstrument when it is
importable and --pyinstrument is given):

  .venv/bin/python bench/profile_turn.py server [--turns 300] [--history 10] [--store DSN]
      a real server process on loopback (running_server, via bench/flood_server.py), driven
      over gRPC, profiled with cProfile from after the warm-up to the last turn: the
      server's own cost per turn, nothing of the client, nothing of start-up.
  .venv/bin/python bench/profile_turn.py inproc [--turns 300] [--pyinstrument]
      the server's wiring (running_server) driven in process through its RunManager.

Prints own time (tottime) per area (langgraph, langchain_core, roundtable.<package>,
aiosqlite, grpc, asyncio, ...) in ms per turn, and the top functions. The areas add up
to the CPU time of the process's main thread (aiosqlite's thread and gRPC's threads run
outside the profile).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import signal
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import COUNT_OFF, Server, turn_request, with_run_id


def area(filename: str, funcname: str) -> str:
    f = filename.replace("\\", "/")
    if "/roundtable/" in f:
        rest = f.split("/roundtable/", 1)[1]
        return "roundtable." + (rest.split("/", 1)[0].removesuffix(".py"))
    for name in (
        "langgraph/checkpoint/sqlite",
        "langgraph/checkpoint",
        "langgraph",
        "langchain_core",
        "pydantic",
        "aiosqlite",
        "grpc",
        "google/protobuf",
        "asyncio",
        "logging",
        "json",
        "concurrent",
        "threading",
        "ormsgpack",
        "uuid",
    ):
        if f"/{name}/" in f or f.endswith(f"/{name}.py"):
            return name.replace("/", ".")
    if f == "~":  # C functions
        if "sqlite3" in funcname:
            return "sqlite3 (C)"
        if "method 'acquire'" in funcname or "select" in funcname or "epoll" in funcname:
            return "waiting (lock/select)"
        return "builtins (C)"
    return Path(f).name


def report(stats: pstats.Stats, turns: int, top: int) -> str:
    out = io.StringIO()
    by_area: dict[str, float] = defaultdict(float)
    rows = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        name = area(filename, func)
        by_area[name] += tt
        rows.append((tt, ct, nc, name, f"{Path(filename).name}:{line}:{func}"))
    total = sum(by_area.values())
    waiting = by_area.get("waiting (lock/select)", 0.0)
    print(
        f"turns: {turns}; profiled time {total * 1000 / turns:.2f} ms/turn, of which "
        f"{waiting * 1000 / turns:.2f} ms waiting in select/locks",
        file=out,
    )
    print("\nown time by area (ms/turn, % of non-waiting):", file=out)
    busy = max(total - waiting, 1e-9)
    for name, tt in sorted(by_area.items(), key=lambda kv: -kv[1]):
        if name == "waiting (lock/select)" or tt * 1000 / turns < 0.01:
            continue
        print(f"  {tt * 1000 / turns:8.3f}  {100 * tt / busy:5.1f}%  {name}", file=out)
    print(
        f"\ntop {top} functions by own time (ms/turn own, ms/turn cumulative, calls/turn):",
        file=out,
    )
    for tt, ct, nc, name, where in sorted(rows, reverse=True)[:top]:
        print(
            f"  {tt * 1000 / turns:8.3f} {ct * 1000 / turns:8.3f} {nc / turns:8.1f}  [{name}] {where}",
            file=out,
        )
    return out.getvalue()


async def drive(stub, n: int, history: int = 10) -> None:
    template = turn_request(COUNT_OFF, run_id="template", history_messages=history)
    batch = uuid.uuid4().hex[:8]  # new runs every call (a run id seen before is a replay)
    for i in range(n):
        async for _ in stub.StartRun(with_run_id(template, f"prof-{batch}-{i}")):
            pass


async def server_mode(turns: int, top: int, history: int = 10, store: str = "") -> str:
    work = Path(tempfile.mkdtemp(prefix="rt-prof-"))
    prof = work / "server.prof"
    # The profiled server: running_server() as `roundtable serve` builds it (bench/flood_server.py),
    # with cProfile switched on by SIGUSR1 after the warm-up and off by SIGUSR2.
    server = await Server(
        work / "p.db",
        work / "p.log",
        script=Path(__file__).resolve().parent / "flood_server.py",
        env={"BENCH_PROFILE": str(prof)},
        store=store,
    ).start()
    try:
        async with server.channel() as channel:
            stub = server.stub(channel)
            await drive(stub, 30, history)  # warm-up, outside the profile
            assert server.proc is not None
            server.proc.send_signal(signal.SIGUSR1)
            await asyncio.sleep(0.2)
            t0 = time.perf_counter()
            await drive(stub, turns, history)
            wall = time.perf_counter() - t0
            server.proc.send_signal(signal.SIGUSR2)
            for _ in range(100):
                if prof.exists():
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.3)
    finally:
        await server.stop()
    return f"server mode: {wall * 1000 / turns:.2f} ms/turn wall (client included)\n" + report(
        pstats.Stats(str(prof)), turns, top
    )


async def inproc_mode(turns: int, top: int, use_pyinstrument: bool) -> str:
    import contextlib

    from suite import InProcess  # the same wiring as B1 (ii)

    work = Path(tempfile.mkdtemp(prefix="rt-prof-"))
    template = turn_request(COUNT_OFF, run_id="template")
    async with contextlib.AsyncExitStack() as stack:
        proc = await InProcess.open(stack, work / "p.db")
        for i in range(20):
            await proc.turn(with_run_id(template, f"w-{i}"))
        if use_pyinstrument:
            from pyinstrument import Profiler

            profiler = Profiler(async_mode="enabled")
            profiler.start()
            for i in range(turns):
                await proc.turn(with_run_id(template, f"p-{i}"))
            profiler.stop()
            return profiler.output_text(unicode=False, color=False, show_all=False)
        pr = cProfile.Profile()
        t0 = time.perf_counter()
        pr.enable()
        for i in range(turns):
            await proc.turn(with_run_id(template, f"p-{i}"))
        pr.disable()
        wall = time.perf_counter() - t0
    return f"inproc mode: {wall * 1000 / turns:.2f} ms/turn wall under the profiler\n" + report(
        pstats.Stats(pr), turns, top
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["server", "inproc"])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--pyinstrument", action="store_true")
    parser.add_argument(
        "--history", type=int, default=10, help="history messages per turn (server mode)"
    )
    parser.add_argument(
        "--store", default="", help="the server's store, e.g. a Postgres DSN (server mode)"
    )
    args = parser.parse_args()
    if args.mode == "server":
        text = asyncio.run(server_mode(args.turns, args.top, args.history, args.store))
    else:
        text = asyncio.run(inproc_mode(args.turns, args.top, args.pyinstrument))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
