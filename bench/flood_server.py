"""The bench's server process for B2: `roundtable serve` plus two bench-only providers and a
raw grpc.aio stream, built through the product's own composition root (`running_server`).

Providers (selected by a ModelTarget's `provider`; knobs in its base_url query string,
e.g. `flood:?tokens=100000&token_delay_ms=0&yield_every=1`):

- `flood`: a LangChain chat model behind the product's `LangChainProvider`, the path every
  real model takes. It streams `tokens` tokens, ignoring max_tokens.
- `floodnative`: a `ChatProvider` that calls `on_text` directly: the ceiling of Roundtable's
  own pipe (sink coalescing, fan-out, gRPC) without LangChain's per-chunk cost.

Every token is its own production time: six base-36 characters of CLOCK_MONOTONIC
microseconds and a space (7 bytes), so the client measures the latency of each token.

Like `roundtable serve`, it runs `gc.collect(); gc.freeze()` once serving. With
BENCH_PROFILE=FILE,
SIGUSR1 starts cProfile and SIGUSR2 stops it and writes FILE (bench/profile_turn.py), so a
profile holds the measured turns only, not start-up.

`/bench.Raw/Stream` (a generic handler on a second port) sends N messages, one token a
message, each a full `StartRunResponse` with an `assistant_delta`: the raw grpc.aio
baseline, measured in the same process and the same run. `/bench.Raw/ModelAlone`
(`langchain:N` or `native:N`) consumes a bench model in this process with nothing else and
answers its tokens/s: the model's own ceiling.
`/bench.Raw/Park` and `/bench.Raw/ParkGraph` are B4's floors, `/bench.Raw/Collect` B8's
garbage check (see `raw_handler`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from benchlib import read_replay, stamp_now
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from roundtable.domain.events import TokenUsage
from roundtable.models.base import ChatCall
from roundtable.models.base import ChatResult as RtResult
from roundtable.models.langchain_provider import LangChainProvider
from roundtable.server import running_server
from roundtable.settings import load_settings
from roundtable.telemetry import logs
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb

log = logging.getLogger("bench.flood_server")


def knobs(base_url: str) -> tuple[int, float, int]:
    """(tokens, token delay in seconds, yield to the event loop every N tokens)."""
    query = parse_qs(urlsplit(base_url).query) if base_url else {}

    def num(name: str, default: float) -> float:
        values = query.get(name)
        return float(values[0]) if values else default

    return int(num("tokens", 1000)), num("token_delay_ms", 0) / 1000, int(num("yield_every", 1))


async def produce(tokens: int, delay_s: float, yield_every: int) -> AsyncIterator[str]:
    """Stamped tokens, paced by `delay_s`, or as fast as possible yielding to the loop.

    A token's stamp is the time of the network read that brought it: taken after each
    pause (a sleep, or a yield to the loop), and shared by the tokens until the next one,
    which arrived together. Stamping each token of a read anew would make the bench's
    clock, not the model or Roundtable, the cost of a read (≈1.5 µs a token of ≈3).
    """
    token = ""
    for i in range(tokens):
        if delay_s:
            if i:
                await asyncio.sleep(delay_s)
            token = stamp_now() + " "
        elif yield_every and i % yield_every == 0:
            await asyncio.sleep(0)  # a network model hands control back between reads
            token = stamp_now() + " "
        elif not token:
            token = stamp_now() + " "
        yield token


class FloodChatModel(BaseChatModel):
    """A LangChain chat model that streams N stamped tokens."""

    tokens: int = 1000
    delay_s: float = 0.0
    yield_every: int = 1

    @property
    def _llm_type(self) -> str:
        return "bench-flood"

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("async only")

    async def _astream(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        async for token in produce(self.tokens, self.delay_s, self.yield_every):
            yield ChatGenerationChunk(message=AIMessageChunk(content=token))
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=UsageMetadata(
                    input_tokens=1, output_tokens=self.tokens, total_tokens=self.tokens + 1
                ),
                response_metadata={"finish_reason": "stop"},
                chunk_position="last",
            )
        )


def flood_factory(target: Any, _api_key: str | None) -> BaseChatModel:
    tokens, delay_s, yield_every = knobs(target.base_url)
    return FloodChatModel(tokens=tokens, delay_s=delay_s, yield_every=yield_every)


class NativeFloodProvider:
    """A ChatProvider that streams straight into `on_text` (no LangChain)."""

    name = "floodnative"

    async def complete(
        self, target: Any, call: ChatCall, *, api_key: str | None, on_text: Any
    ) -> RtResult:
        tokens, delay_s, yield_every = knobs(target.base_url)
        whole_reads = "whole_reads=1" in target.base_url
        parts: list[str] = []
        read: list[str] = []
        async for token in produce(tokens, delay_s, yield_every):
            parts.append(token)
            if on_text is None:
                continue
            if not whole_reads:
                on_text(token)
                continue
            # A provider that hands over each network read at once: the tokens produced
            # between two yields to the event loop go to on_text as one piece.
            read.append(token)
            if len(read) >= yield_every:
                on_text("".join(read))
                read.clear()
        if read and on_text is not None:
            on_text("".join(read))
        return RtResult(
            text="".join(parts),
            usage=TokenUsage(1, tokens),
            finish_reason="stop",
            model=f"{target.provider}/{target.model}",
        )


class BareState(TypedDict, total=False):
    """A bare graph's state: as many keys as a turn's state has, none of its data."""

    turn: str
    plan: list[str]
    replies: list[str]
    route: str
    directive: str
    round: int
    input_tokens: int
    output_tokens: int
    finished: bool


def bare_graph(never: asyncio.Event) -> Any:
    """B4's LangGraph floor: a turn's shape with nothing in it, compiled as LangGraph's
    documentation shows (no checkpointer). `prepare` → `speak` (parks until `never` is
    set, after setting the `parked` event found in the run's configurable) → `finish`."""

    async def prepare(state: BareState) -> BareState:
        return {"plan": ["a", "b", "c", "d"], "route": "group", "directive": "count_off"}

    async def speak(state: BareState, config: RunnableConfig) -> BareState:
        config["configurable"]["parked"].set()
        await never.wait()
        return {"replies": ["1", "2", "3", "4"], "round": 1}

    async def finish(state: BareState) -> BareState:
        return {"finished": True}

    graph = StateGraph(BareState)
    graph.add_node("prepare", prepare)
    graph.add_node("speak", speak)
    graph.add_node("finish", finish)
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "speak")
    graph.add_edge("speak", "finish")
    graph.add_edge("finish", END)
    return graph.compile()


