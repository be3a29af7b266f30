"""Tool calls against the real llama-server (SmolLM2-135M, scripts/smollm2-tools.jinja): the
openai provider sends a tool, reads back the call the model streams, and sends the result
in the follow-up, which the model answers.

A 135M model does not call a tool on its own from a description alone; shown one call and
its result earlier in the conversation (which also sends an assistant tool call and a tool
message in OpenAI's format), it calls the tool for the next question at temperature 0.
"""

from __future__ import annotations

import json
import logging

import pytest
from roundtable.domain.errors import ModelUnavailable
from roundtable.domain.snapshot import ModelTarget
from roundtable.models.base import ChatCall, ChatMessage, ModelToolCall, ToolSpec
from roundtable.models.openai_compat import build_openai_provider
from support.llama_server import LlamaServer

pytestmark = pytest.mark.real_model

WEATHER = ToolSpec(
    "weather",
    "The current weather in a city",
    json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
)
EARLIER = (
    ChatMessage("system", "You answer questions about the weather by calling the weather tool."),
    ChatMessage("user", "What is the weather in Rome?"),
    ChatMessage(
        "assistant", "", tool_calls=(ModelToolCall("call_1", "weather", '{"city": "Rome"}'),)
    ),
    ChatMessage("tool", '{"sky": "cloudy"}', tool_call_id="call_1"),
    ChatMessage("assistant", "It is cloudy in Rome."),
)


async def complete_once_more(provider, *args, **kwargs):  # type: ignore[no-untyped-def]
    """One provider call, asked once more after a connection llama-server closed as it was
    reused (seen once in CI): the harness retries that in the product; this test calls the
    provider below the harness."""
    try:
        return await provider.complete(*args, **kwargs)
    except ModelUnavailable:
        return await provider.complete(*args, **kwargs)


async def test_the_model_calls_a_tool_and_answers_with_its_result(
    llama_server: LlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="roundtable.models")
    provider = build_openai_provider(default_timeout_s=120.0)
    target = ModelTarget(
        provider="openai", model=llama_server.model, base_url=llama_server.base_url
    )
    question = (*EARLIER, ChatMessage("user", "What is the weather in Paris?"))

    asked = await complete_once_more(
        provider,
        target,
        ChatCall(messages=question, tools=(WEATHER,), max_tokens=64, temperature=0.0),
        api_key=None,
        on_text=None,
    )

    print(f"\nfirst: {asked}")
    assert asked.finish_reason == "tool_calls"
    (call,) = asked.tool_calls
    assert call.name == "weather"
    assert json.loads(call.arguments_json) == {"city": "Paris"}
    assert call.call_id, "llama-server gives every call an id"
    assert asked.usage.output_tokens > 0 and not asked.usage.counted

    streamed: list[str] = []
    answered = await complete_once_more(
        provider,
        target,
        ChatCall(
            messages=(
                *question,
                ChatMessage("assistant", asked.text, tool_calls=asked.tool_calls),
                ChatMessage("tool", '{"sky": "sunny"}', tool_call_id=call.call_id),
            ),
            tools=(WEATHER,),
            max_tokens=64,
            temperature=0.0,
        ),
        api_key=None,
        on_text=streamed.append,
    )

    print(f"then: {answered}")
    assert answered.tool_calls == ()
    assert answered.finish_reason == "stop"
    assert "sunny" in answered.text.lower(), "the tool's result reached the model"
    assert "".join(streamed) == answered.text and len(streamed) > 1, "the answer streamed"
    assert "not streamed" not in caplog.text, "llama-server streams tool calls"
