"""A real, scriptable OpenAI-compatible HTTP server for tests.

It speaks just enough of `POST /v1/chat/completions` for ChatOpenAI and the openai SDK:
plain and SSE streaming answers, usage, and tool calls (what `with_structured_output` asks
for, and a member's tools), streamed in the dialects real servers use (`ToolCalls`).

    async with OpenAITestServer() as server:
        server.script(Reply(chunks=["Hel", "lo"]), Fail(status=500))
        ...  # point a client at server.base_url
        assert server.requests[0].authorization == "Bearer sk-test"

Each request takes the next scripted step; once the script is empty the server echoes the
last user message (`echo: <text>`). A step is `Reply`, `ToolCall`, `ToolCalls`, `Fail` or
`Delay`.

`OpenAITestServer(refuse_schema=500)` answers every request that sends a JSON schema (a
`response_format` json_schema, or tools the model must call) with that HTTP error, as
llama.cpp servers refuse schemas (llama-cpp-python's server answers a json_schema
response format with 500, and fails to parse the grammar of a long-bounded tool schema),
without using a scripted step; JSON mode (`json_object`) and plain requests are served.

`OpenAITestServer(refuse_stream_tools=500)` answers every streamed request with tools with
that HTTP error, as llama.cpp servers before streamed tool calls did ("Cannot use tools with
stream"), without using a scripted step; the same request unstreamed is served.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web


@dataclass(frozen=True)
class Reply:
    """A text answer; streamed as `chunks` (default: `text` split after each word)."""

    text: str = ""
    chunks: tuple[str, ...] | list[str] | None = None
    finish_reason: str = "stop"
    usage: tuple[int, int] | None = None
    """(prompt_tokens, completion_tokens); default: words in the prompt, chunks sent."""
    token_delay_s: float | None = None
    """Pause before each streamed chunk; default: the server's `token_delay_s`."""
    broken_after: int | None = None
    """Streamed: after this many chunks, one frame that is not JSON, and the end."""
    cut_after: int | None = None
    """Streamed: after this many chunks the response just ends (cleanly, as HTTP goes):
    no finish_reason and no `[DONE]`, as when a server or proxy dies mid-answer."""
    reset_after: int | None = None
    """Streamed: after this many chunks the connection is dropped mid-body (no final
    chunk of the chunked encoding), as when a server process is killed."""
    reports_usage: bool = True
    """False: the server sends no usage at all, even when the request asks for it."""

    def pieces(self) -> list[str]:
        return list(self.chunks) if self.chunks is not None else re.findall(r"\S+\s*", self.text)


@dataclass(frozen=True)
class ToolCall:
    """A tool call answer; `name` defaults to the tool the request's `tool_choice` forces."""

    arguments: dict[str, Any] | str = field(default_factory=dict)
    name: str | None = None
    usage: tuple[int, int] | None = None


Dialect = Literal["openai", "llamacpp-old", "whole", "index0"]
"""How a server streams tool calls:

- `openai`: a call's first delta has `id`, `type` and `function.name` with arguments "",
  then argument fragments follow (`index` and `function.arguments` only);
- `llamacpp-old`: llama.cpp before ggml-org/llama.cpp#13800: the id inside `function`, the
  whole name repeated in every delta, no `type`;
- `whole`: each call whole in one delta (Ollama);
- `index0`: each call whole in one delta, all at `index` 0, told apart by their ids
  (ollama/ollama#15457).
"""


@dataclass(frozen=True)
class Call:
    """One call of a `ToolCalls` answer; `call_id` "" sends none (some templates give none)."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    call_id: str = ""

    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class ToolCalls:
    """An answer of tool calls (after `text`, when the model says something first),
    streamed in `dialect`, arguments in fragments of `fragment` characters."""

    calls: tuple[Call, ...]
    dialect: Dialect = "openai"
    text: str = ""
    finish_reason: str = "tool_calls"
    usage: tuple[int, int] | None = None
    fragment: int = 8
    cut_after: int | None = None
    """Streamed: after this many chunks the response just ends (see `Reply.cut_after`)."""

    def deltas(self) -> list[dict[str, Any]]:
        """The streamed deltas: the text's words, then the calls in the dialect."""
        out: list[dict[str, Any]] = [
            {"content": piece} for piece in re.findall(r"\S+\s*", self.text)
        ]
        for index, call in enumerate(self.calls):
            args = call.arguments_json()
            pieces = [args[i : i + self.fragment] for i in range(0, len(args), self.fragment)]
            ident = {"id": call.call_id} if call.call_id else {}
            whole = {**ident, "type": "function"}
            if self.dialect == "openai":
                function = {"name": call.name, "arguments": ""}
                out.append({"tool_calls": [{"index": index, **whole, "function": function}]})
                out += [
                    {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                    for piece in pieces
                ]
            elif self.dialect == "llamacpp-old":
                out += [
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "function": {**ident, "name": call.name, "arguments": piece},
                            }
                        ]
                    }
                    for piece in pieces or [""]
                ]
            else:
                at = 0 if self.dialect == "index0" else index
                function = {"name": call.name, "arguments": args}
                out.append({"tool_calls": [{"index": at, **whole, "function": function}]})
        return out

    def message(self) -> dict[str, Any]:
        """The whole assistant message, as a server answers without streaming."""
        return {
            "role": "assistant",
            "content": self.text or None,
            "tool_calls": [
                {
                    **({"id": call.call_id} if call.call_id else {}),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json()},
                }
                for call in self.calls
            ],
        }


