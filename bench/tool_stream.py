"""What reading a streamed tool call costs the client, by path (issue 20).

    .venv/bin/python bench/tool_stream.py [--runs 200]

A fake OpenAI-compatible server (this file with `--serve PORT`, its own process) streams one
reply of 34 chunks: a tool call whose arguments come in 29 fragments of 8 characters, in the
dialect the request's `model` names (openai, llamacpp-old, whole, index0), or the same
fragments as text (model `text`). The client measures, after a warm-up, per reply: wall time
(p50, p99) and its own CPU time (the server runs elsewhere), for

- `provider text`: `OpenAICompatProvider`, no tools (today's LangChain path);
- `provider tools (native)`: `OpenAICompatProvider` with tools (the openai SDK's chunks);
- `generic tools (bind_tools)`: `LangChainProvider` over `ChatOpenAI` with tools (LangChain's
  chunks into `ToolCallAccumulator`);
- `langchain chunk sum`: `bind_tools` + `astream`, the chunks added up (`acc + chunk`), as
  LangChain assembles calls itself (the research's baseline).

It first prints what each path makes of each dialect.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARGS = json.dumps({"city": "Paris", "note": "x" * 200})
FRAGMENT = 8
DIALECTS = ("openai", "llamacpp-old", "whole", "index0")


def _frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def frames(dialect: str) -> list[bytes]:
    """The reply's SSE frames in a dialect (see tests/support/openai_server.py)."""
    out = [_frame({"role": "assistant", "content": ""})]
    pieces = [ARGS[i : i + FRAGMENT] for i in range(0, len(ARGS), FRAGMENT)]
    call = {"index": 0, "id": "call_1", "type": "function"}
    if dialect == "openai":
        out.append(
            _frame({"tool_calls": [{**call, "function": {"name": "weather", "arguments": ""}}]})
        )
        out += [
            _frame({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces
        ]
    elif dialect == "llamacpp-old":
        function = {"id": "call_1", "name": "weather"}
        out += [
            _frame({"tool_calls": [{"index": 0, "function": {**function, "arguments": p}}]})
            for p in pieces
        ]
    elif dialect == "whole":
        out.append(
            _frame({"tool_calls": [{**call, "function": {"name": "weather", "arguments": ARGS}}]})
        )
    elif dialect == "index0":
        for call_id, city in (("call_a", "Paris"), ("call_b", "Rome")):
            function = {"name": "weather", "arguments": json.dumps({"city": city})}
            out.append(_frame({"tool_calls": [{**call, "id": call_id, "function": function}]}))
    else:
        out += [_frame({"content": p}) for p in pieces]
    out.append(_frame({}, "stop" if dialect == "text" else "tool_calls"))
    usage = {"prompt_tokens": 10, "completion_tokens": 30, "total_tokens": 40}
    out.append(
        b"data: "
        + json.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [],
                "usage": usage,
            }
        ).encode()
        + b"\n\n"
    )
    out.append(b"data: [DONE]\n\n")
    return out


def serve(port: int) -> None:
    from aiohttp import web

    cache = {d: frames(d) for d in (*DIALECTS, "text")}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for frame in cache[body["model"]]:
            await response.write(frame)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


async def measure(runs: int, base_url: str) -> None:
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr
    from roundtable.domain.snapshot import ModelTarget
    from roundtable.models.base import ChatCall, ChatMessage, ChatResult, ToolSpec
    from roundtable.models.langchain_provider import LangChainProvider
    from roundtable.models.openai_compat import build_openai_provider
    from roundtable.models.tool_calls import openai_tools

    weather = ToolSpec("weather", "The weather in a city", '{"type": "object"}')
    messages = (ChatMessage("user", "use weather for Paris"),)
    with_tools = ChatCall(messages=messages, tools=(weather,))
    text_only = ChatCall(messages=messages)
    native = build_openai_provider()

    def chat_openai(target: ModelTarget, _key: str | None) -> ChatOpenAI:
        return ChatOpenAI(
            model=target.model,
            base_url=target.base_url,
            api_key=SecretStr("none"),
            max_retries=0,
            streaming=True,
            stream_usage=True,
            stream_chunk_timeout=0,
        )

    generic = LangChainProvider("openai", chat_openai)
    summing = chat_openai(ModelTarget(provider="openai", model="openai", base_url=base_url), None)
    bound = summing.bind_tools(openai_tools([weather]))

    def target(model: str) -> ModelTarget:
        return ModelTarget(provider="openai", model=model, base_url=base_url)

    async def chunk_sum(model: str) -> list[tuple[str, str, str | None]]:
        total: Any = None
        async for chunk in bound.astream([("user", "use weather for Paris")], model=model):
            total = chunk if total is None else total + chunk
        return [(c["name"], json.dumps(c["args"])[:20], c["id"]) for c in total.tool_calls]

    def calls(result: ChatResult) -> list[tuple[str, str, str]]:
        return [(c.name, c.arguments_json[:20], c.call_id) for c in result.tool_calls]

    for dialect in DIALECTS:
        print(f"== {dialect}")
        got = await native.complete(target(dialect), with_tools, api_key=None, on_text=None)
        print(f"  native     {calls(got)}")
        got = await generic.complete(target(dialect), with_tools, api_key=None, on_text=None)
        print(f"  bind_tools {calls(got)}")
        print(f"  chunk sum  {await chunk_sum(dialect)}")

    paths: dict[str, Callable[[], Awaitable[Any]]] = {
        "provider text": lambda: native.complete(
            target("text"), text_only, api_key=None, on_text=None
        ),
        "provider tools (native)": lambda: native.complete(
            target("openai"), with_tools, api_key=None, on_text=None
        ),
        "generic tools (bind_tools)": lambda: generic.complete(
            target("openai"), with_tools, api_key=None, on_text=None
        ),
        "langchain chunk sum": lambda: chunk_sum("openai"),
    }
    print(f"\n{runs} replies of 34 chunks each, after 20 of warm-up; client CPU per reply")
    for name, run in paths.items():
        for _ in range(20):
            await run()
        walls = []
        cpu = time.process_time()
        for _ in range(runs):
            started = time.perf_counter()
            await run()
            walls.append((time.perf_counter() - started) * 1e3)
        cpu_ms = (time.process_time() - cpu) / runs * 1e3
        walls.sort()
        p50, p99 = walls[len(walls) // 2], walls[min(len(walls) - 1, int(len(walls) * 0.99))]
        print(f"  {name:28s} p50 {p50:5.2f} ms  p99 {p99:5.2f} ms  CPU {cpu_ms:5.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.05)
        asyncio.run(measure(args.runs, f"http://127.0.0.1:{port}/v1"))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
