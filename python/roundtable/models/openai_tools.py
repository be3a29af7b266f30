"""The OpenAI-compatible provider's calls with tools, made with the openai SDK's own client.

`OpenAICompatProvider` sends a call with tools past LangChain, through the SDK client its
`ChatOpenAI` built (so the same HTTP client, timeouts and `max_retries=0`): LangChain's
chunks drop the id llama.cpp's old dialect puts in `function.id`, and reading the SDK's own
chunks costs less (the numbers are on `OpenAICompatProvider`). This module holds that path:
the request body, the streamed reply, and the unstreamed one for a server that refuses tools
in a stream. The reply is bounded and finished by the same rules as any streamed reply
(models/streaming.py); its tool calls are assembled by `ToolCallAccumulator`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
from langchain_core.language_models import BaseChatModel

from roundtable.domain.errors import ModelError
from roundtable.domain.events import TokenUsage
from roundtable.domain.snapshot import ModelTarget
from roundtable.models.base import ChatCall, ChatResult, TextSink, heard
from roundtable.models.streaming import STOP_GRACE_CHUNKS, OutputBudget, finish_reply, stop_now
from roundtable.models.tool_calls import ToolCallAccumulator, openai_messages, openai_tools

STREAM_REFUSAL_STATUSES = frozenset({400, 422, 500, 501})
"""HTTP statuses with which a server may refuse tools in a streamed request: llama.cpp
before streamed tool calls (ggml-org/llama.cpp#12379) answers 500 ("Cannot use tools with
stream"); others say 400 or 422. Judged by status alone, never by the server's words."""


def tool_request(target: ModelTarget, call: ChatCall) -> dict[str, Any]:
    """The body of a chat completion request with tools (the stream options aside), its
    fields as `ChatOpenAI` sends them for the same call without tools."""
    request: dict[str, Any] = {
        "model": target.model,
        "messages": openai_messages(call.messages),
        "tools": openai_tools(call.tools),
    }
    if call.max_tokens:
        request["max_completion_tokens"] = call.max_tokens
    if call.temperature is not None:
        request["temperature"] = call.temperature
    return request


async def stream_tool_reply(
    client: openai.AsyncOpenAI,
    request: dict[str, Any],
    max_tokens: int,
    on_text: TextSink | None,
    name: str,
    *,
    ends_with_finish_reason: bool,
) -> ChatResult:
    """Streams a reply with the SDK's own chunks, as `LangChainProvider._stream` does
    with LangChain's: the same output budget, stop, finish reason and usage rules.

    `client` is the target's SDK client (`sdk_client`) and `request` the body
    (`tool_request`); `ends_with_finish_reason` is as for `finish_reply`.
    """
    parts: list[str] = []
    usage: TokenUsage | None = None
    finish_reason = ""
    budget = OutputBudget(max_tokens)
    calls = ToolCallAccumulator()
    stop = asyncio.timeout(None)
    try:
        async with stop:
            stream = await client.chat.completions.create(
                **request, stream=True, stream_options={"include_usage": True}
            )
            # `async with`: the response closes on every way out, a stop included.
            async with stream:
                async for chunk in stream:
                    if budget.spent:
                        budget.overrun += 1
                        if budget.overrun > STOP_GRACE_CHUNKS:
                            break
                        continue
                    reported = getattr(chunk, "usage", None)
                    if reported is not None:
                        usage = token_usage(reported)
                    for choice in getattr(chunk, "choices", None) or ():
                        delta = getattr(choice, "delta", None)
                        text = getattr(delta, "content", None)
                        if text:
                            text = budget.take(text)
                            if text:
                                parts.append(text)
                                if on_text is not None:
                                    on_text(text)
                        for piece in getattr(delta, "tool_calls", None) or ():
                            if budget.spent:
                                break
                            if budget.admits(_fragment_chars(piece)):
                                calls.add_openai(piece)
                                heard(on_text)
                        if budget.spent:
                            stop_now(stop)
                            break
                        reason = getattr(choice, "finish_reason", None)
                        if reason:
                            finish_reason = str(reason)
    except TimeoutError:
        if not stop.expired():
            raise  # not our stop: an outer deadline
    return finish_reply(
        parts,
        usage,
        finish_reason,
        budget,
        name,
        calls,
        ends_with_finish_reason=ends_with_finish_reason,
    )


async def unstreamed_tool_reply(
    client: openai.AsyncOpenAI,
    request: dict[str, Any],
    max_tokens: int,
    on_text: TextSink | None,
    name: str,
) -> ChatResult:
    """A reply with tools asked for without streaming: its text goes to `on_text` in one
    piece; the output budget bounds it as it bounds a stream."""
    completion = await client.chat.completions.create(**request)
    choices = getattr(completion, "choices", None) or ()
    message = getattr(choices[0], "message", None) if choices else None
    budget = OutputBudget(max_tokens)
    text = budget.take(getattr(message, "content", None) or "")
    if text and on_text is not None:
        on_text(text)
    calls = ToolCallAccumulator()
    for position, entry in enumerate(getattr(message, "tool_calls", None) or ()):
        if not budget.admits(_fragment_chars(entry)):
            break
        calls.add_openai(entry, index=position)
    reported = getattr(completion, "usage", None)
    finish_reason = str(getattr(choices[0], "finish_reason", None) or "") if choices else ""
    return finish_reply(
        [text],
        token_usage(reported) if reported is not None else None,
        finish_reason,
        budget,
        name,
        calls,
        ends_with_finish_reason=False,  # a whole response: nothing was cut off
    )


def _fragment_chars(piece: Any) -> int:
    """What a tool call (or a streamed fragment of one) counts against the output budget:
    its function name and arguments, as text."""
    function = getattr(piece, "function", None)
    return len(getattr(function, "name", None) or "") + len(
        getattr(function, "arguments", None) or ""
    )


def token_usage(reported: Any) -> TokenUsage:
    """The server's reported usage (`CompletionUsage`) as ours."""
    return TokenUsage(
        int(getattr(reported, "prompt_tokens", 0) or 0),
        int(getattr(reported, "completion_tokens", 0) or 0),
    )


def sdk_client(model: BaseChatModel) -> openai.AsyncOpenAI:
    """The openai SDK client a `ChatOpenAI` built (its HTTP client, timeouts and
    `max_retries=0` included).

    Raises:
        TypeError: `model` has no openai SDK client (it is not a `ChatOpenAI`).
    """
    client = getattr(model, "root_async_client", None)
    if not isinstance(client, openai.AsyncOpenAI):
        raise TypeError(f"{type(model).__name__} has no openai SDK client")
    return client


def stream_refusal(error: ModelError | None) -> ModelError | None:
    """The error, when it is the server answering a streamed request with tools with a
    status that may mean "not in a stream" (`STREAM_REFUSAL_STATUSES`); None otherwise."""
    if error is not None and error.http_status in STREAM_REFUSAL_STATUSES:
        return error
    return None
