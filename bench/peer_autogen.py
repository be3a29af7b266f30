"""B7 peer: the same 4-member count-off turn in AutoGen's RoundRobinGroupChat, in process.

Runs in bench/.venv-peer (autogen-agentchat + autogen-ext, made by bench/run.sh), never in
the product's venv. Four AssistantAgents, each with a ReplayChatCompletionClient that
answers its number ("1!" .. "4!"), MaxMessageTermination(5) (the task + 4 replies),
team.reset() (and each replay client's reset()) between turns. Not durable, no network.

Figures: milliseconds per turn, min / median / max over repetitions after a warm-up (a
repetition is the mean of a batch of sequential turns), with streaming off (the headline,
like Roundtable's count-off replies of one token) and on (model_client_stream=True).

Usage: bench/.venv-peer/bin/python bench/peer_autogen.py [--quick] [--out FILE]
       bench/.venv-peer/bin/python bench/peer_autogen.py --serve

`--serve` is how B1 measures the judged B7 figure: the suite keeps this process up and
interleaves its batches with Roundtable's (`benchlib.BatchProcess`), so both sides of the
ratio meet the same moment of this noisy machine. It reads a number N per line on stdin,
runs N sequential turns (streaming off) and answers the mean milliseconds per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.replay import ReplayChatCompletionClient

NAMES = ("Alice", "Bob", "Carol", "Dave")
TASK = "大家报数！"


def build_team(stream: bool) -> tuple[RoundRobinGroupChat, list[ReplayChatCompletionClient]]:
    clients = [ReplayChatCompletionClient([f"{i + 1}!"]) for i in range(len(NAMES))]
    agents = [
        AssistantAgent(
            name,
            model_client=client,
            system_message=f"You are {name}. {name} speaks plainly and briefly.",
            model_client_stream=stream,
        )
        for name, client in zip(NAMES, clients, strict=True)
    ]
    team = RoundRobinGroupChat(agents, termination_condition=MaxMessageTermination(len(NAMES) + 1))
    return team, clients


async def one_turn(
    team: RoundRobinGroupChat, clients: list[ReplayChatCompletionClient]
) -> list[str]:
    result = await team.run(task=TASK)
    await team.reset()
    for client in clients:
        client.reset()
    replies = [
        m.content for m in result.messages[1:] if isinstance(getattr(m, "content", None), str)
    ]
    return replies


def summary(values: list[float], unit: str) -> dict[str, object]:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "n": len(values),
        "unit": unit,
        "samples": [round(v, 6) for v in values],
    }


async def measure(stream: bool, warmup: int, reps: int, turns: int) -> dict[str, object]:
    team, clients = build_team(stream)
    replies = await one_turn(team, clients)
    if replies != [f"{i + 1}!" for i in range(len(NAMES))]:
        raise RuntimeError(f"unexpected count-off: {replies}")
    for _ in range(warmup):
        await one_turn(team, clients)
    samples = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(turns):
            await one_turn(team, clients)
        samples.append((time.perf_counter() - t0) * 1000 / turns)
    return summary(samples, "ms/turn")


async def serve() -> int:
    """Batches on command: a line "N" on stdin runs N turns and prints ms per turn."""
    team, clients = build_team(False)
    replies = await one_turn(team, clients)
    if replies != [f"{i + 1}!" for i in range(len(NAMES))]:
        print(f"error: unexpected count-off: {replies}", flush=True)
        return 1
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        turns = int(line)
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(turns):
            await one_turn(team, clients)
        print(f"{(time.perf_counter() - t0) * 1000 / max(1, turns):.6f}", flush=True)
    return 0


async def main() -> int:
    parser = argparse.ArgumentParser(description="B7: AutoGen RoundRobinGroupChat count-off")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="")
    parser.add_argument("--serve", action="store_true", help="batches on command (stdin)")
    args = parser.parse_args()
    if args.serve:
        return await serve()
    warmup, reps, turns = (3, 3, 5) if args.quick else (10, 5, 20)
    t0 = time.perf_counter()
    result = {
        "mode": "quick" if args.quick else "full",
        "versions": {
            name: metadata.version(name)
            for name in ("autogen-agentchat", "autogen-ext", "autogen-core")
        },
        "python": sys.version.split()[0],
        "figures": {
            "autogen_turn_ms": await measure(False, warmup, reps, turns),
            "autogen_turn_streaming_ms": await measure(True, warmup, reps, turns),
        },
        "config": {"warmup": warmup, "reps": reps, "turns_per_rep": turns},
        "notes": (
            "RoundRobinGroupChat of 4 AssistantAgents with ReplayChatCompletionClient "
            "(replies '1!'..'4!'), MaxMessageTermination(5), team.reset() and client.reset() "
            "between turns; in process, not durable. streaming: model_client_stream=True."
        ),
    }
    result["seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
