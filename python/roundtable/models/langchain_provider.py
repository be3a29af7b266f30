"""Adapts any LangChain chat model to the `ChatProvider` interface.

`LangChainProvider` streams replies (text, and tool calls with tools bound) and asks for
structured output, for the offline model and as the base of the OpenAI-compatible
provider. What it shares with that provider's own tool stream lives apart: how a streamed
reply is bounded, stopped and finished in models/streaming.py, tool calls in and out in
models/tool_calls.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import Runnable

from roundtable.domain.errors import InvalidModelOutput, ModelError, ModelRejected, ModelUnavailable
from roundtable.domain.events import TokenUsage
from roundtable.domain.snapshot import ModelTarget
from roundtable.models.base import (
    ChatCall,
    ChatMessage,
    ChatResult,
    ModelFactory,
    TextSink,
    heard,
)
from roundtable.models.streaming import STOP_GRACE_CHUNKS, OutputBudget, finish_reply, stop_now
from roundtable.models.structured import (
    SchemaRefusals,
    StructuredForm,
    parse_answer,
    response_format,
    with_instruction,
)
from roundtable.models.tool_calls import ToolCallAccumulator, langchain_tool_calls, openai_tools

log = logging.getLogger(__name__)

StructuredMethod = Literal["function_calling", "json"]
"""How structured output is asked for: LangChain's forced tool call (the offline model), or
a JSON response format parsed and validated here (OpenAI-compatible servers; see
models/structured.py)."""

ErrorMapper = Callable[[BaseException], ModelError | None]
"""Maps a provider exception to our error family; None means "not a model error"."""

_ROLE_TO_MESSAGE: dict[str, type[BaseMessage]] = {
    "system": SystemMessage,
    "user": HumanMessage,
    "assistant": AIMessage,
}


def to_langchain(messages: tuple[ChatMessage, ...]) -> list[BaseMessage]:
    """Converts our prompt messages to LangChain messages: an assistant message's tool calls
    become its `tool_calls` (arguments that are not a JSON object, its `invalid_tool_calls`,
    sent back as given), a tool result a `ToolMessage` answering its call's id."""
    out: list[BaseMessage] = []
    for m in messages:
        if m.role == "tool":
            out.append(ToolMessage(content=m.content, tool_call_id=m.tool_call_id))
        elif m.role == "assistant" and m.tool_calls:
            valid, invalid = langchain_tool_calls(m.tool_calls)
            out.append(AIMessage(content=m.content, tool_calls=valid, invalid_tool_calls=invalid))
        else:
            out.append(_ROLE_TO_MESSAGE[m.role](content=m.content))
    return out


def _usage(message: AIMessage | AIMessageChunk | None) -> TokenUsage:
    meta = getattr(message, "usage_metadata", None) if message is not None else None
    if not meta:
        return TokenUsage()
    return TokenUsage(int(meta.get("input_tokens", 0)), int(meta.get("output_tokens", 0)))


