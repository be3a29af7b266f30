"""The LangChain adapter reads text, usage and the finish reason from whichever chunks carry them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from roundtable.domain.errors import ModelUnavailable
from roundtable.domain.snapshot import ModelTarget
from roundtable.models.base import CHARS_PER_TOKEN_BOUND, ChatCall, ChatMessage
from roundtable.models.langchain_provider import LangChainProvider

TARGET = ModelTarget(provider="scripted", model="m")
CALL = ChatCall(messages=(ChatMessage("user", "hello"),))


def usage(i: int, o: int) -> UsageMetadata:
    return UsageMetadata(input_tokens=i, output_tokens=o, total_tokens=i + o)


class Scripted(BaseChatModel):
    """Streams the chunks it is given."""

    chunks: list[AIMessageChunk]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self.chunks:
            yield ChatGenerationChunk(message=chunk)


async def test_text_blocks_usage_in_pieces_and_a_finish_reason_before_the_end() -> None:
    chunks = [
        AIMessageChunk(content="Hel"),
        # Content blocks (as some providers stream them): only text blocks are text.
        AIMessageChunk(
            content=[{"type": "text", "text": "lo, "}, {"type": "tool_call_chunk", "args": "{"}]
        ),
        AIMessageChunk(content="world", usage_metadata=usage(7, 2)),
        AIMessageChunk(content="", response_metadata={"finish_reason": "length"}),
        AIMessageChunk(content="", usage_metadata=usage(0, 1), response_metadata={"x": 1}),
    ]
    provider = LangChainProvider("scripted", lambda _t, _k: Scripted(chunks=chunks))
    streamed: list[str] = []
    result = await provider.complete(TARGET, CALL, api_key=None, on_text=streamed.append)
    assert streamed == ["Hel", "lo, ", "world"]
    assert result.text == "Hello, world"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (7, 3)
    assert result.finish_reason == "length"
    assert result.model == "scripted/m"


async def test_a_model_that_says_nothing_of_usage_or_reason() -> None:
    provider = LangChainProvider(
        "scripted", lambda _t, _k: Scripted(chunks=[AIMessageChunk(content="ok")])
    )
    result = await provider.complete(TARGET, CALL, api_key=None, on_text=None)
    assert (result.text, result.finish_reason) == ("ok", "stop")
    # No usage reported: the output is counted, a streamed chunk as a token, and says so.
    assert (result.usage.input_tokens, result.usage.output_tokens) == (0, 1)
    assert result.usage.counted


async def test_a_stream_past_its_budget_is_cut_at_the_tokens_or_the_characters() -> None:
    many = [AIMessageChunk(content="w ") for _ in range(100)]
    huge = [AIMessageChunk(content="x" * 100_000)]
    call = ChatCall(messages=CALL.messages, max_tokens=4)
    for chunks, text in ((many, "w " * 4), (huge, "x" * 4 * CHARS_PER_TOKEN_BOUND)):
        provider = LangChainProvider("scripted", lambda _t, _k, c=chunks: Scripted(chunks=c))
        result = await provider.complete(TARGET, call, api_key=None, on_text=None)
        assert (result.text, result.finish_reason) == (text, "length")


async def test_a_stream_without_its_finish_reason_is_a_retryable_failure() -> None:
    provider = LangChainProvider(
        "scripted",
        lambda _t, _k: Scripted(chunks=[AIMessageChunk(content="half")]),
        stream_ends_with_finish_reason=True,
    )
    with pytest.raises(ModelUnavailable) as caught:
        await provider.complete(TARGET, CALL, api_key=None, on_text=None)
    assert caught.value.retryable
