"""Tool calls through the OpenAI-compatible provider, over real HTTP against the scripted
server: the tools sent, the calls read back in every dialect servers stream them in, tool
results in the prompt, and the fallback for servers that refuse tools in a stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from roundtable.domain.errors import ModelError, ModelRateLimited, ModelRejected, ModelUnavailable
from roundtable.domain.snapshot import ModelRef, ModelTarget
from roundtable.harness.chain import Harness
from roundtable.harness.policies import HarnessPolicy, RetryPolicy
from roundtable.harness.request import CallMeta, ModelRequest
from roundtable.models.base import ChatCall, ChatMessage, ChatResult, ModelToolCall, ToolSpec
from roundtable.models.openai_compat import build_openai_provider
from support.openai_server import (
    Call,
    Dialect,
    Fail,
    OpenAITestServer,
    Reply,
    ToolCalls,
    generic_openai_provider,
)

API_KEY = "sk-test-4f9c2b7e1d"
PROMPT = "What is the weather in Paris?"
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "note": {"type": "string"}},
    "required": ["city"],
}
WEATHER = ToolSpec("weather", "The weather in a city", json.dumps(WEATHER_SCHEMA))
CLOCK = ToolSpec("clock", "", '{"type": "object", "properties": {}}')
PARIS = {"city": "Paris", "note": "x" * 40}


@pytest.fixture
async def server() -> AsyncIterator[OpenAITestServer]:
    async with OpenAITestServer() as srv:
        yield srv


def _target(server: OpenAITestServer) -> ModelTarget:
    return ModelTarget(provider="openai", model="qwen-test", base_url=server.base_url)


def _call(*messages: ChatMessage, max_tokens: int = 512) -> ChatCall:
    prompt = messages or (ChatMessage("system", "Be brief."), ChatMessage("user", PROMPT))
    return ChatCall(messages=prompt, tools=(WEATHER, CLOCK), max_tokens=max_tokens)


async def _complete(
    server: OpenAITestServer, call: ChatCall | None = None, on_text: list[str] | None = None
) -> ChatResult:
    provider = build_openai_provider(default_timeout_s=10.0)
    sink = on_text.append if on_text is not None else None
    return await provider.complete(_target(server), call or _call(), api_key=API_KEY, on_text=sink)


@pytest.mark.parametrize("dialect", ["openai", "llamacpp-old", "whole"])
async def test_a_streamed_call_is_read_whole_in_each_dialect(
    server: OpenAITestServer, dialect: Dialect
) -> None:
    server.script(
        ToolCalls(
            (Call("weather", PARIS, call_id="call_1"),),
            dialect=dialect,
            text="Let me look. ",
            usage=(20, 9),
        )
    )
    streamed: list[str] = []

    result = await _complete(server, on_text=streamed)

    assert result.tool_calls == (ModelToolCall("call_1", "weather", json.dumps(PARIS)),)
    assert streamed == ["Let ", "me ", "look. "], "what the model says beside a call streams"
    assert result.text == "Let me look. "
    assert result.finish_reason == "tool_calls"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (20, 9)
    assert result.model == "openai/qwen-test"


@pytest.mark.parametrize("dialect", ["openai", "whole", "index0"])
async def test_parallel_calls_are_kept_apart_even_at_one_index(
    server: OpenAITestServer, dialect: Dialect
) -> None:
    calls = (
        Call("weather", {"city": "Paris"}, call_id="call_a"),
        Call("weather", {"city": "Rome"}, call_id="call_b"),
        Call("clock", {}, call_id="call_c"),
    )
    server.script(ToolCalls(calls, dialect=dialect))

    result = await _complete(server)

    assert result.tool_calls == (
        ModelToolCall("call_a", "weather", '{"city": "Paris"}'),
        ModelToolCall("call_b", "weather", '{"city": "Rome"}'),
        ModelToolCall("call_c", "clock", "{}"),
    )


@pytest.mark.parametrize("dialect", ["openai", "llamacpp-old", "whole"])
async def test_a_call_without_an_id_has_an_empty_call_id(
    server: OpenAITestServer, dialect: Dialect
) -> None:
    server.script(ToolCalls((Call("weather", '{"city":"Oslo"}'),), dialect=dialect))

    result = await _complete(server)

    assert result.tool_calls == (ModelToolCall("", "weather", '{"city":"Oslo"}'),)


async def test_arguments_come_back_exactly_as_the_model_gave_them(
    server: OpenAITestServer,
) -> None:
    # Not valid JSON, and oddly spaced: the pipeline validates; the provider only reads.
    server.script(ToolCalls((Call("weather", '{ "city" :"Par', call_id="c"),), fragment=3))

    result = await _complete(server)

    assert result.tool_calls == (ModelToolCall("c", "weather", '{ "city" :"Par'),)


async def test_the_request_sends_the_tools_as_openai_function_definitions(
    server: OpenAITestServer,
) -> None:
    call = ChatCall(
        messages=(ChatMessage("user", PROMPT),), tools=(WEATHER, CLOCK), temperature=0.0
    )
    await _complete(server, call)

    (request,) = server.requests
    body = request.body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": WEATHER_SCHEMA,
                "description": "The weather in a city",
            },
        },
        {
            "type": "function",
            "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["model"] == "qwen-test"
    assert body["max_completion_tokens"] == 512
    assert body["temperature"] == 0.0
    assert body["messages"] == [{"role": "user", "content": PROMPT}]
    assert request.authorization == f"Bearer {API_KEY}"


async def test_a_model_that_answers_in_words_has_no_tool_calls(server: OpenAITestServer) -> None:
    server.script(Reply(chunks=["It ", "is ", "sunny."]))
    streamed: list[str] = []

    result = await _complete(server, on_text=streamed)

    assert (result.text, result.tool_calls, result.finish_reason) == ("It is sunny.", (), "stop")
    assert streamed == ["It ", "is ", "sunny."]


async def test_the_follow_up_carries_the_calls_and_their_results_in_openai_format(
    server: OpenAITestServer,
) -> None:
    server.script(
        ToolCalls(
            (
                Call("weather", '{"city":"Paris"}', call_id="call_1"),
                Call("clock", "{}", call_id="call_2"),
            ),
            text="Checking.",
        ),
        Reply(text="Sunny, 21 degrees, at noon."),
    )
    first = await _complete(server)
    prompt = (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", PROMPT),
        ChatMessage("assistant", first.text, tool_calls=first.tool_calls),
        ChatMessage("tool", '{"sky": "sunny", "celsius": 21}', tool_call_id="call_1"),
        ChatMessage("tool", "12:00", tool_call_id="call_2"),
    )

    second = await _complete(server, _call(*prompt))

    assert second.text == "Sunny, 21 degrees, at noon."
    assert second.tool_calls == ()
    assert server.requests[1].messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": PROMPT},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    # Exactly as the model gave them, not re-serialised.
                    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "clock", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny", "celsius": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    ]


async def test_an_assistant_message_of_calls_alone_has_null_content(
    server: OpenAITestServer,
) -> None:
    calls = (ModelToolCall("k1", "clock", "{}"),)
    prompt = (
        ChatMessage("user", PROMPT),
        ChatMessage("assistant", "", tool_calls=calls),
        ChatMessage("tool", "12:00", tool_call_id="k1"),
    )
    await _complete(server, _call(*prompt))

    assistant = server.requests[0].messages[1]
    assert assistant["content"] is None
    assert assistant["tool_calls"][0]["id"] == "k1"


@pytest.mark.parametrize("status", [500, 400])
async def test_a_server_refusing_tools_in_a_stream_is_asked_without_and_remembered(
    status: int,
) -> None:
    async with OpenAITestServer(refuse_stream_tools=status) as old:
        old.script(
            ToolCalls((Call("weather", PARIS, call_id="call_1"),), text="One moment."),
            ToolCalls((Call("clock", "{}", call_id="call_2"),)),
        )
        provider = build_openai_provider()
        streamed: list[str] = []
        first = await provider.complete(
            _target(old), _call(), api_key=API_KEY, on_text=streamed.append
        )
        second = await provider.complete(_target(old), _call(), api_key=API_KEY, on_text=None)
        plain = await provider.complete(
            _target(old),
            ChatCall(messages=(ChatMessage("user", "hi"),)),
            api_key=None,
            on_text=None,
        )

    assert first.tool_calls == (ModelToolCall("call_1", "weather", json.dumps(PARIS)),)
    assert (first.text, streamed) == ("One moment.", ["One moment."]), "the text in one piece"
    assert first.finish_reason == "tool_calls"
    assert first.usage.output_tokens > 0 and not first.usage.counted
    assert second.tool_calls == (ModelToolCall("call_2", "clock", "{}"),)
    assert plain.text == "echo: hi", "calls without tools still stream"
    assert [r.body.get("stream", False) for r in old.requests] == [True, False, False, True]


async def test_a_refused_stream_whose_unstreamed_retry_fails_raises_that_and_is_not_remembered() -> (
    None
):
    async with OpenAITestServer(refuse_stream_tools=500) as old:
        old.script(Fail(status=503), ToolCalls((Call("clock", "{}", call_id="c"),)))
        provider = build_openai_provider()
        with pytest.raises(ModelUnavailable) as caught:
            await provider.complete(_target(old), _call(), api_key=API_KEY, on_text=None)
        assert caught.value.http_status == 503
        assert caught.value.__context__ is None
        assert caught.value.__cause__ is None
        await provider.complete(_target(old), _call(), api_key=API_KEY, on_text=None)

    assert [r.body.get("stream", False) for r in old.requests] == [True, False, True, False]


@pytest.mark.parametrize(
    ("status", "kind", "requests"),
    [
        (503, ModelUnavailable, 1),
        (429, ModelRateLimited, 1),
        (401, ModelRejected, 1),
        (400, ModelRejected, 2),  # perhaps "not in a stream": asked once more, unstreamed
    ],
)
async def test_other_errors_map_as_ever_without_leaking(
    server: OpenAITestServer, status: int, kind: type[ModelError], requests: int
) -> None:
    leak = f"bad key {API_KEY} for prompt {PROMPT}"
    server.script(Fail(status=status, message=leak), Fail(status=status, message=leak))

    with pytest.raises(kind) as caught:
        await _complete(server)

    error = caught.value
    assert error.http_status == status
    text = f"{error!s} {error!r}"
    assert API_KEY not in text and PROMPT not in text
    assert error.__context__ is None and error.__cause__ is None
    assert len(server.requests) == requests, "only a status that may refuse a stream retries"


async def test_arguments_count_toward_the_output_budget_and_a_spent_one_stops_the_stream() -> None:
    # 40 argument fragments against a budget of 10 tokens: the server ignores max_tokens.
    long = {"city": "Paris", "note": "y" * 300}
    async with OpenAITestServer(token_delay_s=0.01) as server:
        server.script(ToolCalls((Call("weather", long, call_id="c"),), text="Well, "))
        streamed: list[str] = []

        result = await _complete(server, _call(max_tokens=10), on_text=streamed)

        await asyncio.wait_for(server.disconnected.wait(), 2.0)
        assert server.requests[0].chunks_sent < 20
    assert result.finish_reason == "length"
    assert result.tool_calls == (), "a call cut at the budget is no call"
    assert (result.text, streamed) == ("Well, ", ["Well, "])
    assert result.usage.output_tokens == 10 and result.usage.counted, "no usage came: counted"


async def test_a_tool_stream_cut_before_its_finish_reason_is_a_retryable_failure(
    server: OpenAITestServer,
) -> None:
    server.script(ToolCalls((Call("weather", PARIS, call_id="c"),), cut_after=4))

    with pytest.raises(ModelUnavailable) as caught:
        await _complete(server)

    assert "cut off" in caught.value.detail and caught.value.retryable


async def test_cancelling_a_tool_call_aborts_the_http_stream() -> None:
    async with OpenAITestServer(token_delay_s=0.02) as server:
        server.script(ToolCalls((Call("clock", "{}", call_id="c"),), text="w " * 100))
        seen: list[str] = []
        two_seen = asyncio.Event()

        def on_text(text: str) -> None:
            seen.append(text)
            if len(seen) >= 2:
                two_seen.set()

        provider = build_openai_provider()
        task = asyncio.create_task(
            provider.complete(_target(server), _call(), api_key=API_KEY, on_text=on_text)
        )
        await asyncio.wait_for(two_seen.wait(), 5.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        await asyncio.wait_for(server.disconnected.wait(), 2.0)
        sent = server.requests[0].chunks_sent
        await asyncio.sleep(0.1)
        assert server.requests[0].chunks_sent == sent < 100


async def test_tool_calls_come_through_the_harness(server: OpenAITestServer) -> None:
    server.script(Fail(status=503), ToolCalls((Call("clock", "{}", call_id="c"),)))
    harness = Harness(
        {"openai": build_openai_provider()},
        policy=HarnessPolicy(retry=RetryPolicy(initial_backoff_s=0.001)),
    )
    meta = CallMeta(thread_id="t", run_id="r", request_id="q", tenant="a", caller_node="n")
    request = ModelRequest(ref=ModelRef(target=_target(server)), call=_call(), meta=meta)

    result = await harness.call(request)

    assert result.tool_calls == (ModelToolCall("c", "clock", "{}"),)
    assert result.attempts == 2


@pytest.mark.parametrize("path", ["sdk", "langchain"])
async def test_a_long_streamed_argument_is_not_silence(path: str) -> None:
    # Review of the silence timeout: only text reset it, so a model writing a long tool
    # argument (a file's content, say) at a steady pace was cut as silent once the
    # argument took longer than the timeout, asked again from the start, and failed.
    async with OpenAITestServer(token_delay_s=0.02) as server:
        long_note = {"city": "Paris", "note": "y" * 400}  # ≈55 frames: ≈1.1 s at 20 ms
        server.script(ToolCalls((Call("weather", long_note, call_id="c1"),)))
        provider = build_openai_provider() if path == "sdk" else generic_openai_provider()
        harness = Harness(
            {"openai": provider}, policy=HarnessPolicy(retry=RetryPolicy(max_retries=0))
        )
        meta = CallMeta(thread_id="t", run_id="r", request_id="q", tenant="a", caller_node="n")
        ref = ModelRef(target=_target(server), timeout_s=0.25)
        streamed: list[str] = []
        request = ModelRequest(ref=ref, call=_call(), meta=meta, on_text=streamed.append)

        result = await harness.call(request)

    assert result.tool_calls == (ModelToolCall("c1", "weather", json.dumps(long_note)),)
    assert (result.attempts, streamed) == (1, [])
    assert result.usage.output_tokens > 0
