"""Roundtable's benchmark suite: figures B1-B6, B8 and B9 of issues 7, 20 and 21 (B7, the AutoGen peer,
runs in its own venv: bench/peer_autogen.py). Run with the main venv: `.venv/bin/python bench/suite.py`.

Every figure is min / median / max over repetitions taken after a warm-up; a repetition of a
per-turn figure is the mean of a batch of sequential turns. Figures that are compared with
each other (B1's variants, B5's configurations) are measured interleaved, repetition by
repetition, so that the machine's noise hits them alike. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    BENCH,
    COUNT_OFF,
    GoClient,
    Server,
    autogen_peer,
    kind_of,
    machine_info,
    model_ref,
    offline_ref,
    percentile,
    stamp_age_ms,
    summary,
    turn_request,
    with_run_id,
    write_replay,
)

log = logging.getLogger("bench")

warnings.filterwarnings("ignore", message="`durability` has no effect")


@dataclass(frozen=True)
class Config:
    """How much of everything to do (quick: CI smoke; full: the figures)."""

    quick: bool
    warmup: int  # turns before measuring
    reps: int  # repetitions per figure (>= 5 in full mode)
    turns: int  # sequential turns per repetition
    b2_tokens: int
    b2_raw_messages: int
    b2_paced_tokens: int
    b2_paced_delay_ms: float
    b3_rates: tuple[float, ...]
    b3_step_s: float
    b3_bisect: bool
    b4_runs: int
    b4_reps: int
    b5_reps: int
    b5_turns: int
    b6_reps: int
    b8_runs: int
    b8_reps: int
    b8_resumes: int
    b8_tool_calls: int
    b8_tool_rounds: int


FULL = Config(
    quick=False,
    warmup=10,
    reps=5,
    turns=20,
    # Within the largest token budget a request may give (RequestLimits.max_output_tokens,
    # 32,768): the provider ends a reply there, so 100,000 asked for came back 32,768.
    b2_tokens=32_000,
    b2_raw_messages=30_000,
    b2_paced_tokens=2_000,
    b2_paced_delay_ms=2.0,
    b3_rates=(2, 4, 8, 16, 32, 64, 128, 256),
    b3_step_s=20.0,
    b3_bisect=True,
    b4_runs=1_000,
    b4_reps=5,
    b5_reps=5,
    b5_turns=20,
    b6_reps=5,
    b8_runs=1_000,
    b8_reps=3,
    b8_resumes=200,
    b8_tool_calls=300,
    b8_tool_rounds=5,
)

QUICK = Config(
    quick=True,
    warmup=3,
    reps=3,
    turns=5,
    b2_tokens=10_000,
    b2_raw_messages=10_000,
    b2_paced_tokens=500,
    b2_paced_delay_ms=2.0,
    b3_rates=(4, 16),
    b3_step_s=4.0,
    b3_bisect=False,
    b4_runs=300,
    b4_reps=1,
    b5_reps=3,
    b5_turns=3,
    b6_reps=1,
    b8_runs=200,
    b8_reps=1,
    b8_resumes=30,
    b8_tool_calls=100,
    b8_tool_rounds=3,
)


# -- helpers ------------------------------------------------------------------------------

_ids = iter(range(1, 10**9))


_RUN = os.urandom(4).hex()
"""Unique to this bench process: a store that outlives it (Postgres) never sees a run id
again, which would replay the old run from its log instead of running a turn."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{_RUN}-{next(_ids)}"


async def drain_stream(call: Any) -> list[Any]:
    """Every event of a StartRun stream."""
    return [response.event async for response in call]


async def grpc_turn(stub: Any, request: Any) -> list[Any]:
    events = await drain_stream(stub.StartRun(request))
    if not events or kind_of(events[-1]) != "run_completed":
        raise RuntimeError(f"turn did not complete: {[kind_of(e) for e in events][-3:]}")
    return events


async def batch_ms(turn: Callable[[], Awaitable[Any]], n: int) -> float:
    """Mean milliseconds per turn over n sequential turns."""
    t0 = time.perf_counter()
    for _ in range(n):
        await turn()
    return (time.perf_counter() - t0) * 1000 / n


async def interleaved(
    variants: dict[str, Callable[[], Awaitable[Any]]],
    cfg: Config,
    turns: int,
    reps: int,
    batches: dict[str, Callable[[int], Awaitable[float]]] | None = None,
) -> dict[str, list[float]]:
    """Warm-up, then `reps` rounds of one batch per variant (so noise hits all alike).

    `variants` run one turn per call; `batches` run n turns per call and return the mean
    ms per turn themselves (a client in another process: bench/goclient).
    """
    for turn in variants.values():
        for _ in range(cfg.warmup):
            await turn()
    for run_batch in (batches or {}).values():
        await run_batch(cfg.warmup)
    out: dict[str, list[float]] = {name: [] for name in [*variants, *(batches or {})]}
    for _ in range(reps):
        for name, turn in variants.items():
            gc.collect()
            out[name].append(await batch_ms(turn, turns))
        for name, run_batch in (batches or {}).items():
            gc.collect()
            out[name].append(await run_batch(turns))
    return out


# -- B1: overhead -------------------------------------------------------------------------


class MemoryRunStore:
    """A RunStore in dicts: no durability at all (B1's floor). Leases always succeed."""

    checkpointer = None
    shared = False

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], Any] = {}
        self.events: dict[tuple[str, str], list[Any]] = {}
        self.unknown: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        # A store method added to the protocol after this was written: a no-op, noted.
        if name.startswith("_"):
            raise AttributeError(name)
        self.unknown.add(name)

        async def noop(*_args: Any, **_kwargs: Any) -> None:
            return None

        return noop

    async def create_run(self, record: Any) -> bool:
        key = (record.tenant, record.run_id)
        if key in self.runs:
            return False
        self.runs[key] = dataclasses.replace(record)
        return True

    async def get_run(self, tenant: str, run_id: str) -> Any:
        record = self.runs.get((tenant, run_id))
        return dataclasses.replace(record) if record else None

    async def update_run(self, record: Any) -> None:
        self.runs[(record.tenant, record.run_id)] = dataclasses.replace(record)

    async def append_event(
        self, tenant: str, run_id: str, event: Any, *, owner: str | None = None
    ) -> None:
        self.events.setdefault((tenant, run_id), []).append(event)

    async def read_events(self, tenant: str, run_id: str, after_seq: int) -> list[Any]:
        return [e for e in self.events.get((tenant, run_id), []) if e.seq > after_seq]

    async def resumable_runs(self, tenant: str, thread_id: str, **_: Any) -> list[Any]:
        return []

    async def mark_interrupted(self) -> int:
        return 0

    async def acquire_lease(self, *_args: Any) -> bool:
        return True

    async def renew_lease(self, *_args: Any) -> bool:
        return True

    async def finish_run(self, record: Any, _owner: str) -> bool:
        self.runs[(record.tenant, record.run_id)] = dataclasses.replace(record)
        return True

    async def end_run(self, record: Any, _holder: str, event: Any) -> None:
        self.events.setdefault((record.tenant, record.run_id), []).append(event)
        self.runs[(record.tenant, record.run_id)] = dataclasses.replace(record, last_seq=event.seq)

    async def request_cancel(self, *_args: Any) -> bool:
        return False  # one process, no replica to tell

    async def close(self) -> None:
        pass


class InProcess:
    """The server's own wiring (`running_server`), driven in process through its RunManager.

    Variants swap one part of the running server: the graph (compiled without a
    checkpointer), the store (a dict), the durability setting or the SQLite `synchronous`
    pragma; everything else is what `roundtable serve` builds.
    """

    def __init__(self, running: Any) -> None:
        from roundtable.api.convert import run_request_from_proto
        from roundtable.settings import Settings

        self.running = running
        self.manager = running.manager
        self._convert = run_request_from_proto
        defaults = Settings()
        self._limits = defaults.request_limits
        self._budgets = defaults.budgets

    @classmethod
    async def open(
        cls,
        stack: contextlib.AsyncExitStack,
        db: Path,
        *,
        memory_store: bool = False,
        checkpoint: bool = True,
        durability: str = "",
        synchronous: str = "",
    ) -> InProcess:
        from roundtable.graph.builder import build_conversation_graph
        from roundtable.server import running_server
        from roundtable.settings import Settings

        overrides: dict[str, Any] = {"checkpoint_durability": durability} if durability else {}
        settings = Settings().with_values(
            listen="127.0.0.1:0", store=f"sqlite:///{db}", **overrides
        )
        running = await stack.enter_async_context(running_server(settings))
        if synchronous:
            # Both connections: the event log's (sqlite3) and the checkpointer's (aiosqlite).
            running.store.conn.execute(f"PRAGMA synchronous={synchronous}")
            await running.store.checkpointer.conn.execute(f"PRAGMA synchronous={synchronous}")
        if not checkpoint:
            running.manager.executor.graph = build_conversation_graph(None)
        if memory_store:
            running.manager.log.store = MemoryRunStore()
        return cls(running)

    async def turn(self, request: Any) -> list[Any]:
        run_request = self._convert(request, limits=self._limits, defaults=self._budgets)
        subscription = await self.manager.start(run_request, {})
        events = [e async for e in subscription]
        if not events or kind_of(events[-1]) != "run_completed":
            raise RuntimeError(f"turn did not complete: {[kind_of(e) for e in events][-3:]}")
        return events

    async def checkpoint_rows(self) -> dict[str, int]:
        store = self.manager.log.store
        if isinstance(store, MemoryRunStore) or not hasattr(store, "conn"):
            return {}
        conn = store.conn  # the event log's sqlite3 connection; it sees the saver's tables too
        return {
            table: int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("checkpoints", "writes", "rt_events")
        }