@dataclass(frozen=True)
class Fail:
    """An HTTP error with an OpenAI-style error body carrying `message`."""

    status: int
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Delay:
    """Waits `seconds` before sending any byte, then answers with `then` (default reply)."""

    seconds: float
    then: Reply | ToolCall | ToolCalls | Fail | None = None


Step = Reply | ToolCall | ToolCalls | Fail | Delay


@dataclass
class RecordedRequest:
    """One request as the server saw it."""

    body: dict[str, Any]
    authorization: str | None
    at: float = field(default_factory=time.monotonic)
    """When the request arrived (time.monotonic)."""
    chunks_sent: int = 0
    """Streamed `chat.completion.chunk`s written so far."""
    disconnected: bool = False
    """The client went away before the answer was complete."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))


class OpenAITestServer:
    """Serves `/v1/chat/completions` on 127.0.0.1 (a free port) inside `async with`."""

    def __init__(
        self,
        *,
        token_delay_s: float = 0.0,
        refuse_schema: int | None = None,
        refuse_stream_tools: int | None = None,
    ) -> None:
        self.token_delay_s = token_delay_s
        self.refuse_schema = refuse_schema
        """HTTP status answered to a request carrying a JSON schema; None serves it."""
        self.refuse_stream_tools = refuse_stream_tools
        """HTTP status answered to a streamed request with tools; None serves it."""
        self.requests: list[RecordedRequest] = []
        self.disconnected = asyncio.Event()
        """Set when any client drops a request mid-answer."""
        self._script: deque[Step] = deque()
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def script(self, *steps: Step) -> None:
        """Queues answers for the next requests, in order."""
        self._script.extend(steps)

    async def __aenter__(self) -> OpenAITestServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        # handler_cancellation: a client hanging up cancels its handler, as in real servers.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        record = RecordedRequest(body, request.headers.get("Authorization"))
        self.requests.append(record)
        if self.refuse_schema is not None and _sends_schema(body):
            # The OpenAI error shape; the words llama.cpp logs for a grammar it cannot parse.
            error = {"code": self.refuse_schema, "message": GRAMMAR_REFUSAL, "type": "server_error"}
            return web.json_response({"error": error}, status=self.refuse_schema)
        if self.refuse_stream_tools is not None and body.get("stream") and body.get("tools"):
            error = {
                "code": self.refuse_stream_tools,
                "message": STREAM_TOOLS_REFUSAL,
                "type": "server_error",
            }
            return web.json_response({"error": error}, status=self.refuse_stream_tools)
        step: Step | None = self._script.popleft() if self._script else None
        try:
            if isinstance(step, Delay):
                await asyncio.sleep(step.seconds)
                step = step.then
            if step is None:
                last_user = [m for m in record.messages if m.get("role") == "user"][-1:]
                step = Reply(text="echo: " + (last_user[0]["content"] if last_user else ""))
            if isinstance(step, Fail):
                error = {"message": step.message, "type": "scripted_error", "code": None}
                return web.json_response({"error": error}, status=step.status, headers=step.headers)
            if body.get("stream"):
                return await self._stream(request, record, step)
            return web.json_response(_completion(body, step))
        except (asyncio.CancelledError, ConnectionResetError):
            record.disconnected = True
            self.disconnected.set()
            raise

    async def _stream(
        self, request: web.Request, record: RecordedRequest, step: Reply | ToolCall | ToolCalls
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        body = record.body
        delay = self.token_delay_s
        deltas: Iterable[dict[str, Any]]
        if isinstance(step, Reply):
            # Lazily: a scripted reply of megabytes is only built as far as it is read.
            deltas = ({"content": piece} for piece in step.pieces())
            finish = step.finish_reason
            delay = step.token_delay_s if step.token_delay_s is not None else delay
        elif isinstance(step, ToolCalls):
            deltas = step.deltas()
            finish = step.finish_reason
        else:
            call = _tool_call(body, step)
            args = call["function"]["arguments"]
            call["function"]["arguments"] = ""
            # Arguments arrive in fragments, as real servers send them.
            fragments = [args[i : i + 8] for i in range(0, len(args), 8)]
            deltas = [
                {"tool_calls": [{"index": 0, **call}]},
                *({"tool_calls": [{"index": 0, "function": {"arguments": f}}]} for f in fragments),
            ]
            finish = "tool_calls"
        reports_usage = step.reports_usage if isinstance(step, Reply) else True
        usage = reports_usage and (body.get("stream_options") or {}).get("include_usage")
        frames = itertools.chain(
            [_chunk(body, {"role": "assistant", "content": ""}, None)],
            (_chunk(body, delta, None) for delta in deltas),
            [_chunk(body, {}, finish)],
            [{**_chunk(body, {}, None), "choices": [], "usage": _usage(body, step)}]
            if usage
            else [],
        )
        reply = step if isinstance(step, Reply) else Reply()
        if isinstance(step, ToolCalls):
            reply = Reply(cut_after=step.cut_after)
        for frame in frames:
            if delay:
                await asyncio.sleep(delay)
            if record.chunks_sent == reply.broken_after:
                await response.write(b'data: {"choices": [{"delta": {"content": "tru\n\n')
                await response.write_eof()
                return response
            if record.chunks_sent == reply.cut_after:
                await response.write_eof()
                return response
            if record.chunks_sent == reply.reset_after:
                assert request.transport is not None
                request.transport.abort()
                return response
            await response.write(f"data: {json.dumps(frame)}\n\n".encode())
            record.chunks_sent += 1
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


GRAMMAR_REFUSAL = "failed to parse grammar"
"""What llama.cpp's server says when the grammar built from a schema does not parse."""

