"""The LangChain adapter reads text, usage, the finish reason and tool calls from whichever
chunks carry them, and converts tool calls and results in the prompt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    ToolCallChunk,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from pydantic import Field
from roundtable.domain.errors import ModelUnavailable
from roundtable.domain.snapshot import ModelTarget
from roundtable.models.base import (
    CHARS_PER_TOKEN_BOUND,
    ChatCall,
    ChatMessage,
    ModelToolCall,
    ToolSpec,
)
from roundtable.models.langchain_provider import LangChainProvider, to_langchain
from support.openai_server import Call, OpenAITestServer, Reply, ToolCalls, generic_openai_provider

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


class ScriptedWithTools(Scripted):
    """Streams its chunks, and records the tools it was bound to."""

    bound: list[Any] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        self.bound.extend(tools)
        return self.bind(tools=tools, **kwargs)


WEATHER = ToolSpec("weather", "The weather in a city", '{"type": "object"}')
TOOL_CALL = ChatCall(messages=CALL.messages, tools=(WEATHER,))


def tool_chunk(
    index: int | None, call_id: str | None, name: str | None, args: str
) -> AIMessageChunk:
    return AIMessageChunk(
        content="", tool_call_chunks=[ToolCallChunk(index=index, id=call_id, name=name, args=args)]
    )


async def test_tool_calls_are_assembled_from_the_chunks_and_the_tools_bound() -> None:
    chunks = [
        AIMessageChunk(content="Let me see. "),
        tool_chunk(0, "call_1", "weather", ""),
        tool_chunk(0, None, None, '{"city": '),
        tool_chunk(0, None, None, '"Paris"}'),
        # As LangChain reads llama.cpp's old dialect: the name again in every chunk, no id.
        tool_chunk(1, None, "weather", '{"city": '),
        tool_chunk(1, None, "weather", '"Rome"}'),
        AIMessageChunk(
            content="",
            usage_metadata=usage(9, 6),
            response_metadata={"finish_reason": "tool_calls"},
        ),
    ]
    model = ScriptedWithTools(chunks=chunks)
    provider = LangChainProvider("scripted", lambda _t, _k: model)
    streamed: list[str] = []

    result = await provider.complete(TARGET, TOOL_CALL, api_key=None, on_text=streamed.append)

    assert result.tool_calls == (
        ModelToolCall("call_1", "weather", '{"city": "Paris"}'),
        ModelToolCall("", "weather", '{"city": "Rome"}'),
    )
    assert (result.text, streamed) == ("Let me see. ", ["Let me see. "])
    assert result.finish_reason == "tool_calls"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (9, 6)
    assert model.bound == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": {"type": "object"},
                "description": "The weather in a city",
            },
        }
    ]


async def test_tool_call_fragments_count_toward_the_budget() -> None:
    chunks = [tool_chunk(0, "c", "weather", "")] + [
        tool_chunk(0, None, None, "x") for _ in range(9)
    ]
    chunks.append(AIMessageChunk(content="", response_metadata={"finish_reason": "tool_calls"}))
    provider = LangChainProvider("scripted", lambda _t, _k: ScriptedWithTools(chunks=chunks))
    call = ChatCall(messages=CALL.messages, tools=(WEATHER,), max_tokens=4)

    result = await provider.complete(TARGET, call, api_key=None, on_text=None)

    assert (result.finish_reason, result.tool_calls) == ("length", ())
    assert result.usage.output_tokens == 4 and result.usage.counted


def test_tool_calls_and_results_convert_to_langchain_messages() -> None:
    messages = to_langchain(
        (
            ChatMessage("user", "weather?"),
            ChatMessage(
                "assistant",
                "Checking.",
                tool_calls=(
                    ModelToolCall("k1", "weather", '{"city":"Paris"}'),
                    ModelToolCall("k2", "weather", '{"city": "Ro'),  # cut: not JSON
                ),
            ),
            ChatMessage("tool", "sunny", tool_call_id="k1"),
        )
    )

    assert isinstance(messages[0], HumanMessage)
    ai = messages[1]
    assert isinstance(ai, AIMessage) and ai.content == "Checking."
    assert [(c["id"], c["name"], c["args"]) for c in ai.tool_calls] == [
        ("k1", "weather", {"city": "Paris"})
    ]
    assert [(c["id"], c["name"], c["args"]) for c in ai.invalid_tool_calls] == [
        ("k2", "weather", '{"city": "Ro')
    ]
    tool = messages[2]
    assert isinstance(tool, ToolMessage)
    assert (tool.content, tool.tool_call_id) == ("sunny", "k1")


async def test_chat_openai_through_the_generic_provider_round_trips_tool_calls() -> None:
    # The generic path (bind_tools) with a real ChatOpenAI, as any LangChain model would go.
    async with OpenAITestServer() as server:
        server.script(
            ToolCalls((Call("weather", {"city": "Paris"}, call_id="call_1"),)),
            Reply(text="Sunny."),
        )
        provider = generic_openai_provider()
        target = ModelTarget(provider="openai", model="m", base_url=server.base_url)
        first = await provider.complete(target, TOOL_CALL, api_key=None, on_text=None)
        follow_up = ChatCall(
            messages=(
                *CALL.messages,
                ChatMessage("assistant", "", tool_calls=first.tool_calls),
                ChatMessage("tool", "sunny", tool_call_id="call_1"),
            ),
            tools=(WEATHER,),
        )
        second = await provider.complete(target, follow_up, api_key=None, on_text=None)

    assert first.tool_calls == (ModelToolCall("call_1", "weather", '{"city": "Paris"}'),)
    assert second.text == "Sunny."
    assert server.requests[0].body["tools"][0]["function"]["name"] == "weather"
    assert server.requests[1].messages[1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