async def _per_op_us(op: Callable[[], Awaitable[Any]], n: int, reps: int) -> list[float]:
    for _ in range(max(10, n // 10)):
        await op()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            await op()
        out.append((time.perf_counter() - t0) * 1e6 / n)
    return out


async def b1_components(cfg: Config, work: Path) -> dict[str, Any]:
    """What the parts of a turn cost on their own (microseconds per operation).

    Measured on a running_server()'s own harness, store and checkpointer, so the numbers
    are those of the code under test. Each component is independent: one that no longer
    fits the product's API is reported as an error and the others still run.
    """
    import sqlite3

    import aiosqlite
    from roundtable.server import running_server
    from roundtable.settings import Settings

    n = 100 if cfg.quick else 400
    reps = cfg.reps
    figures: dict[str, Any] = {}
    errors: dict[str, str] = {}

    async def component(
        name: str, build: Callable[[], Awaitable[Callable[[], Awaitable[Any]]]], ops: int = n
    ) -> None:
        try:
            op = await build()
            figures[name] = summary(await _per_op_us(op, ops, reps), "us/op")
        except Exception as exc:  # the product moved: say so, keep going
            errors[name] = f"{type(exc).__name__}: {exc}"

    settings = Settings(listen="127.0.0.1:0", store=f"sqlite:///{work / 'b1-components.db'}")
    async with running_server(settings) as running:
        from roundtable.domain import prompt_sections as sections
        from roundtable.domain.snapshot import OFFLINE_MODEL
        from roundtable.graph.countoff import count_off_task
        from roundtable.harness.request import CallMeta, ModelRequest
        from roundtable.models.base import ChatCall, ChatMessage

        messages = (
            ChatMessage(
                "system", "You are Alice.\n\n## Persona\nAlice speaks plainly and briefly."
            ),
            ChatMessage("user", f"{COUNT_OFF}\n\n{sections.TASK}\n{count_off_task(1, 4)}"),
        )
        call = ChatCall(messages=messages, max_tokens=32)
        request = ModelRequest(
            ref=OFFLINE_MODEL,
            call=call,
            meta=CallMeta(
                thread_id="t", run_id="r", request_id="q", tenant="bench", caller_node="dispatch"
            ),
            on_text=lambda _text: None,
        )

        async def harness_call():
            return lambda: running.harness.call(request)

        async def provider_complete():
            provider = running.harness.providers["offline"]
            return lambda: provider.complete(
                OFFLINE_MODEL.target, call, api_key=None, on_text=lambda _text: None
            )

        def offline_stream(own: bool) -> Callable[[], Awaitable[Callable[[], Awaitable[None]]]]:
            """LangChain's `astream` of the offline model, or (own) the model's `_astream`."""

            async def build() -> Callable[[], Awaitable[None]]:
                from roundtable.models.langchain_provider import to_langchain
                from roundtable.models.offline import offline_factory

                model = offline_factory()(OFFLINE_MODEL.target, None)
                lc_messages = to_langchain(messages)
                stream = model._astream if own else model.astream

                async def op() -> None:
                    async for _ in stream(lc_messages, max_tokens=32):
                        pass

                return op

            return build

        async def audit_record():
            from roundtable.harness.audit import AuditRecord

            started = time.perf_counter()

            async def op() -> None:
                running.harness.auditor.record(AuditRecord.of(request, "success", started))

            return op

        async def store_append_event():
            from roundtable.store.base import StoredEvent

            seq = iter(range(1, 10**9))
            body = b"x" * 200
            return lambda: running.store.append_event(
                "bench", "components", StoredEvent(next(seq), "x", body)
            )

        async def aiosqlite_insert():
            conn = await aiosqlite.connect(str(work / "b1-aiosqlite.db"), isolation_level=None)
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=NORMAL")
            await conn.execute("CREATE TABLE IF NOT EXISTS e (k INTEGER PRIMARY KEY, b BLOB)")
            seq = iter(range(1, 10**9))
            body = b"x" * 200

            async def op() -> None:
                await conn.execute("INSERT INTO e (k, b) VALUES (?, ?)", (next(seq), body))

            return op

        async def sqlite3_insert_on_loop():
            conn = sqlite3.connect(str(work / "b1-sqlite3.db"), isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("CREATE TABLE IF NOT EXISTS e (k INTEGER PRIMARY KEY, b BLOB)")
            seq = iter(range(1, 10**9))
            body = b"x" * 200

            async def op() -> None:
                conn.execute("INSERT INTO e (k, b) VALUES (?, ?)", (next(seq), body))

            return op

        def chain_graph(checkpointer: Any) -> Any:
            from typing import TypedDict

            from langgraph.graph import END, START, StateGraph

            class S(TypedDict, total=False):
                n: int

            async def node(state: S) -> S:
                return {"n": state.get("n", 0) + 1}

            graph = StateGraph(S)
            prev = START
            for k in range(8):
                graph.add_node(f"n{k}", node)
                graph.add_edge(prev, f"n{k}")
                prev = f"n{k}"
            graph.add_edge(prev, END)
            return graph.compile(checkpointer=checkpointer)

        threads = iter(range(1, 10**9))

        def superstep(checkpoint: bool, durability: str):
            async def build():
                graph = chain_graph(running.store.checkpointer if checkpoint else None)

                async def op() -> None:
                    config = {"configurable": {"thread_id": f"chain-{next(threads)}"}}
                    if checkpoint:
                        await graph.ainvoke({"n": 0}, config, durability=durability)
                    else:
                        await graph.ainvoke({"n": 0})

                return op

            return build

        await component("model_call_through_harness", harness_call)
        await component("provider_complete", provider_complete)
        await component("langchain_astream_offline", offline_stream(own=False))
        await component("offline_model_own_astream", offline_stream(own=True))
        await component("audit_record", audit_record, n * 4)
        await component("store_append_event", store_append_event, n * 4)
        await component("aiosqlite_insert", aiosqlite_insert, n * 4)
        await component("sqlite3_insert_on_loop_thread", sqlite3_insert_on_loop, n * 4)
        chain_ops = max(20, n // 4)
        await component("langgraph_8_node_chain_no_checkpointer", superstep(False, ""), chain_ops)
        await component("langgraph_8_node_chain_saver_async", superstep(True, "async"), chain_ops)
        await component("langgraph_8_node_chain_saver_exit", superstep(True, "exit"), chain_ops)
    for name in list(figures):
        if name.startswith("langgraph_8_node_chain"):
            per_step = {
                k: (v / 8 if isinstance(v, float) else v)
                for k, v in figures[name].items()
                if k != "samples"
            }
            per_step["unit"] = "us/super-step"
            figures[name.replace("8_node_chain", "per_superstep")] = per_step
    return {"figures": figures, "errors": errors}


async def bench_b1(cfg: Config, work: Path) -> dict[str, Any]:
    """B1: a 4-member count-off, zero-latency offline model: floor, durable, end to end."""
    import grpc
    from roundtable.settings import Settings
    from roundtable.v1 import orchestrator_service_pb2 as pb

    durability = Settings().checkpoint_durability
    template = turn_request(COUNT_OFF, run_id="template")
    specs: dict[str, dict[str, Any]] = {
        "i_floor": dict(memory_store=True, checkpoint=False),
        "i_eventlog_only": dict(checkpoint=False),
        "ii_durable": {},
        "ii_durable_sync_full": dict(synchronous="FULL"),
        "ii_durable_async": dict(durability="async"),
    }
    served = ["iii_grpc", "iii_grpc_async", "iii_grpc_postgres", "iii_grpc_go", "grpc_floor"]
    turns_done = {name: 0 for name in [*specs, *served]}
    go_left_out = ""
    peer_left_out = ""
    cpu_used = {name: 0.0 for name in served}
    client_cpu = {name: 0.0 for name in served if name != "iii_grpc_go"}  # Go times itself
    # With a Postgres DSN (bench/run.sh passes the tests' one when set), the same turn
    # against a replica on Postgres: the store several replicas share (thread lock, lease).
    postgres_dsn = os.environ.get("BENCH_POSTGRES_DSN", "")
    postgres_left_out = "" if postgres_dsn else "no BENCH_POSTGRES_DSN"
    server_pg: Server | None = None
    async with contextlib.AsyncExitStack() as stack:

        async def serve(name: str, *args: str, store: str = "") -> Server:
            srv = Server(work / f"{name}.db", work / f"{name}.log", *args, store=store)
            stack.push_async_callback(srv.stop)
            return await srv.start()

        server = await serve("b1-serve")
        server_async = await serve("b1-serve-async", "--checkpoint-durability", "async")
        # The gRPC floor: a real turn's responses, recorded here, replayed by a bare
        # grpc.aio handler (bench/flood_server.py /bench.Raw/Turn) to the same client.
        async with server.channel() as channel:
            recorded = await grpc_turn(
                server.stub(channel), with_run_id(template, new_id("b1-record"))
            )
        write_replay(
            work / "b1-turn.replay",
            [pb.StartRunResponse(event=e).SerializeToString() for e in recorded],
        )
        floor_server = Server(
            work / "b1-floor.db",
            work / "b1-floor.log",
            script=BENCH / "flood_server.py",
            env={"BENCH_TURN_REPLAY": str(work / "b1-turn.replay")},
        )
        stack.push_async_callback(floor_server.stop)
        await floor_server.start()
        if postgres_dsn:
            server_pg = await serve("b1-pg", store=postgres_dsn)
        inproc = {
            name: await InProcess.open(stack, work / f"b1-{name}.db", **spec)
            for name, spec in specs.items()
        }

        def inproc_turn(name: str) -> Callable[[], Awaitable[Any]]:
            async def turn() -> None:
                turns_done[name] += 1
                await inproc[name].turn(with_run_id(template, new_id(name)))

            return turn

        async def grpc_variant(name: str, srv: Server) -> Callable[[], Awaitable[Any]]:
            channel = await stack.enter_async_context(srv.channel())
            stub = srv.stub(channel)

            async def turn() -> None:
                turns_done[name] += 1
                cpu0, client0 = srv.cpu_seconds(), time.process_time()
                await grpc_turn(stub, with_run_id(template, new_id("b1")))
                cpu_used[name] += srv.cpu_seconds() - cpu0
                client_cpu[name] += time.process_time() - client0

            return turn

        async def floor_variant() -> Callable[[], Awaitable[Any]]:
            channel = await stack.enter_async_context(
                grpc.aio.insecure_channel(f"127.0.0.1:{floor_server.raw_port}")
            )
            call = channel.unary_stream(
                "/bench.Raw/Turn",
                request_serializer=pb.StartRunRequest.SerializeToString,
                response_deserializer=pb.StartRunResponse.FromString,
            )

            async def turn() -> None:
                turns_done["grpc_floor"] += 1
                cpu0, client0 = floor_server.cpu_seconds(), time.process_time()
                events = await drain_stream(call(with_run_id(template, new_id("b1-floor"))))
                cpu_used["grpc_floor"] += floor_server.cpu_seconds() - cpu0
                client_cpu["grpc_floor"] += time.process_time() - client0
                if len(events) != len(recorded):
                    raise RuntimeError(f"gRPC floor: {len(events)} of {len(recorded)} messages")

            return turn

        variants = {name: inproc_turn(name) for name in inproc}
        variants["grpc_floor"] = await floor_variant()
        variants["iii_grpc"] = await grpc_variant("iii_grpc", server)
        variants["iii_grpc_async"] = await grpc_variant("iii_grpc_async", server_async)
        if server_pg is not None:
            variants["iii_grpc_postgres"] = await grpc_variant("iii_grpc_postgres", server_pg)
        batches = {}
        go_binary = None
        if not GoClient.available():
            go_left_out = "no `go` on PATH"
        else:
            try:
                go_binary = await GoClient.build(work)
            except RuntimeError as exc:  # e.g. modules not downloadable here
                go_left_out = str(exc)
        if go_binary is not None:
            go = await GoClient.client(
                go_binary, f"127.0.0.1:{server.port}", template, work, "b1go"
            ).start()
            stack.push_async_callback(go.stop)

            async def go_batch(n: int) -> float:
                cpu0 = server.cpu_seconds()
                ms = await go.batch(n)
                cpu_used["iii_grpc_go"] += server.cpu_seconds() - cpu0
                turns_done["iii_grpc_go"] += n
                return ms

            batches["iii_grpc_go"] = go_batch
        # B7's judged figure: AutoGen's turn in batches interleaved with these, so the
        # ratio pairs measurements of the same moment (bench/peer_autogen.py --serve).
        peer = autogen_peer()
        if peer is None:
            peer_left_out = "no bench/.venv-peer (bench/run.sh makes it; --skip-peer)"
        else:
            stack.push_async_callback(peer.stop)
            try:
                await peer.start()
                await peer.batch(1)  # a broken peer venv costs B7, not B1
            except (OSError, RuntimeError, ValueError) as exc:
                peer_left_out = f"the AutoGen peer did not run: {exc}"
            else:
                batches["peer_autogen"] = peer.batch
        samples = await interleaved(variants, cfg, cfg.turns, cfg.reps, batches)
        rows = {name: await inproc[name].checkpoint_rows() for name in inproc}
        unknown = sorted(getattr(inproc["i_floor"].manager.log.store, "unknown", set()))
    figures = {name: summary(v, "ms/turn") for name, v in samples.items()}
    server_cpu_ms = {
        name: round(cpu * 1000 / turns_done[name], 2)
        for name, cpu in cpu_used.items()
        if turns_done[name]
    }
    try:
        components = await b1_components(cfg, work)
    except Exception:
        components = {"figures": {}, "errors": {"all": traceback.format_exc()}}
    per_turn = {
        name: {table: round(n / max(1, turns_done[name]), 2) for table, n in r.items()}
        for name, r in rows.items()
        if r
    }
    return {
        "figures": figures,
        "rows_per_turn": per_turn,
        "server_cpu_ms_per_turn": server_cpu_ms,
        "client_cpu_ms_per_turn": {
            name: round(cpu * 1000 / turns_done[name], 2)
            for name, cpu in client_cpu.items()
            if turns_done[name]
        },
        "durability": durability,
        "floor_store_noop_methods": unknown,
        "iii_grpc_go_left_out": go_left_out,
        "peer_autogen_left_out": peer_left_out,
        "iii_grpc_postgres_left_out": postgres_left_out,
        "components": components,
        "notes": (
            "Every in-process variant is running_server() (the composition root) driven "
            "through its RunManager, with one part swapped: i_floor: graph compiled with "
            "checkpointer=None and a dict store (no durability at all); i_eventlog_only: "
            "graph without checkpointer, SQLite event log (WAL, NORMAL); ii_durable: as "
            "served (SQLite event log on a sqlite3 connection + AsyncSqliteSaver on an "
            f"aiosqlite one, WAL + synchronous=NORMAL, durability={durability!r}); "
            "ii_durable_sync_full: the same with synchronous=FULL, "
            "LangGraph's AsyncSqliteSaver default; ii_durable_async: durability='async' "
            "(a checkpoint after the plan and after the round too); "
            "iii_grpc: a real `roundtable serve` process on loopback, client in the bench "
            "process; iii_grpc_async: the same with --checkpoint-durability async; "
            "iii_grpc_postgres: the same with --store BENCH_POSTGRES_DSN (the store of "
            "several replicas; left out without one); "
            "grpc_floor: a bare grpc.aio handler (bench/flood_server.py /bench.Raw/Turn, "
            "its own process) that parses the same StartRunRequest and answers the responses "
            "of a count-off recorded from iii_grpc, pre-serialized, to the same Python client: "
            "what gRPC alone costs a turn; "
            "iii_grpc_go: the iii_grpc server driven by a Go gRPC client (bench/goclient, "
            "the language of the product's gateway; left out where `go` is missing); "
            "peer_autogen: B7's AutoGen turn (bench/peer_autogen.py --serve, in its own "
            "venv and process), in batches interleaved with the others. "
            "Proto->domain conversion is inside every in-process turn. server_cpu_ms_per_turn: "
            "utime+stime of the serve process per turn (/proc), 10 ms clock ticks; "
            "client_cpu_ms_per_turn: the bench process's own CPU (the Python gRPC client) per "
            "turn, part of every end-to-end figure."
        ),
    }


# -- B2: streaming ------------------------------------------------------------------------


def _latencies(arrivals: list[tuple[int, str]]) -> list[float]:
    out = []
    for now_us, text in arrivals:
        for stamp in text.split():
            out.append(stamp_age_ms(stamp, now_us))
    return out


async def _rt_stream(
    stub: Any,
    provider: str,
    tokens: int,
    delay_ms: float,
    yield_every: int = 1,
    whole_reads: bool = False,
):
    base_url = f"{provider}:?tokens={tokens}&token_delay_ms={delay_ms:g}&yield_every={yield_every}"
    if whole_reads:
        base_url += "&whole_reads=1"
    request = turn_request(
        "tell me a very long story",
        run_id=new_id("b2"),
        kind="single",
        members=1,
        member_model=model_ref(provider, "flood", base_url, timeout_ms=600_000),
        max_output_tokens=32_768,
    )
    arrivals: list[tuple[int, str]] = []
    t0 = time.perf_counter()
    t_last = t0
    completed = False
    async for response in stub.StartRun(request):
        event = response.event
        kind = kind_of(event)
        if kind == "assistant_delta":
            arrivals.append((time.monotonic_ns() // 1000, event.assistant_delta.text))
            t_last = time.perf_counter()
        elif kind == "assistant_final":
            # Text still buffered when the reply ended comes in the final, not in a delta.
            seen = sum(len(text.split()) for _, text in arrivals)
            tail = event.assistant_final.content.split()[seen:]
            if tail:
                arrivals.append((time.monotonic_ns() // 1000, " ".join(tail)))
                t_last = time.perf_counter()
        elif kind == "run_completed":
            completed = True
    lat = _latencies(arrivals)
    if not completed or len(lat) != tokens:
        raise RuntimeError(
            f"{provider}: received {len(lat)} of {tokens} tokens, completed={completed}"
        )
    return {
        "tokens_per_s": tokens / (t_last - t0),
        "messages": len(arrivals),
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat),
    }


async def _raw_stream(channel: Any, n: int):
    from roundtable.v1 import orchestrator_service_pb2 as pb

    method = channel.unary_stream(
        "/bench.Raw/Stream", response_deserializer=pb.StartRunResponse.FromString
    )
    arrivals: list[tuple[int, str]] = []
    t0 = time.perf_counter()
    async for response in method(str(n).encode()):
        arrivals.append((time.monotonic_ns() // 1000, response.event.assistant_delta.text))
    elapsed = time.perf_counter() - t0
    if len(arrivals) != n:
        raise RuntimeError(f"raw: {len(arrivals)} of {n}")
    lat = _latencies(arrivals)
    return {"messages_per_s": n / elapsed, "p99_ms": percentile(lat, 99)}


async def _model_alone(channel: Any, kind: str, tokens: int) -> float:
    """A bench model's own rate in the server process, without Roundtable or gRPC."""
    method = channel.unary_unary("/bench.Raw/ModelAlone")
    return float((await method(f"{kind}:{tokens}".encode())).decode())


READ_TOKENS = 64
"""B2's third model: tokens arrive READ_TOKENS at a time, as SSE events do when one network
read holds several of them; each token is still handed to Roundtable on its own."""


async def bench_b2(cfg: Config, work: Path) -> dict[str, Any]:
    """B2: one speaker streaming N tokens vs raw grpc.aio messages/s; token latency."""
    import grpc

    server = await Server(work / "b2.db", work / "b2.log", script=BENCH / "flood_server.py").start()
    runs: dict[str, list[dict[str, float]]] = {
        "raw": [],
        "flood_langchain": [],
        "flood_native": [],
        "flood_native_reads": [],
        "flood_native_whole_reads": [],
        "paced_langchain": [],
        "alone": [],
    }
    try:
        async with (
            server.channel() as channel,
            grpc.aio.insecure_channel(f"127.0.0.1:{server.raw_port}") as raw_channel,
        ):
            stub = server.stub(channel)
            # warm-up
            await _raw_stream(raw_channel, 2_000)
            await _rt_stream(stub, "flood", 2_000, 0)
            await _rt_stream(stub, "floodnative", 2_000, 0)
            for _ in range(cfg.reps):
                gc.collect()
                runs["raw"].append(await _raw_stream(raw_channel, cfg.b2_raw_messages))
                alone = {"langchain": await _model_alone(raw_channel, "langchain", cfg.b2_tokens)}
                runs["flood_langchain"].append(await _rt_stream(stub, "flood", cfg.b2_tokens, 0))
                alone["native"] = await _model_alone(raw_channel, "native", cfg.b2_tokens)
                runs["flood_native"].append(await _rt_stream(stub, "floodnative", cfg.b2_tokens, 0))
                runs["flood_native_reads"].append(
                    await _rt_stream(stub, "floodnative", cfg.b2_tokens, 0, READ_TOKENS)
                )
                runs["flood_native_whole_reads"].append(
                    await _rt_stream(stub, "floodnative", cfg.b2_tokens, 0, READ_TOKENS, True)
                )
                runs["alone"].append(alone)
                runs["paced_langchain"].append(
                    await _rt_stream(stub, "flood", cfg.b2_paced_tokens, cfg.b2_paced_delay_ms)
                )
    finally:
        await server.stop()

    def fig(name: str, key: str, unit: str) -> dict[str, Any]:
        return summary([r[key] for r in runs[name]], unit)

    raw = fig("raw", "messages_per_s", "msgs/s")
    out = {
        "raw_grpc_messages_per_s": raw,
        "raw_grpc_latency_p99_ms": fig("raw", "p99_ms", "ms"),
        "flood_langchain_tokens_per_s": fig("flood_langchain", "tokens_per_s", "tokens/s"),
        "flood_langchain_latency_p99_ms": fig("flood_langchain", "p99_ms", "ms"),
        "flood_langchain_messages": fig("flood_langchain", "messages", "msgs/run"),
        "flood_native_tokens_per_s": fig("flood_native", "tokens_per_s", "tokens/s"),
        "flood_native_latency_p99_ms": fig("flood_native", "p99_ms", "ms"),
        "flood_native_reads_tokens_per_s": fig("flood_native_reads", "tokens_per_s", "tokens/s"),
        "flood_native_reads_latency_p99_ms": fig("flood_native_reads", "p99_ms", "ms"),
        "flood_native_whole_reads_tokens_per_s": fig(
            "flood_native_whole_reads", "tokens_per_s", "tokens/s"
        ),
        "flood_native_whole_reads_latency_p99_ms": fig("flood_native_whole_reads", "p99_ms", "ms"),
        "paced_latency_p50_ms": fig("paced_langchain", "p50_ms", "ms"),
        "paced_latency_p99_ms": fig("paced_langchain", "p99_ms", "ms"),
    }

    def paired(name: str, base: str, key: str) -> dict[str, Any]:
        """tokens/s of each `name` run ÷ `key` of the `base` run measured just before it."""
        pairs = zip(runs[name], runs[base], strict=True)
        return summary([f["tokens_per_s"] / b[key] for f, b in pairs], "x")

    out["model_alone_langchain_tokens_per_s"] = fig("alone", "langchain", "tokens/s")
    out["model_alone_native_tokens_per_s"] = fig("alone", "native", "tokens/s")
    out["streamed_vs_model_alone_langchain"] = paired("flood_langchain", "alone", "langchain")
    out["streamed_vs_model_alone_native"] = paired("flood_native", "alone", "native")
    out["ratio_langchain_vs_raw"] = paired("flood_langchain", "raw", "messages_per_s")
    out["ratio_native_vs_raw"] = paired("flood_native", "raw", "messages_per_s")
    out["ratio_native_reads_vs_raw"] = paired("flood_native_reads", "raw", "messages_per_s")
    out["ratio_native_whole_reads_vs_raw"] = paired(
        "flood_native_whole_reads", "raw", "messages_per_s"
    )
    return {
        "figures": out,
        "tokens": cfg.b2_tokens,
        "raw_messages": cfg.b2_raw_messages,
        "paced": {"tokens": cfg.b2_paced_tokens, "token_delay_ms": cfg.b2_paced_delay_ms},
        "notes": (
            "bench/flood_server.py: the product's running_server() with bench providers. "
            "flood_langchain: a LangChain chat model behind LangChainProvider (the path of "
            "every real model), yielding to the event loop after every token; flood_native: "
            "a ChatProvider calling on_text directly; flood_native_reads: the same with the "
            "model yielding to the loop every 64 tokens (several SSE events in one network "
            "read), on_text still called per token; flood_native_whole_reads: the same model, "
            "the provider handing each read's 64 tokens to on_text at once. Default "
            "coalescing (20 ms, 1,024 bytes); "
            "tokens are 7 bytes (a CLOCK_MONOTONIC stamp), so latency is exact per token. "
            "tokens/s = tokens / (last delta received - StartRun sent). Ratios pair each "
            "repetition with the raw run measured just before it. model_alone_*: the same "
            "bench models consumed in the server process with nothing else (the model's own "
            "ceiling), measured just before the streamed run it is paired with; "
            "streamed_vs_model_alone = streamed tokens/s ÷ model-alone tokens/s (1.0: "
            "Roundtable costs nothing per token)."
        ),
    }


# -- B3: capacity -------------------------------------------------------------------------


async def _open_loop(server: Server, stub: Any, template: Any, rate: float, step_s: float):
    rng = random.Random(int(rate * 1000))
    results: list[dict[str, Any]] = []
    lag: list[float] = []

    async def one(request: Any, offset: float) -> None:
        sent = time.perf_counter()
        first = None
        completed = False
        try:
            async for response in stub.StartRun(request):
                if first is None:
                    first = time.perf_counter()
                if kind_of(response.event) == "run_completed":
                    completed = True
        except Exception as exc:  # a failed stream is a run that did not complete
            log.warning("B3 turn failed: %r", exc)
        results.append(
            {
                "offset": offset,
                "ttfe_ms": (first - sent) * 1000 if first else float("inf"),
                "turn_s": time.perf_counter() - sent,
                "completed": completed,
            }
        )

    cpu0 = server.cpu_seconds()
    start = time.perf_counter()
    at = 0.0
    tasks = []
    while True:
        at += rng.expovariate(rate)
        if at > step_s:
            break
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lag.append(max(0.0, time.perf_counter() - start - at) * 1000)
        tasks.append(asyncio.create_task(one(with_run_id(template, new_id(f"b3-{rate:g}")), at)))
    _done, pending = await asyncio.wait(tasks, timeout=60)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    elapsed = time.perf_counter() - start
    cpu = server.cpu_seconds() - cpu0
    started = len(tasks)
    completed = sum(1 for r in results if r["completed"])
    ttfe = [r["ttfe_ms"] for r in results]
    windows = []
    for w in range(5):
        lo, hi = step_s * w / 5, step_s * (w + 1) / 5
        part = [r["ttfe_ms"] for r in results if lo <= r["offset"] < hi]
        if part:
            windows.append(percentile(part, 99))
    p99 = percentile(ttfe, 99) if ttfe else float("inf")
    return {
        "rate_per_s": rate,
        "started": started,
        "completed": completed,
        "achieved_per_s": started / step_s,
        "ttfe_p50_ms": percentile(ttfe, 50) if ttfe else None,
        "ttfe_p99_ms": p99,
        "ttfe_p99_by_window_ms": summary(windows, "ms"),
        "turn_p50_s": percentile([r["turn_s"] for r in results], 50) if results else None,
        "turn_p99_s": percentile([r["turn_s"] for r in results], 99) if results else None,
        "cpu_s_per_turn": cpu / completed if completed else None,
        "server_cpu_util": cpu / elapsed,
        "client_lag_p99_ms": percentile(lag, 99) if lag else 0.0,
        "passed": started > 0 and completed == started and p99 <= 100.0,
    }


async def _b3_sweep(
    cfg: Config, server: Server, template: Any
) -> tuple[list[dict[str, Any]], list[int]]:
    from roundtable.models.offline import iter_tokens

    steps: list[dict[str, Any]] = []
    async with server.channel() as channel:
        stub = server.stub(channel)
        events = await grpc_turn(stub, with_run_id(template, new_id("b3w")))
        finals = [e.assistant_final for e in events if kind_of(e) == "assistant_final"]
        tokens_each = [len(list(iter_tokens(f.content))) for f in finals]
        for _ in range(cfg.warmup):
            await grpc_turn(stub, with_run_id(template, new_id("b3w")))
        failed_in_a_row = 0
        for rate in cfg.b3_rates:
            step = await _open_loop(server, stub, template, rate, cfg.b3_step_s)
            steps.append(step)
            log.info("B3 rate %s: %s", rate, step)
            failed_in_a_row = 0 if step["passed"] else failed_in_a_row + 1
            if failed_in_a_row == 2:
                break
            await asyncio.sleep(1)
        best = _best(steps)
        above = [s["rate_per_s"] for s in steps if best and s["rate_per_s"] > best["rate_per_s"]]
        if cfg.b3_bisect and best and above:
            mid = round((best["rate_per_s"] + min(above)) / 2)
            if best["rate_per_s"] < mid < min(above):
                await asyncio.sleep(2)
                steps.append(await _open_loop(server, stub, template, mid, cfg.b3_step_s))
    return steps, tokens_each


def _best(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    passed = [s for s in steps if s["passed"]]
    return max(passed, key=lambda s: s["rate_per_s"]) if passed else None


async def bench_b3(cfg: Config, work: Path) -> dict[str, Any]:
    """B3: open-loop Poisson arrivals of 4-speaker turns (200 ms model, 20 tokens each)."""
    template = turn_request(
        "@all what do you think about the garden plan for next week?",
        run_id="template",
        member_model=offline_ref(latency_ms=200),
        max_output_tokens=20,
    )
    server = await Server(work / "b3.db", work / "b3.log").start()
    try:
        steps, tokens_each = await _b3_sweep(cfg, server, template)
    finally:
        await server.stop()
    best = _best(steps)
    return {
        "figures": {
            "max_rate_per_s": best["rate_per_s"] if best else 0,
            "cpu_s_per_turn_at_max": best["cpu_s_per_turn"] if best else None,
            "cpu_s_per_turn_by_rate": summary(
                [s["cpu_s_per_turn"] for s in steps if s["cpu_s_per_turn"]], "cpu s/turn"
            ),
        },
        "steps": steps,
        "tokens_per_speaker": tokens_each,
        "step_s": cfg.b3_step_s,
        "notes": (
            "A real `roundtable serve`; client in the bench process on the same 2 cores, one "
            "channel. Poisson arrivals at each rate for step_s seconds (fixed seed), rising "
            "until two rates in a row fail, then one bisection above the best; a rate "
            "passes when every run completes (run_completed within 60 s after the last "
            "arrival) and time to first event p99 <= 100 ms over the whole step (also shown "
            "per fifth of the step: min/median/max). CPU s/turn = server process utime+stime "
            "over the step / completed turns. Each speaker: offline model, latency_ms=200, "
            "max_output_tokens=20 (an @all turn: a count-off reply has no 20 tokens)."
        ),
    }


# -- B4: memory ---------------------------------------------------------------------------


B4_TARGETS = ("roundtable", "floor_grpc", "floor_grpc_langgraph")
"""What B4 parks: the product's StartRun, then its two floors in a bench server
(bench/flood_server.py): a bare grpc.aio stream (`/bench.Raw/Park`), and the same stream
holding a bare LangGraph run parked in a node (`/bench.Raw/ParkGraph`)."""


async def _b4_rep(cfg: Config, work: Path, rep: int, target: str) -> dict[str, float]:
    """One fresh server; VmRSS growth per stream with `cfg.b4_runs` of them parked."""
    import grpc

    floor = target != "roundtable"
    server = await Server(
        work / f"b4-{target}-{rep}.db",
        work / f"b4-{target}-{rep}.log",
        script=BENCH / "flood_server.py" if floor else None,
    ).start()
    parked_ref = offline_ref(latency_ms=600_000, timeout_ms=600_000)
    template = turn_request(COUNT_OFF, run_id="template", member_model=parked_ref)
    parked = 0
    all_parked = asyncio.Event()
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{server.raw_port}") if floor else server.channel()
        for _ in range(10)
    ]
    if floor:
        method = "/bench.Raw/" + ("ParkGraph" if target == "floor_grpc_langgraph" else "Park")
        calls = [
            c.unary_stream(
                method,
                request_serializer=type(template).SerializeToString,
                response_deserializer=type(stub_response_template()).FromString,
            )
            for c in channels
        ]
    else:
        calls = [server.stub(c).StartRun for c in channels]
    failures: list[str] = []

    async def park(i: int, count: bool = True) -> None:
        nonlocal parked
        seen = False
        request = with_run_id(template, new_id(f"b4-{rep}"))
        # Spread over tenants: the server caps live runs per tenant (max_runs_per_tenant).
        request.context.tenant = f"bench-{i % 20}"
        try:
            async for response in calls[i % len(calls)](request):
                # A floor sends one event once parked; the product parks after speaker 1
                # started.
                if not seen and (floor or kind_of(response.event) == "speaker_started"):
                    seen = True
                    parked += count
                    if parked == cfg.b4_runs:
                        all_parked.set()
        except Exception as exc:
            if not seen and count:
                details = exc.details() if hasattr(exc, "details") else str(exc)
                failures.append(f"{type(exc).__name__}: {details}")
                all_parked.set()

    tasks: list[asyncio.Task[None]] = []
    try:
        # Warm-up: whole turns on the product; on a floor, streams parked then dropped.
        if floor:
            warm = [asyncio.create_task(park(i, count=False)) for i in range(cfg.warmup + 10)]
            await asyncio.sleep(0.5)
            for task in warm:
                task.cancel()
            await asyncio.gather(*warm, return_exceptions=True)
        else:
            quick = turn_request(COUNT_OFF, run_id="template")
            for _ in range(cfg.warmup + 10):
                await grpc_turn(server.stub(channels[0]), with_run_id(quick, new_id("b4w")))
        gc.collect()
        await asyncio.sleep(1.0)
        before = server.rss_bytes()
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(park(i)) for i in range(cfg.b4_runs)]
        await asyncio.wait_for(all_parked.wait(), timeout=180)
        if failures:
            raise RuntimeError(f"{len(failures)} run(s) failed to park: {failures[0]}")
        start_s = time.perf_counter() - t0
        await asyncio.sleep(1.0)
        after = server.rss_bytes()
    finally:
        server.kill()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in channels:
            await c.close()
        await server.wait()
    return {
        "rss_before_mb": before / 2**20,
        "rss_after_mb": after / 2**20,
        "kb_per_run": (after - before) / 1024 / cfg.b4_runs,
        "start_all_s": start_s,
    }


async def bench_b4(cfg: Config, work: Path) -> dict[str, Any]:
    """B4: server RSS growth per in-flight run, with N runs parked in a model call; and
    the same for its floors (a bare gRPC stream; the stream plus a bare LangGraph run),
    interleaved repetition by repetition."""
    reps: dict[str, list[dict[str, float]]] = {t: [] for t in B4_TARGETS}
    for i in range(cfg.b4_reps):
        for target in B4_TARGETS:
            reps[target].append(await _b4_rep(cfg, work, i, target))
    product = reps["roundtable"]
    figures = {
        "kb_per_parked_run": summary([r["kb_per_run"] for r in product], "KB/run"),
        "rss_before_mb": summary([r["rss_before_mb"] for r in product], "MB"),
        "rss_after_mb": summary([r["rss_after_mb"] for r in product], "MB"),
        "seconds_to_park_all": summary([r["start_all_s"] for r in product], "s"),
    }
    for target in B4_TARGETS[1:]:
        figures[f"kb_per_parked_{target}"] = summary(
            [r["kb_per_run"] for r in reps[target]], "KB/run"
        )
    # Roundtable's own share, repetition by repetition: the product less the floor that
    # holds both a stream and a LangGraph run.
    figures["kb_per_parked_run_over_floor"] = summary(
        [
            p["kb_per_run"] - f["kb_per_run"]
            for p, f in zip(product, reps["floor_grpc_langgraph"], strict=True)
        ],
        "KB/run",
    )
    return {
        "figures": figures,
        "runs": cfg.b4_runs,
        "notes": (
            "A fresh server per repetition and target; warm-up; VmRSS before; then N streams "
            "parked, spread over 10 channels; VmRSS 1 s later; KB/run = (after - before) / N. "
            "roundtable: `roundtable serve`, N 4-member count-offs whose model is offline "
            "latency_ms=600000 (each parks in speaker 1's model call: speaker_started "
            "received for all N). floor_grpc: bench/flood_server.py's /bench.Raw/Park, the "
            "same request parsed, one event sent, then parked (a bare grpc.aio stream). "
            "floor_grpc_langgraph: /bench.Raw/ParkGraph, the same plus a bare 3-node "
            "LangGraph run (no checkpointer) in a task of its own, parked in its second "
            "node. over_floor = roundtable - floor_grpc_langgraph per repetition."
        ),
    }


# -- B5: scaling --------------------------------------------------------------------------


HISTORY_SIZES = ("history_10", "history_1000", "history_10000")


def stub_response_template() -> Any:
    from roundtable.v1 import orchestrator_service_pb2 as pb

    return pb.StartRunResponse()


def without_context(template: Any) -> bytes:
    """`template` serialized without its context: what a client keeps and sends each turn
    behind a new serialized context (protobuf merges concatenated messages)."""
    body = type(template)()
    body.CopyFrom(template)
    body.ClearField("context")
    return body.SerializeToString()


def with_context_only(template: Any, run_id: str) -> Any:
    """A request holding only `with_run_id(template, run_id)`'s context."""
    out = type(template)()
    out.context.CopyFrom(template.context)
    out.context.run_id = run_id
    out.context.thread_id = f"t-{run_id}"
    out.context.request_id = f"r-{run_id}"
    return out


async def bench_b5(cfg: Config, work: Path) -> dict[str, Any]:
    """B5: turn cost end to end vs history length and vs number of speakers."""
    import grpc
    from roundtable.v1 import orchestrator_service_pb2 as pb

    configs = {
        "history_10": turn_request(COUNT_OFF, run_id="t", history_messages=10),
        # 64 = the default history window: the prompt as long as at 1,000 or 10,000.
        "history_64": turn_request(COUNT_OFF, run_id="t", history_messages=64),
        "history_1000": turn_request(COUNT_OFF, run_id="t", history_messages=1_000),
        "history_10000": turn_request(COUNT_OFF, run_id="t", history_messages=10_000),
        "speakers_1": turn_request(COUNT_OFF, run_id="t", members=1, history_messages=10),
        "speakers_16": turn_request(
            COUNT_OFF, run_id="t", members=16, max_speakers=16, history_messages=10
        ),
    }
    sizes = {name: r.ByteSize() for name, r in configs.items()}
    server = await Server(work / "b5.db", work / "b5.log").start()
    floor: Server | None = None
    try:
        async with server.channel() as channel:
            stub = server.stub(channel)
            # The transport's floor: a real turn's responses, recorded here, replayed by a
            # bare grpc.aio handler that leaves the request as received bytes
            # (bench/flood_server.py /bench.Raw/TurnUnparsed): what moving a request of
            # this size and the turn's responses costs gRPC alone, in the same rounds.
            recorded = await grpc_turn(stub, with_run_id(configs["history_10"], new_id("b5r")))
            write_replay(
                work / "b5-turn.replay",
                [pb.StartRunResponse(event=e).SerializeToString() for e in recorded],
            )
            floor = await Server(
                work / "b5-floor.db",
                work / "b5-floor.log",
                script=BENCH / "flood_server.py",
                env={"BENCH_TURN_REPLAY": str(work / "b5-turn.replay")},
            ).start()
            floor_channel = grpc.aio.insecure_channel(
                f"127.0.0.1:{floor.raw_port}",
                options=[("grpc.max_send_message_length", 64 * 1024 * 1024)],
            )
            floor_call = floor_channel.unary_stream(
                "/bench.Raw/TurnUnparsed",
                request_serializer=None,
                response_deserializer=pb.StartRunResponse.FromString,
            )
            # The same RPC taking the request as bytes: the client sends a serialized
            # snapshot it keeps, behind a per-turn context (protobuf merges concatenated
            # messages), so the figure is Roundtable's cost, not the client's serializer.
            raw_start = channel.unary_stream(
                "/roundtable.v1.OrchestratorService/StartRun",
                request_serializer=None,
                response_deserializer=type(stub_response_template()).FromString,
            )

            def variant(template: Any) -> Callable[[], Awaitable[Any]]:
                async def turn() -> None:
                    await grpc_turn(stub, with_run_id(template, new_id("b5")))

                return turn

            def wire_variant(template: Any) -> Callable[[], Awaitable[Any]]:
                cached = without_context(template)

                async def turn() -> None:
                    head = with_context_only(template, new_id("b5w")).SerializeToString()
                    events = [r.event async for r in raw_start(head + cached)]
                    if not events or kind_of(events[-1]) != "run_completed":
                        raise RuntimeError(f"turn did not complete: {events[-1:]}")

                return turn

            def floor_variant(template: Any) -> Callable[[], Awaitable[Any]]:
                cached = without_context(template)

                async def turn() -> None:
                    head = with_context_only(template, new_id("b5f")).SerializeToString()
                    events = await drain_stream(floor_call(head + cached))
                    if len(events) != len(recorded):
                        raise RuntimeError(f"B5 floor: {len(events)} of {len(recorded)}")

                return turn

            variants = {name: wire_variant(t) for name, t in configs.items()}
            variants.update(
                {f"client_serializes_{name}": variant(configs[name]) for name in HISTORY_SIZES}
            )
            variants.update(
                {f"grpc_floor_{name}": floor_variant(configs[name]) for name in HISTORY_SIZES}
            )
            try:
                samples = await interleaved(variants, cfg, cfg.b5_turns, cfg.b5_reps)
            finally:
                await floor_channel.close()
    finally:
        if floor is not None:
            await floor.stop()
        await server.stop()
    figures = {name: summary(v, "ms/turn") for name, v in samples.items()}
    figures["speakers_4"] = figures["history_10"]
    # Roundtable's own added cost, repetition by repetition (each round measured the turn
    # and its floor back to back): the turn less gRPC's cost of moving the same bytes.
    own = [
        (t - f) / (t10 - f10)
        for t, f, t10, f10 in zip(
            samples["history_10000"],
            samples["grpc_floor_history_10000"],
            samples["history_10"],
            samples["grpc_floor_history_10"],
            strict=True,
        )
    ]
    figures["own_history_10000_over_10"] = summary(own, "x")
    return {
        "figures": figures,
        "request_bytes": sizes,
        "notes": (
            "End to end over gRPC (a real `roundtable serve`), count-off, zero-latency "
            "offline model; speakers_4 is history_10 (4 members, 10 history messages). "
            "history_64 fills the default history window (64), as 1,000 and 10,000 do: "
            "from 64 on, every speaker's prompt holds the same 64 messages. "
            "History messages are ~70 bytes. history_* and speakers_*: the client keeps "
            "the serialized snapshot and sends it behind a new context each turn, so the "
            "figure is Roundtable's cost (receiving, parsing, fingerprinting); "
            "client_serializes_history_*: the client copies and serializes the whole "
            "request per turn (with Python's protobuf: ≈1.1 ms for 10,000 messages), the "
            "gateway's cost included. grpc_floor_history_*: the same bytes to a bare "
            "grpc.aio handler (bench/flood_server.py /bench.Raw/TurnUnparsed, its own "
            "process) that leaves them unparsed and answers a recorded count-off's "
            "responses: gRPC's own cost of the turn at that size. "
            "own_history_10000_over_10: (history_10000 − its floor) ÷ (history_10 − its "
            "floor), per round: Roundtable's part of the turn."
        ),
    }


# -- B6: resume ---------------------------------------------------------------------------


async def _b6_rep(work: Path, rep: int, *args: str) -> dict[str, Any]:
    db = work / f"b6-{rep}{'-'.join(args)}.db"
    request = turn_request(
        COUNT_OFF,
        run_id=new_id("b6"),
        members=16,
        max_speakers=16,
        member_model=offline_ref(latency_ms=30),
    )
    a = await Server(db, db.with_suffix(".a.log"), *args).start()
    a_events = []
    try:
        async with a.channel() as channel:
            async for response in a.stub(channel).StartRun(request):
                a_events.append(response.event)
                e = response.event
                if kind_of(e) == "assistant_final" and e.assistant_final.step == 7:
                    a.kill()
                    break
        if not any(
            kind_of(e) == "assistant_final" and e.assistant_final.step == 7 for e in a_events
        ):
            raise RuntimeError(
                f"process A ended before speaker 8: {[kind_of(e) for e in a_events][-3:]}"
            )
    finally:
        a.kill()
        await a.wait()
    a_steps = [e.assistant_final.step for e in a_events if kind_of(e) == "assistant_final"]
    b = await Server(db, db.with_suffix(".b.log"), *args).start()
    try:
        async with b.channel() as channel:
            stub = b.stub(channel)
            arrivals: list[tuple[float, Any]] = []
            t0 = time.perf_counter()
            async for response in stub.StartRun(request):
                arrivals.append((time.perf_counter(), response.event))
            total = time.perf_counter() - t0
    finally:
        await b.stop()
    # The stream is the run's log from seq 1 (A's events), then B's execution: its first
    # new event is B's run_started.
    starts = [i for i, (_, e) in enumerate(arrivals) if kind_of(e) == "run_started"]
    new_part = arrivals[starts[-1] :] if starts else arrivals
    first = new_part[0][0] if new_part else None
    first_speaker = next((t for t, e in new_part if kind_of(e) == "speaker_started"), None)
    b_events = [e for _, e in new_part]
    b_steps = [e.assistant_final.step for e in b_events if kind_of(e) == "assistant_final"]
    dispatch_calls = sum(
        1 for r in b.audit() if r.get("caller_node") == "dispatch" and r.get("status") == "success"
    )
    new_speakers = sum(1 for s in b_steps if s >= 8)
    if dispatch_calls < new_speakers:
        raise RuntimeError(
            f"B's log has {dispatch_calls} dispatch audit records for {new_speakers} new finals: "
            "the audit line format changed (benchlib.Server.audit)"
        )
    return {
        "ttfe_ms": (first - t0) * 1000 if first else float("inf"),
        "first_speaker_ms": (first_speaker - t0) * 1000 if first_speaker else float("inf"),
        "resume_total_ms": total * 1000,
        "b_startup_s": b.started_in_s,
        "model_calls_speakers_1_8": dispatch_calls - new_speakers,
        "finals_for_1_8_in_b": sum(1 for s in b_steps if s < 8),
        "a_finals": len(a_steps),
        "b_finals": sorted(b_steps),
        "completed": bool(b_events) and kind_of(b_events[-1]) == "run_completed",
        "resumed_flag": bool(b_events) and b_events[0].run_started.resumed,
    }


async def bench_b6(cfg: Config, work: Path) -> dict[str, Any]:
    """B6: a 16-speaker run SIGKILLed after speaker 8's final, resumed by a new process."""
    reps = [await _b6_rep(work, i) for i in range(cfg.b6_reps)]
    async_reps = [
        await _b6_rep(work, i, "--checkpoint-durability", "async")
        for i in range(max(1, cfg.b6_reps // 2))
    ]
    return {
        "figures": {
            "time_to_first_event_ms": summary([r["ttfe_ms"] for r in reps], "ms"),
            "time_to_first_speaker_ms": summary([r["first_speaker_ms"] for r in reps], "ms"),
            "resume_total_ms": summary([r["resume_total_ms"] for r in reps], "ms"),
            "new_process_startup_s": summary([r["b_startup_s"] for r in reps], "s"),
            "model_calls_speakers_1_8": summary(
                [r["model_calls_speakers_1_8"] for r in reps], "calls"
            ),
            "async_durability_model_calls_speakers_1_8": summary(
                [r["model_calls_speakers_1_8"] for r in async_reps], "calls"
            ),
            "async_durability_time_to_first_event_ms": summary(
                [r["ttfe_ms"] for r in async_reps], "ms"
            ),
        },
        "reps": reps,
        "async_reps": async_reps,
        "notes": (
            "Process A runs a 16-member count-off (offline latency_ms=30 per speaker) and is "
            "SIGKILLed when the client receives step 7's assistant_final (speaker 8). Process "
            "B (new, same database) gets the same StartRun, whose stream replays A's log first: "
            "time to its first new event (run_started, resumed) and to its first "
            "speaker_started, from the call. Model "
            "calls for speakers 1-8 = B's audit records caller_node=dispatch, status=success "
            "minus B's finals for steps >= 8. The default durability ('exit') leaves no "
            "checkpoint until the run ends: resume rests on the event log alone. async_*: "
            "the same with both processes started with --checkpoint-durability async (B's "
            "graph resumes from the plan's checkpoint)."
        ),
    }


# -- B9: parallel speakers ------------------------------------------------------------------

B9_MODEL = {"latency_ms": 200, "token_delay_ms": 10}
B9_TOKENS = 20


def _b9_request(members: int, *, parallel: bool) -> Any:
    """An @all of `members` with the B9 model: 200 ms to the first token, then 20 tokens at
    10 ms (the offline model cut at a 20-token budget)."""
    request = turn_request(
        "@all what do you think?",
        run_id="template",
        members=members,
        member_model=offline_ref(**B9_MODEL),
        max_speakers=members,
        max_output_tokens=B9_TOKENS,
    )
    if parallel:
        session = request.snapshot.session
        session.speaker_concurrency = 2  # SPEAKER_CONCURRENCY_PARALLEL
        session.budgets.max_parallel_speakers = min(members, 16)
    return request


async def bench_b9(cfg: Config, work: Path) -> dict[str, Any]:
    """B9: an @all answered at once against one speaker's turn; Roundtable's CPU per turn."""
    variants = {
        "one_speaker": _b9_request(1, parallel=False),
        "sequential_4": _b9_request(4, parallel=False),
        "parallel_4": _b9_request(4, parallel=True),
        "parallel_16": _b9_request(16, parallel=True),
    }
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    batch = 2 if cfg.quick else 4  # turns per figure: the process's CPU clock ticks 10 ms
    server = await Server(work / "b9.db", work / "b9.log").start()
    try:
        async with server.channel() as channel:
            stub = server.stub(channel)
            for template in variants.values():  # warm-up: one of each
                await grpc_turn(stub, with_run_id(template, new_id("b9w")))
            # What the idle process spends (gRPC's pollers): taken off each turn's CPU, pro
            # rata of its wall time, or a slower turn would look dearer for waiting.
            idle0, t_idle = server.cpu_seconds(), time.perf_counter()
            await asyncio.sleep(2.0)
            idle_rate = (server.cpu_seconds() - idle0) / (time.perf_counter() - t_idle)
            for _ in range(cfg.reps):
                for name, template in variants.items():  # interleaved, rep by rep
                    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
                    for _turn in range(batch):
                        events = await grpc_turn(stub, with_run_id(template, new_id("b9")))
                        finals = sum(1 for e in events if kind_of(e) == "assistant_final")
                        if finals != len(template.snapshot.members):
                            raise RuntimeError(f"B9 {name}: {finals} finals")
                    took = time.perf_counter() - t0
                    wall[name].append(took * 1000 / batch)
                    busy = server.cpu_seconds() - cpu0 - idle_rate * took
                    cpu[name].append(max(busy, 0.0) * 1000 / batch)
    finally:
        await server.stop()
    one = wall["one_speaker"]
    figures = {f"{name}_ms": summary(v, "ms") for name, v in wall.items()}
    figures["idle_cpu_ms_per_s"] = summary([idle_rate * 1000], "ms/s")
    figures |= {f"{name}_cpu_ms": summary(v, "ms") for name, v in cpu.items()}
    for name in ("sequential_4", "parallel_4", "parallel_16"):
        figures[f"{name}_over_one"] = summary(
            [x / y for x, y in zip(wall[name], one, strict=True)], "x"
        )
    figures["cpu_parallel_4_over_sequential_4"] = summary(
        [x / y for x, y in zip(cpu["parallel_4"], cpu["sequential_4"], strict=True)], "x"
    )
    return {
        "figures": figures,
        "notes": (
            "A real `roundtable serve`; each member's model is the offline model with "
            "latency_ms=200 and token_delay_ms=10, cut at a 20-token budget (200 ms to the "
            "first token, then 19 more at 10 ms: ≈390 ms a speaker). one_speaker: an @all of "
            "one member; sequential_4 / parallel_4: an @all of four members, "
            "SPEAKER_CONCURRENCY_SEQUENTIAL / PARALLEL (max_parallel_speakers 4); "
            "parallel_16: sixteen members, max_parallel_speakers 16. Wall time from the call "
            "to the stream's end, the mean of a batch of turns; the variants interleaved rep "
            "by rep, so *_over_one is paired. cpu: the server process's CPU time (user + "
            "system) per turn, less what the idle process spends in as long (measured for "
            "2 s before: gRPC's pollers), so a turn that waits longer does not look dearer."
        ),
    }


# -- B8: tools and approval (issue 20) -------------------------------------------------------

B8_TARGETS = ("no_stream", "one_stream", "no_stream_collected", "one_stream_collected")
"""What B8 parks, each on a fresh server: runs awaiting approval with no stream attached or
with one (its StartRun kept open), on `roundtable serve` and on bench/flood_server.py with a
full garbage collection every B8_COLLECT_EVERY runs parked."""
B8_COLLECT_EVERY = 25


async def bench_b8(cfg: Config, work: Path) -> dict[str, Any]:
    """B8: RSS per run awaiting approval (no stream, one stream), decision → first resumed
    event, and a tool call through the harness ÷ the bare MCP client call."""
    sys.path.insert(0, str(BENCH.parent / "tests"))  # the test MCP server
    import approval
    import tool_call
    from support.mcp_server import McpServerProcess

    warmup = 10 if cfg.quick else 20
    reps: dict[str, list[dict[str, Any]]] = {t: [] for t in B8_TARGETS}
    floor: list[dict[str, float]] = []
    mcp = await McpServerProcess(work / "b8-mcp.log").start()
    try:
        for rep in range(cfg.b8_reps):
            for target in B8_TARGETS:
                collected = target.endswith("_collected")
                reps[target].append(
                    await approval.measure_parked(
                        work,
                        mcp.url,
                        f"{target}-{rep}",
                        runs=cfg.b8_runs,
                        keep=target.startswith("one_stream"),
                        warmup=warmup,
                        resumes=cfg.b8_resumes if target == "one_stream" else 0,
                        collect_every=B8_COLLECT_EVERY if collected else 0,
                        flood_server=BENCH / "flood_server.py" if collected else None,
                    )
                )
            # The stream's floor: B4's bare grpc.aio stream parked after one event.
            floor.append(
                await _b4_rep(
                    dataclasses.replace(cfg, b4_runs=cfg.b8_runs), work, 100 + rep, "floor_grpc"
                )
            )
    finally:
        await mcp.stop()
    tool = await tool_call.measure_tool_call(
        work, cfg.b8_tool_calls, cfg.b8_tool_rounds, 20 if cfg.quick else 50
    )

    def kb(target: str, key: str = "kb_per_run") -> list[float]:
        return [r[key] for r in reps[target]]

    resumed = [approval.resume_figures(r["resumes"]) for r in reps["one_stream"]]
    figures = {}
    for target in B8_TARGETS:
        figures[f"kb_per_parked_run_{target}"] = summary(kb(target), "KB/run")
        second = kb(target, "kb_per_run_second_half")
        figures[f"kb_per_parked_run_{target}_second_half"] = summary(second, "KB/run")
    figures |= {
        "kb_per_stream_floor_grpc": summary([f["kb_per_run"] for f in floor], "KB/run"),
        "garbage_objects_per_parked_run": summary(
            kb("no_stream_collected", "garbage_objects_per_run"), "objects/run"
        ),
        "gc_objects_per_parked_run_no_stream": summary(
            kb("no_stream_collected", "tracked_objects_per_run"), "objects/run"
        ),
        "gc_objects_per_parked_run_one_stream": summary(
            kb("one_stream_collected", "tracked_objects_per_run"), "objects/run"
        ),
        "seconds_to_park_all": summary([r["park_all_s"] for r in reps["no_stream"]], "s"),
        "resume_first_event_p50_ms": summary([r["first_p50"] for r in resumed], "ms"),
        "resume_first_event_p99_ms": summary([r["first_p99"] for r in resumed], "ms"),
        "resolve_answer_p50_ms": summary([r["answer_p50"] for r in resumed], "ms"),
        "resolve_answer_p99_ms": summary([r["answer_p99"] for r in resumed], "ms"),
        "resume_final_p50_ms": summary([r["final_p50"] for r in resumed], "ms"),
        "resume_final_p99_ms": summary([r["final_p99"] for r in resumed], "ms"),
    }
    for side in ("harness", "harness_traced"):
        figures[f"tool_call_{side}_over_bare"] = summary(tool[side]["round_p50_ratios"], "x")
        figures[f"tool_call_{side}_over_bare_p99"] = summary([tool[side]["ratio_p99"]], "x")
    for side in ("bare", "harness"):
        figures[f"tool_call_{side}_p50_ms"] = summary(tool[side]["round_p50_ms"], "ms")
    first_kinds: dict[str, int] = {}
    sequences: dict[str, int] = {}
    for r in resumed:
        for key, n in r["first_kinds"].items():
            first_kinds[key] = first_kinds.get(key, 0) + n
        for key, n in r["sequences"].items():
            sequences[key] = sequences.get(key, 0) + n
    return {
        "figures": figures,
        "runs": cfg.b8_runs,
        "collect_every": B8_COLLECT_EVERY,
        "resumes": cfg.b8_resumes,
        "resume_first_kinds": first_kinds,
        "resume_sequences": sequences,
        "parts_kb_per_run": {
            target: [r["parts_kb_per_run"] for r in reps[target]] for target in B8_TARGETS
        },
        "rss_mb_by_runs": {
            target: [r["rss_mb_by_runs"] for r in reps[target]] for target in B8_TARGETS
        },
        "tool_call": tool,
        "notes": (
            "A fresh server per repetition and variant, the test MCP server "
            "(tests/support/mcp_server.py) beside it. Each run is a single chat whose member "
            "calls `note` (APPROVAL_POLICY_ALWAYS): StartRun read until permission_required; "
            "GetRun then confirms RUN_STATUS_AWAITING_APPROVAL for every run. Warm-up: whole "
            "approval cycles (10 one at a time with their streams, the rest with their "
            "clients gone, approved at once). VmRSS 1 s after the warm-up, after each tenth "
            "of the N runs parked (16 being started at once, 10 channels, 20 tenants) and 1 s "
            "after the last; KB/run = growth / N; *_second_half = growth over the last N/2 "
            "runs / (N/2), without the one-off growth of the first runs. no_stream: each "
            "client cancels its call once asked (disconnect policy CONTINUE: the run stays "
            "parked). one_stream: each StartRun kept open, idle. *_collected: the same on "
            "bench/flood_server.py (the product's running_server(), gc.freeze()d like serve) "
            "with a full gc.collect() before the first run and after every "
            f"{B8_COLLECT_EVERY} parked (garbage_objects_per_parked_run: what those "
            "collections freed, per run; gc_objects_*: objects the collector tracks per "
            "parked run). floor_grpc: B4's bare grpc.aio stream parked after one event, N of "
            "them. resume: on the first runs of one_stream, one at a time, "
            "ResolvePermission(approve) sent -> the stream's next event (first_event), the "
            "answer, and assistant_final (after the tool ran through MCP); p50/p99 per "
            "repetition. tool_call: bench/tool_call.py, ToolHarness + McpPool vs the mcp "
            "SDK's ClientSession.call_tool, alternating call by call; the ratio of each "
            "round's p50s (min/median/max over rounds); *_p99: all rounds' calls pooled."
        ),
    }


# -- main ---------------------------------------------------------------------------------

BENCHES = {
    "B1": bench_b1,
    "B2": bench_b2,
    "B3": bench_b3,
    "B4": bench_b4,
    "B5": bench_b5,
    "B6": bench_b6,
    "B8": bench_b8,
    "B9": bench_b9,
}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="CI smoke: fewer, shorter runs")
    parser.add_argument("--only", default="", help="comma-separated subset, e.g. B1,B5")
    parser.add_argument("--out", default=str(BENCH / "results" / "suite.json"))
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, dbs)")
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    selected = [b.strip().upper() for b in args.only.split(",") if b.strip()] or list(BENCHES)
    work = Path(tempfile.mkdtemp(prefix="rt-bench-"))
    # In-process baselines log like `roundtable serve` does (INFO: an audit line per call).
    from roundtable.telemetry import logs

    log_file = (work / "inprocess.log").open("a", encoding="utf-8")
    log_writer = logs.configure("INFO", log_file)
    result: dict[str, Any] = {
        "mode": "quick" if cfg.quick else "full",
        "config": dataclasses.asdict(cfg),
        "machine": machine_info(),
        "benches": {},
        "errors": {},
    }
    started = time.perf_counter()
    for name in selected:
        t0 = time.perf_counter()
        print(f"[suite] {name} ...", flush=True)
        try:
            out = await BENCHES[name](cfg, work)
            out["seconds"] = round(time.perf_counter() - t0, 1)
            result["benches"][name] = out
            print(f"[suite] {name} done in {out['seconds']} s", flush=True)
        except Exception:
            result["errors"][name] = traceback.format_exc()
            print(f"[suite] {name} FAILED:\n{result['errors'][name]}", flush=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2, default=float))
    log_writer.stop()
    log_file.close()
    if args.keep or result["errors"]:
        print(f"[suite] work dir kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(asyncio.run(main()))
