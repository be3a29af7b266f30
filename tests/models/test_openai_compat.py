"""The OpenAI-compatible provider over real HTTP, against a local scripted server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel, Field
from roundtable.domain.errors import (
    InvalidModelOutput,
    ModelError,
    ModelRateLimited,
    ModelRejected,
    ModelTimeout,
    ModelUnavailable,
)
from roundtable.domain.snapshot import ModelRef, ModelTarget
from roundtable.harness.chain import Harness
from roundtable.harness.policies import HarnessPolicy, RetryPolicy
from roundtable.harness.request import CallMeta, ModelRequest
from roundtable.models.base import ChatCall, ChatMessage, ChatResult
from roundtable.models.openai_compat import build_openai_provider, map_openai_error
from roundtable.models.structured import portable_schema
from support.openai_server import Delay, Fail, OpenAITestServer, RecordedRequest, Reply

API_KEY = "sk-test-4f9c2b7e1d"
PROMPT = "What is the capital of Atlantis?"


class Verdict(BaseModel):
    score: int
    reason: str


@pytest.fixture
async def server() -> AsyncIterator[OpenAITestServer]:
    async with OpenAITestServer() as srv:
        yield srv


def _target(server: OpenAITestServer) -> ModelTarget:
    return ModelTarget(provider="openai", model="qwen-test", base_url=server.base_url)


def _call(schema: type[BaseModel] | None = None) -> ChatCall:
    messages = (ChatMessage("system", "Be brief."), ChatMessage("user", PROMPT))
    return ChatCall(messages=messages, schema=schema)


async def _complete(
    server: OpenAITestServer,
    call: ChatCall | None = None,
    *,
    timeout_s: float = 10.0,
    on_text: list[str] | None = None,
) -> ChatResult:
    provider = build_openai_provider(default_timeout_s=timeout_s)
    sink = on_text.append if on_text is not None else None
    return await provider.complete(_target(server), call or _call(), api_key=API_KEY, on_text=sink)


async def test_streams_text_in_chunks_with_usage_and_model_name(server: OpenAITestServer) -> None:
    server.script(Reply(chunks=["The ", "capital ", "is ", "Poseidonis."], usage=(12, 4)))
    chunks: list[str] = []

    result = await _complete(server, on_text=chunks)

    assert chunks == ["The ", "capital ", "is ", "Poseidonis."]
    assert result.text == "The capital is Poseidonis."
    assert (result.usage.input_tokens, result.usage.output_tokens) == (12, 4)
    assert result.model == "openai/qwen-test"
    assert result.finish_reason == "stop"
    (request,) = server.requests
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert request.body["model"] == "qwen-test"
    assert request.messages[-1] == {"role": "user", "content": PROMPT}


async def test_sends_the_api_key_as_bearer_token(server: OpenAITestServer) -> None:
    await _complete(server)

    assert server.requests[0].authorization == f"Bearer {API_KEY}"


async def test_a_target_without_key_sends_a_placeholder(server: OpenAITestServer) -> None:
    provider = build_openai_provider()

    result = await provider.complete(_target(server), _call(), api_key=None, on_text=None)

    assert result.text == f"echo: {PROMPT}"
    authorization = server.requests[0].authorization
    assert authorization is not None and authorization.startswith("Bearer ")


async def test_structured_output_sends_a_portable_json_schema_and_parses_the_answer(
    server: OpenAITestServer,
) -> None:
    server.script(Reply(text='{"score": 7, "reason": "plausible"}'))

    result = await _complete(server, _call(schema=Verdict))

    assert result.parsed == Verdict(score=7, reason="plausible")
    body = server.requests[0].body
    assert "tools" not in body, "no forced tool call: servers without tool templates refuse it"
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "Verdict",
            "schema": {
                "properties": {"score": {"type": "integer"}, "reason": {"type": "string"}},
                "required": ["score", "reason"],
                "type": "object",
            },
            "strict": False,
        },
    }
    system = request_system(server.requests[0])
    assert system.startswith("Be brief.") and '"score"' in system, "the schema is in the prompt"


def request_system(request: RecordedRequest) -> str:
    """The system message of a recorded request (there is one, first)."""
    (first, *rest) = request.messages
    assert first["role"] == "system" and all(m["role"] != "system" for m in rest)
    return str(first["content"])


class Bounded(BaseModel):
    """Keywords llama.cpp's grammar cannot take (a repetition over 2,000), as in
    MemoryProposals, and others not every converter knows."""

    note: str = Field(max_length=4000, pattern="^[a-z ]*$")
    weight: float = Field(default=0.5, ge=0, le=1)
    limit: int | None = Field(default=None, ge=1)
    tags: list[Tag] = Field(default_factory=list)


class Tag(BaseModel):
    name: str = Field(max_length=32)  # short: kept, it stops a small model under a grammar


def test_the_portable_schema_inlines_refs_and_keeps_only_common_keywords() -> None:
    assert portable_schema(Bounded) == {
        "description": "Keywords llama.cpp's grammar cannot take (a repetition over 2,000), as in\n"
        "MemoryProposals, and others not every converter knows.",
        "properties": {
            "note": {"type": "string"},
            "weight": {"type": "number"},
            "limit": {"type": "integer"},
            "tags": {
                "items": {
                    "properties": {"name": {"type": "string", "maxLength": 32}},
                    "required": ["name"],
                    "type": "object",
                },
                "type": "array",
            },
        },
        "required": ["note"],
        "type": "object",
    }


async def test_the_bounds_left_out_of_the_schema_are_still_validated(
    server: OpenAITestServer,
) -> None:
    server.script(Reply(text='{"note": "ok", "weight": 7}'))

    with pytest.raises(InvalidModelOutput) as caught:
        await _complete(server, _call(schema=Bounded))

    assert caught.value.detail == "json_schema: answer did not match Bounded (weight)"


async def test_a_json_answer_in_a_fence_is_parsed_and_prose_is_invalid_output(
    server: OpenAITestServer,
) -> None:
    server.script(
        Reply(text='```json\n{"score": 3, "reason": "fenced"}\n```'),
        Reply(text=f"I think the score is 3 because {PROMPT}"),
    )

    assert (await _complete(server, _call(schema=Verdict))).parsed == Verdict(
        score=3, reason="fenced"
    )
    with pytest.raises(InvalidModelOutput) as caught:
        await _complete(server, _call(schema=Verdict))
    assert caught.value.detail == "json_schema: answer is not JSON"
    assert PROMPT not in str(caught.value), "the model's text is never in the error"


@pytest.mark.parametrize("status", [400, 500])
async def test_a_refused_schema_is_asked_again_in_json_mode_and_remembered(status: int) -> None:
    # llama.cpp answers a schema its grammar cannot take with HTTP 500 "failed to parse
    # grammar"; other servers say 400. Before the fix the call failed as MODEL_UNAVAILABLE.
    async with OpenAITestServer(refuse_schema=status) as refusing:
        refusing.script(
            Reply(text='{"score": 1, "reason": "json mode"}'),
            Reply(text='{"score": 2, "reason": "at once"}'),
        )
        provider = build_openai_provider()
        call = _call(schema=Verdict)
        first = await provider.complete(_target(refusing), call, api_key=API_KEY, on_text=None)
        second = await provider.complete(_target(refusing), call, api_key=API_KEY, on_text=None)

    assert first.parsed == Verdict(score=1, reason="json mode")
    assert second.parsed == Verdict(score=2, reason="at once")
    formats = [r.body["response_format"]["type"] for r in refusing.requests]
    assert formats == ["json_schema", "json_object", "json_object"], "refused once, remembered"
    assert '"score"' in request_system(refusing.requests[1]), "JSON mode gets the schema in words"


async def test_invalid_json_mode_output_after_a_refusal_is_a_model_error_naming_both() -> None:
    async with OpenAITestServer(refuse_schema=500) as refusing:
        refusing.script(Reply(text="no JSON here"))
        with pytest.raises(InvalidModelOutput) as caught:
            await _complete(refusing, _call(schema=Verdict))

    assert not caught.value.retryable, "a model error, not unavailability"
    assert caught.value.detail == (
        "json_object: answer is not JSON; the server refused the JSON schema (HTTP 500 Internal Server Error)"
    )


async def test_a_server_down_for_json_mode_too_is_unavailable_and_not_remembered() -> None:
    async with OpenAITestServer(refuse_schema=500) as refusing:
        refusing.script(Fail(status=503), Reply(text='{"score": 5, "reason": "back"}'))
        provider = build_openai_provider()
        call = _call(schema=Verdict)
        with pytest.raises(ModelUnavailable):
            await provider.complete(_target(refusing), call, api_key=API_KEY, on_text=None)
        assert [r.body["response_format"]["type"] for r in refusing.requests] == [
            "json_schema",
            "json_object",
        ]


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_a_server_not_ready_for_a_schema_call_is_unavailable_not_a_refusal(
    status: int,
) -> None:
    # Review: a 503 to a schema call was taken for a refusal of the schema: the call went
    # again at once in JSON mode, and the target's structured calls lost the schema for
    # ten minutes, every tenant's.
    async with OpenAITestServer() as server:
        server.script(Fail(status=status), Reply(text='{"score": 4, "reason": "back"}'))
        provider = build_openai_provider()
        call = _call(schema=Verdict)
        with pytest.raises(ModelUnavailable):
            await provider.complete(_target(server), call, api_key=API_KEY, on_text=None)
        result = await provider.complete(_target(server), call, api_key=API_KEY, on_text=None)
    assert result.parsed == Verdict(score=4, reason="back")
    formats = [r.body["response_format"]["type"] for r in server.requests]
    assert formats == ["json_schema", "json_schema"]


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (500, ModelUnavailable),
        (503, ModelUnavailable),
        (429, ModelRateLimited),
        (400, ModelRejected),
        (404, ModelRejected),
        # "Not now", not "never": retried and failed over (they were final rejections).
        (408, ModelTimeout),
        (409, ModelUnavailable),
        (425, ModelUnavailable),
    ],
)
async def test_http_errors_map_without_leaking_the_body(
    server: OpenAITestServer, status: int, error: type[ModelError]
) -> None:
    # Real servers do echo keys and prompts in error messages.
    server.script(Fail(status=status, message=f"bad key {API_KEY} for prompt {PROMPT}"))

    with pytest.raises(error) as caught:
        await _complete(server)

    text = f"{caught.value!s} {caught.value!r} {caught.value.detail}"
    assert API_KEY not in text
    assert PROMPT not in text
    assert caught.value.detail.startswith(f"HTTP {status} ")  # with the standard phrase
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None, "the SDK's error holds the request, key included"
    assert len(server.requests) == 1, "the SDK must not retry; the harness does"


async def test_a_slow_server_times_out(server: OpenAITestServer) -> None:
    server.script(Delay(seconds=2.0))

    with pytest.raises(ModelTimeout):
        await _complete(server, timeout_s=0.3)

    assert len(server.requests) == 1


async def test_an_unreachable_server_is_unavailable() -> None:
    async with OpenAITestServer() as gone:
        pass  # Closed again: its port now refuses connections.

    with pytest.raises(ModelUnavailable) as caught:
        await _complete(gone)
    assert caught.value.detail == "connection refused (ECONNREFUSED)"


async def test_a_key_no_header_can_carry_is_our_requests_fault_not_the_servers(
    server: OpenAITestServer,
) -> None:
    # Outside testing: it was ModelUnavailable, retried and counted by the breaker the
    # server's every tenant shares (the edge now refuses such a key first).
    provider = build_openai_provider(default_timeout_s=5.0)
    with pytest.raises(ModelRejected) as caught:
        await provider.complete(_target(server), _call(), api_key="sk-bad\nkey", on_text=None)
    assert caught.value.detail == "the request could not be sent"
    assert "sk-bad" not in str(caught.value)
    assert server.requests == []


async def test_a_connection_dropped_mid_answer_says_so(server: OpenAITestServer) -> None:
    server.script(Reply(chunks=["The ", "capital "], reset_after=2))
    with pytest.raises(ModelUnavailable) as caught:
        await _complete(server)
    assert caught.value.detail == "the server closed the connection mid-answer"
    assert caught.value.retryable


async def test_a_stream_cut_before_its_finish_reason_is_a_retryable_failure(
    server: OpenAITestServer,
) -> None:
    server.script(Reply(chunks=["The ", "capital ", "is "], cut_after=3))
    with pytest.raises(ModelUnavailable) as caught:
        await _complete(server, on_text=[])
    assert "cut off" in caught.value.detail and caught.value.retryable


async def test_cancelling_the_task_aborts_the_http_stream(server: OpenAITestServer) -> None:
    server.script(Reply(chunks=[f"t{i} " for i in range(100)], token_delay_s=0.02))
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
    request = server.requests[0]
    assert request.disconnected
    sent = request.chunks_sent
    await asyncio.sleep(0.1)
    assert request.chunks_sent == sent < 100, "the server kept streaming after the cancel"


def test_other_exceptions_are_not_model_errors() -> None:
    assert map_openai_error(ValueError("boom")) is None
    assert map_openai_error(asyncio.CancelledError()) is None


async def test_a_stream_frame_that_is_not_json_is_a_retryable_failure(
    server: OpenAITestServer,
) -> None:
    server.script(Reply(chunks=["The ", "capital ", "is "], broken_after=2))
    with pytest.raises(ModelUnavailable) as caught:
        await _complete(server, on_text=[])
    assert caught.value.retryable, "another attempt may get a whole answer"


async def test_a_model_given_more_time_than_the_default_is_not_cut_off_by_the_client(
    server: OpenAITestServer,
) -> None:
    # The harness bounds each attempt by the ref's timeout_ms (up to the server's maximum);
    # the HTTP client must not end the call at the server's default before that.
    server.script(Delay(seconds=1.0, then=Reply(text="worth the wait")))
    provider = build_openai_provider(default_timeout_s=0.3, max_attempt_timeout_s=5.0)
    result = await provider.complete(_target(server), _call(), api_key=API_KEY, on_text=None)
    assert result.text == "worth the wait"


async def test_structured_calls_send_the_output_cap_and_temperature(
    server: OpenAITestServer,
) -> None:
    server.script(Reply(text='{"score": 7, "reason": "short"}'))
    messages = (ChatMessage("user", PROMPT),)
    call = ChatCall(messages=messages, schema=Verdict, max_tokens=64, temperature=0.0)
    result = await _complete(server, call)
    assert result.parsed == Verdict(score=7, reason="short")
    body = server.requests[0].body
    assert body.get("max_completion_tokens", body.get("max_tokens")) == 64
    assert body["temperature"] == 0.0


def _harness(max_retry_after_s: float = 10.0) -> Harness:
    policy = HarnessPolicy(
        retry=RetryPolicy(initial_backoff_s=0.001, max_retry_after_s=max_retry_after_s)
    )
    return Harness({"openai": build_openai_provider()}, policy=policy)


def _request(server: OpenAITestServer, *fallbacks: ModelTarget) -> ModelRequest:
    meta = CallMeta(thread_id="t", run_id="r", request_id="q", tenant="a", caller_node="n")
    return ModelRequest(
        ref=ModelRef(target=_target(server), fallbacks=fallbacks),
        call=_call(),
        meta=meta,
        credentials={},
    )


@pytest.mark.parametrize("header", [("Retry-After", "0.4"), ("retry-after-ms", "400")])
async def test_a_429_is_retried_no_sooner_than_the_server_asked(
    server: OpenAITestServer, header: tuple[str, str]
) -> None:
    server.script(Fail(status=429, headers=dict([header])), Reply(text="now then"))
    result = await _harness().call(_request(server))
    assert result.text == "now then"
    first, second = server.requests
    assert second.at - first.at >= 0.4


async def test_a_429_asking_for_too_long_a_wait_moves_on_to_the_fallback() -> None:
    async with OpenAITestServer() as limited, OpenAITestServer() as fallback:
        limited.script(Fail(status=429, headers={"Retry-After": "3600"}))
        fallback.script(Reply(text="from the fallback"))
        result = await _harness(max_retry_after_s=5.0).call(_request(limited, _target(fallback)))
    assert result.text == "from the fallback"
    assert len(limited.requests) == 1, "not retried against an hour's Retry-After"


async def test_no_provider_header_url_or_prompt_reaches_the_log_at_debug(
    server: OpenAITestServer,
) -> None:
    import io
    import logging

    from roundtable.telemetry import logs

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    stream = io.StringIO()
    writer = logs.configure("DEBUG", stream)
    try:
        secret_query = "sig=q-9f8e7d6c"
        target = ModelTarget(
            provider="openai", model="qwen-test", base_url=f"{server.base_url}?{secret_query}"
        )
        provider = build_openai_provider(default_timeout_s=10.0)
        # The query makes the test server answer 404: the request went out, and was logged.
        with pytest.raises(ModelRejected):
            await provider.complete(target, _call(), api_key=API_KEY, on_text=None)
        logging.getLogger("roundtable.test").debug("a debug line of our own")
    finally:
        writer.stop()
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    # The test server's own access log (aiohttp) is not the sidecar's.
    text = "\n".join(line for line in stream.getvalue().splitlines() if " aiohttp." not in line)
    assert "a debug line of our own" in text  # DEBUG was on
    for leak in (API_KEY, secret_query, "Bearer", PROMPT, server.base_url, "HTTP Request"):
        assert leak not in text, f"{leak!r} reached the log"