class LangChainProvider:
    """A `ChatProvider` over LangChain chat models built by a factory.

    Models are cached per (target, key) because building one (an HTTP client for the
    OpenAI-compatible provider) costs far more than a call's own overhead. The cache lives
    in process memory only, like the keys themselves.
    """

    def __init__(
        self,
        name: str,
        factory: ModelFactory,
        *,
        map_error: ErrorMapper | None = None,
        structured_method: StructuredMethod = "function_calling",
        cache_size: int = 128,
        stream_ends_with_finish_reason: bool = False,
    ) -> None:
        """Builds the provider.

        Args:
            name: The provider's name (`ModelTarget.provider`).
            factory: Builds the chat model of a target and key.
            map_error: Maps the model's exceptions onto `ModelError`s.
            structured_method: How `with_structured_output` asks for structured output.
            cache_size: Chat models kept (one per target and key).
            stream_ends_with_finish_reason: The model's streams end with a chunk naming a
                finish reason (OpenAI's do): a stream without one was cut off, and fails
                as `ModelUnavailable` (retryable) instead of passing as a whole reply.
        """
        self.name = name
        self._factory = factory
        self._map_error = map_error or (lambda _exc: None)
        self._structured_method = structured_method
        self._refusals = SchemaRefusals()
        self._cache: OrderedDict[tuple[ModelTarget, str | None], BaseChatModel] = OrderedDict()
        self._cache_size = cache_size
        self._stream_ends_with_finish_reason = stream_ends_with_finish_reason

    def model_for(self, target: ModelTarget, api_key: str | None) -> BaseChatModel:
        """Returns the (cached) chat model for a target and key."""
        key = (target, api_key)
        model = self._cache.get(key)
        if model is None:
            model = self._factory(target, api_key)
            self._cache[key] = model
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return model

    async def complete(
        self,
        target: ModelTarget,
        call: ChatCall,
        *,
        api_key: str | None,
        on_text: TextSink | None,
    ) -> ChatResult:
        """Calls the model once; see `ChatProvider.complete`."""
        if call.tools and call.schema is not None:
            raise ValueError("a call has tools or a schema, never both")
        model = self.model_for(target, api_key)
        kwargs: dict[str, Any] = {"max_tokens": call.max_tokens}
        if call.temperature is not None:
            kwargs["temperature"] = call.temperature
        name = f"{target.provider}/{target.model}"
        try:
            if call.tools:
                return await self._with_tools(model, target, call, kwargs, on_text, name)
            if call.schema is not None and self._structured_method == "json":
                return await self._json_structured(model, target, call, kwargs, on_text, name)
            messages = to_langchain(call.messages)
            if call.schema is not None:
                return await self._structured(model, messages, call, name)
            return await self._stream(model, messages, kwargs, on_text, name)
        except ModelError:
            raise
        except Exception as exc:
            mapped = self._map_error(exc)
            if mapped is None:
                raise
        # Raised here, outside the handler, so the SDK's exception is not even its
        # __context__: it holds the HTTP request, Authorization header included, and an
        # error reporter walking the chain would find the key there.
        raise mapped

    async def _with_tools(
        self,
        model: BaseChatModel,
        target: ModelTarget,
        call: ChatCall,
        kwargs: dict[str, Any],
        on_text: TextSink | None,
        name: str,
    ) -> ChatResult:
        """A call the model may answer with tool calls: its tools bound as OpenAI function
        definitions (`bind_tools`, which every LangChain model with tool calling takes),
        the reply streamed, the calls assembled from its `tool_call_chunks`.

        The calls are assembled by `ToolCallAccumulator`, not by adding the chunks up as
        LangChain does: that merges and parses the partial arguments again at every chunk
        (7.5-8.0 ms of client CPU for a reply of 34 chunks against 6.0-6.4 ms here, see
        bench/tool_stream.py), and repeats the name of llama.cpp's old dialect in every
        chunk. That dialect's id (in `function.id`) never reaches LangChain's chunks: such
        calls come back with no id. Providers that read the server's own chunks override
        this (openai_compat).
        """
        bound = model.bind_tools(openai_tools(call.tools))
        return await self._stream(
            bound, to_langchain(call.messages), kwargs, on_text, name, ToolCallAccumulator()
        )

    async def _stream(
        self,
        model: Runnable[LanguageModelInput, BaseMessage],
        messages: list[BaseMessage],
        kwargs: dict[str, Any],
        on_text: TextSink | None,
        name: str,
        tool_calls: ToolCallAccumulator | None = None,
    ) -> ChatResult:
        """Streams one reply: its text to `on_text` as it comes, and with `tool_calls` given,
        the tool calls of its chunks into it. Tool-call fragments count toward the output
        budget like text; a reply cut at its budget carries no tool calls (see `finish_reply`)."""
        parts: list[str] = []
        usage: TokenUsage | None = None
        finish_reason = ""
        budget = OutputBudget(int(kwargs.get("max_tokens") or 0))
        # Per chunk, only what the chunk carries: most chunks are a bare string of text,
        # and usage or a finish reason come once, near the end. (`.text`, and adding an
        # empty usage, cost ≈3 µs a chunk, a tenth of LangChain's own per-chunk cost.)
        stop = asyncio.timeout(None)
        try:
            async with stop:
                async for chunk in model.astream(messages, **kwargs):
                    if budget.spent:
                        # The stop is on its way; nothing more joins the reply. A model
                        # whose stream swallows the cancellation is left by `break`.
                        budget.overrun += 1
                        if budget.overrun > STOP_GRACE_CHUNKS:
                            break
                        continue
                    content = chunk.content
                    text = content if type(content) is str else str(chunk.text)
                    if text:
                        text = budget.take(text)
                        if text:
                            parts.append(text)
                            if on_text is not None:
                                on_text(text)
                        if budget.spent:
                            stop_now(stop)
                            continue
                    if tool_calls is not None and isinstance(chunk, AIMessageChunk):
                        for piece in chunk.tool_call_chunks:
                            args, tool = piece.get("args"), piece.get("name")
                            if not budget.admits(len(args or "") + len(tool or "")):
                                stop_now(stop)
                                break
                            tool_calls.add(piece.get("index"), piece.get("id"), tool, args)
                            heard(on_text)
                        if budget.spent:
                            continue
                    if isinstance(chunk, AIMessage) and chunk.usage_metadata:
                        usage = _usage(chunk) if usage is None else usage + _usage(chunk)
                    if chunk.response_metadata:
                        reason = chunk.response_metadata.get("finish_reason")
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
            tool_calls,
            ends_with_finish_reason=self._stream_ends_with_finish_reason,
        )

    async def _structured(
        self, model: BaseChatModel, messages: list[BaseMessage], call: ChatCall, name: str
    ) -> ChatResult:
        assert call.schema is not None
        # The output cap and temperature go on the model itself: `with_structured_output`
        # builds a chain whose `ainvoke` keyword arguments never reach the request.
        fields = type(model).model_fields
        update: dict[str, Any] = {}
        if call.max_tokens and "max_tokens" in fields:
            update["max_tokens"] = call.max_tokens
        if call.temperature is not None and "temperature" in fields:
            update["temperature"] = call.temperature
        if update:
            model = model.model_copy(update=update)
        runnable = model.with_structured_output(
            call.schema, method=self._structured_method, include_raw=True
        )
        out = await runnable.ainvoke(messages)
        assert isinstance(out, dict)
        parsed = out.get("parsed")
        raw = out.get("raw")
        if parsed is None or out.get("parsing_error") is not None:
            # The reason names the schema, never the model's text (it may echo the prompt).
            error = InvalidModelOutput(f"answer did not match {call.schema.__name__}")
            error.spent = _usage(raw)
            raise error
        assert isinstance(parsed, call.schema)
        return ChatResult(parsed=parsed, usage=_usage(raw), model=name)

    async def _json_structured(
        self,
        model: BaseChatModel,
        target: ModelTarget,
        call: ChatCall,
        kwargs: dict[str, Any],
        on_text: TextSink | None,
        name: str,
    ) -> ChatResult:
        """A structured call as a JSON answer: the portable schema first, JSON mode for a
        target that refuses it; validated by pydantic either way (models/structured.py).
        The answer's text streams to `on_text` as any reply's does (the harness times the
        attempt by it; outside testing: a plan streamed at 40 tokens a second was cut as
        if silent)."""
        assert call.schema is not None
        messages = to_langchain(with_instruction(call.messages, call.schema, call.choices))
        refused = self._refusals.reason(target.base_url, target.model)
        form = StructuredForm.JSON_OBJECT if refused else StructuredForm.JSON_SCHEMA
        refusal: ModelError | None = None
        try:
            result = await self._stream(model, messages, _asking(kwargs, call, form), on_text, name)
        except Exception as exc:
            refusal = (
                _schema_refusal(self._map_error(exc))
                if form is StructuredForm.JSON_SCHEMA
                else None
            )
            if refusal is None:
                raise
        if refusal is not None:
            # Asked again outside the handler, so the first error is not the second's
            # __context__ (the SDK's errors hold the request). A server that fails JSON mode
            # too raises that error, as any failed call does: it was not the schema.
            form, refused = StructuredForm.JSON_OBJECT, refusal.detail
            result = await self._stream(model, messages, _asking(kwargs, call, form), on_text, name)
            self._refusals.remember(target.base_url, target.model, refused)
            log.warning(
                "%s refused the JSON schema (%s); its structured calls use JSON mode", name, refused
            )
        try:
            parsed = parse_answer(result.text, call.schema, form)
        except InvalidModelOutput as exc:
            exc.spent = result.usage  # the answer was generated, and billed, all the same
            if not refused:
                raise
            wrapped = InvalidModelOutput(
                f"{exc.detail}; the server refused the JSON schema ({refused})"
            )
            wrapped.spent = result.usage
            raise wrapped from None
        return ChatResult(
            parsed=parsed, usage=result.usage, finish_reason=result.finish_reason, model=name
        )


def _asking(kwargs: dict[str, Any], call: ChatCall, form: StructuredForm) -> dict[str, Any]:
    """The call's keyword arguments with the response format for `form`.

    Sent in `extra_body`, not as ChatOpenAI's own `response_format`: that one switches
    LangChain to the SDK's beta parsing helpers, which stream differently and raise on a
    length finish; in the body it is a plain streamed completion like every other call.
    """
    assert call.schema is not None
    format_ = response_format(call.schema, form, call.choices)
    return {**kwargs, "extra_body": {"response_format": format_}}


def _schema_refusal(error: ModelError | None) -> ModelError | None:
    """The error, when it is the server answering the schema request with a status that
    may mean "not this schema" (a 4xx, or 500 and 501: llama.cpp answers a schema its
    grammar cannot take with 500), so JSON mode is worth a try; None for timeouts, 429s,
    unreachable servers and a server saying "not now" (502-504, 409, 425): remembered as
    a refusal, one outage took the schema from every tenant's calls for ten minutes
    (review)."""
    if isinstance(error, ModelRejected) and error.http_status:
        return error
    if isinstance(error, ModelUnavailable) and error.http_status in (500, 501):
        return error
    return None