def raw_handler(replay: list[bytes] | None = None) -> grpc.GenericRpcHandler:
    """`/bench.Raw/Stream`: the request is N as ASCII; N messages of one token each.

    `/bench.Raw/Turn`: B1's gRPC floor. It parses a StartRunRequest like the product's
    edge and answers `replay` (a real turn's responses, recorded and pre-serialized):
    what a Python gRPC server and client cost for a turn with nothing in between.

    `/bench.Raw/TurnUnparsed`: B5's floor. The same replay, the request left as the bytes
    gRPC received: what moving the request and the responses costs, nothing else.

    `/bench.Raw/Park` and `/bench.Raw/ParkGraph`: B4's floors. Each parses a
    StartRunRequest, sends one event and stays parked until the client leaves; `ParkGraph`
    first starts a bare LangGraph run (`bare_graph`) in a task of its own, as the product
    runs a turn, and sends its event once that run is parked in its second node.

    `/bench.Raw/Collect`: B8's garbage check. A full `gc.collect()` in this process; answers
    `<objects collected> <objects the collector tracks after>` as ASCII.
    """

    async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        for _ in range(int(request.decode())):
            yield pb.StartRunResponse(
                event=epb.RunEvent(
                    run_id="raw",
                    seq=1,
                    assistant_delta=epb.AssistantDelta(
                        reply_id="raw#0", text=stamp_now() + " ", attempt=1
                    ),
                )
            )

    async def model_alone(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The bench models consumed in this process with nothing else: tokens/s."""
        kind, _, n = request.decode().partition(":")
        tokens = int(n)
        t0 = time.perf_counter()
        if kind == "langchain":
            model = FloodChatModel(tokens=tokens)
            async for _ in model.astream([HumanMessage("tell me a very long story")]):
                pass
        else:
            async for _ in produce(tokens, 0, 1):
                pass
        return f"{tokens / (time.perf_counter() - t0):.1f}".encode()

    async def collect(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        collected = gc.collect()
        return f"{collected} {len(gc.get_objects())}".encode()

    async def turn(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for response in replay or ():
            yield response

    never = asyncio.Event()  # parked streams and graph runs wait on it until cancelled
    graph = bare_graph(never)

    async def park(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        yield pb.StartRunResponse(event=epb.RunEvent(run_id=request.context.run_id, seq=1))
        await never.wait()

    async def park_graph(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        parked = asyncio.Event()
        run = asyncio.create_task(
            graph.ainvoke({"turn": request.context.run_id}, {"configurable": {"parked": parked}})
        )
        try:
            await parked.wait()
            yield pb.StartRunResponse(event=epb.RunEvent(run_id=request.context.run_id, seq=1))
            await run
        finally:
            run.cancel()

    handler = grpc.unary_stream_rpc_method_handler(
        stream, response_serializer=pb.StartRunResponse.SerializeToString
    )
    parked_handlers = {
        name: grpc.unary_stream_rpc_method_handler(
            method,
            request_deserializer=pb.StartRunRequest.FromString,
            response_serializer=pb.StartRunResponse.SerializeToString,
        )
        for name, method in (("Park", park), ("ParkGraph", park_graph))
    }
    alone = grpc.unary_unary_rpc_method_handler(model_alone)
    replayed = grpc.unary_stream_rpc_method_handler(
        turn, request_deserializer=pb.StartRunRequest.FromString
    )
    unparsed = grpc.unary_stream_rpc_method_handler(turn)
    return grpc.method_handlers_generic_handler(
        "bench.Raw",
        {
            "Stream": handler,
            "ModelAlone": alone,
            "Collect": grpc.unary_unary_rpc_method_handler(collect),
            "Turn": replayed,
            "TurnUnparsed": unparsed,
            **parked_handlers,
        },
    )


async def main(argv: list[str]) -> None:
    settings = load_settings(argv)
    writer = logs.configure(settings.log_level, sys.stderr)  # as `roundtable serve` does
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    providers = {
        "flood": LangChainProvider("flood", flood_factory),
        "floodnative": NativeFloodProvider(),
    }
    async with running_server(settings, extra_providers=providers) as running:
        raw = grpc.aio.server()
        replay = read_replay(os.environ.get("BENCH_TURN_REPLAY", ""))
        raw.add_generic_rpc_handlers((raw_handler(replay),))
        raw_port = raw.add_insecure_port("127.0.0.1:0")
        await raw.start()
        profile_path = os.environ.get("BENCH_PROFILE")
        if profile_path:
            import cProfile

            profiler = cProfile.Profile()
            loop.add_signal_handler(signal.SIGUSR1, profiler.enable)

            def dump() -> None:
                profiler.disable()
                profiler.dump_stats(profile_path)
                log.warning("bench: profile written")

            loop.add_signal_handler(signal.SIGUSR2, dump)
        # As `roundtable serve` does (server.serve): start-up objects leave the collector's
        # view, so gen-2 collections stay short.
        gc.collect()
        gc.freeze()
        log.warning("bench raw stream on 127.0.0.1:%d", raw_port)
        log.warning("roundtable serving on 127.0.0.1:%d (bench flood server)", running.port)
        await stop.wait()
        await raw.stop(0)
    writer.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