STREAM_TOOLS_REFUSAL = "Cannot use tools with stream"
"""What llama.cpp's server said to a streamed request with tools before it streamed them."""


def _sends_schema(body: dict[str, Any]) -> bool:
    """Whether the request asks for output constrained by a JSON schema: a json_schema
    response format, or tools (a forced tool call's arguments follow its schema)."""
    response_format = body.get("response_format") or {}
    return response_format.get("type") == "json_schema" or bool(body.get("tools"))


def _chunk(body: dict[str, Any], delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    return {**_envelope(body, "chat.completion.chunk"), "choices": [choice]}


def _completion(body: dict[str, Any], step: Reply | ToolCall | ToolCalls) -> dict[str, Any]:
    if isinstance(step, Reply):
        message: dict[str, Any] = {
            "role": "assistant",
            "content": step.text or "".join(step.pieces()),
        }
        finish = step.finish_reason
    elif isinstance(step, ToolCalls):
        message = step.message()
        finish = step.finish_reason
    else:
        message = {"role": "assistant", "content": None, "tool_calls": [_tool_call(body, step)]}
        finish = "tool_calls"
    choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
    completion = {**_envelope(body, "chat.completion"), "choices": [choice]}
    if not isinstance(step, Reply) or step.reports_usage:
        completion["usage"] = _usage(body, step)
    return completion


def _envelope(body: dict[str, Any], kind: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": kind,
        "created": int(time.time()),
        "model": body["model"],
    }


def _tool_call(body: dict[str, Any], step: ToolCall) -> dict[str, Any]:
    name = step.name
    if name is None:
        choice = body.get("tool_choice")
        forced = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        name = forced or body["tools"][0]["function"]["name"]
    args = step.arguments if isinstance(step.arguments, str) else json.dumps(step.arguments)
    return {"id": "call_test", "type": "function", "function": {"name": name, "arguments": args}}


def _usage(body: dict[str, Any], step: Reply | ToolCall | ToolCalls) -> dict[str, int]:
    if step.usage is not None:
        prompt, completion = step.usage
    else:
        words = " ".join(str(m.get("content") or "") for m in body.get("messages", []))
        prompt = len(words.split())
        if isinstance(step, Reply):
            completion = len(step.pieces())
        elif isinstance(step, ToolCalls):
            completion = len(step.deltas())
        else:
            completion = 1
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def generic_openai_provider() -> Any:
    """A `LangChainProvider` named `openai` over a plain streaming `ChatOpenAI`: the generic
    path any LangChain model takes (`bind_tools`), not `OpenAICompatProvider`'s own."""
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr
    from roundtable.models.langchain_provider import LangChainProvider

    return LangChainProvider(
        "openai",
        lambda target, _key: ChatOpenAI(
            model=target.model,
            base_url=target.base_url,
            api_key=SecretStr("none"),
            max_retries=0,
            streaming=True,
            stream_usage=True,
        ),
    )
