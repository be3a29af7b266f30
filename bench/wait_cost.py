"""What waiting costs the code that runs after it, on this host.

The in-process durable turn (B1 ii: `suite.InProcess`, the server's own wiring) is run in
batches, its eleven events consumed three ways: at once (the turn never waits, as the
in-process figures never do), or after each event waiting for another thread to answer,
0 or 200 µs later (as a served turn waits for gRPC's poller thread after each message).
The loop thread's own CPU per turn is printed for each: a wait that costs nothing shows
the same CPU in all three; where the host halts an idle CPU and wakes it through the
hypervisor, the code after each wait runs on a colder CPU and the turn costs more.

  .venv/bin/python bench/wait_cost.py [--turns 500] [--rounds 4]

Prints min/median/max over the rounds (batches interleaved) and the host's idle settings
(`benchlib.cpu_idle_info`). A diagnostic for bench/README.md ("Served and in process"),
not a goal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import queue
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import COUNT_OFF, cpu_idle_info, turn_request, with_run_id
from suite import InProcess

WAITS = {"never waits": None, "waits 0 µs": 0.0, "waits 200 µs": 200e-6}
"""Each way of consuming a turn's events: no wait, or a wait per event for an answer
another thread sends this long after it is asked."""


class Answerer:
    """A thread that answers each request after its delay (spinning, so that the answer's
    time is the delay's, not the thread's own wake-up)."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue[
            tuple[asyncio.AbstractEventLoop, asyncio.Future[None], float]
        ]
        self.requests = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True, name="answerer").start()

    def _serve(self) -> None:
        while True:
            loop, future, delay = self.requests.get()
            end = time.perf_counter() + delay
            while time.perf_counter() < end:
                pass
            loop.call_soon_threadsafe(future.set_result, None)

    async def ask(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self.requests.put((loop, future, delay))
        await future


def thread_cpu_s() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


async def measure(turns: int, rounds: int) -> dict[str, list[float]]:
    answerer = Answerer()
    template = turn_request(COUNT_OFF, run_id="template")
    work = Path(tempfile.mkdtemp(prefix="rt-wait-"))
    cpu: dict[str, list[float]] = {name: [] for name in WAITS}
    async with contextlib.AsyncExitStack() as stack:
        proc = await InProcess.open(stack, work / "wait.db")

        async def turn(delay: float | None) -> None:
            request = proc._convert(
                with_run_id(template, uuid.uuid4().hex), limits=proc._limits, defaults=proc._budgets
            )
            async for _ in await proc.manager.start(request, {}):
                if delay is not None:
                    await answerer.ask(delay)

        for _ in range(50):  # warm-up
            await turn(None)
        for _ in range(rounds):
            for name, delay in WAITS.items():
                started = thread_cpu_s()
                for _ in range(turns):
                    await turn(delay)
                cpu[name].append((thread_cpu_s() - started) * 1000 / turns)
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    cpu = asyncio.run(measure(args.turns, args.rounds))
    print(f"host: {cpu_idle_info()}")
    print("loop thread CPU per turn (ms), min / median / max over rounds:")
    for name, values in cpu.items():
        print(
            f"  {name:13} {min(values):6.2f} / {statistics.median(values):6.2f} / "
            f"{max(values):6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
