"""Adapts any LangChain chat model to the `ChatProvider` interface."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
)

from roundtable.domain.errors import InvalidModelOutput, ModelError, ModelRejected, ModelUnavailable
from roundtable.domain.events import TokenUsage
from roundtable.domain.snapshot import ModelTarget
from roundtable.models.base import ChatCall, ChatMessage, ChatResult, ModelFactory, TextSink
from roundtable.models.structured import (
    SchemaRefusals,
    StructuredForm,
    parse_answer,
    response_format,
    with_instruction,
)

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
    """Converts our prompt messages to LangChain messages."""
    return [_ROLE_TO_MESSAGE[m.role](content=m.content) for m in messages]


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
    ) -> None:
        self.name = name
        self._factory = factory
        self._map_error = map_error or (lambda _exc: None)
        self._structured_method = structured_method
        self._refusals = SchemaRefusals()
        self._cache: OrderedDict[tuple[ModelTarget, str | None], BaseChatModel] = OrderedDict()
        self._cache_size = cache_size

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
        model = self.model_for(target, api_key)
        messages = to_langchain(call.messages)
        kwargs: dict[str, Any] = {"max_tokens": call.max_tokens}
        if call.temperature is not None:
            kwargs["temperature"] = call.temperature
        name = f"{target.provider}/{target.model}"
        try:
            if call.schema is not None and self._structured_method == "json":
                return await self._json_structured(model, target, call, kwargs, name)
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

    async def _stream(
        self,
        model: BaseChatModel,
        messages: list[BaseMessage],
        kwargs: dict[str, Any],
        on_text: TextSink | None,
        name: str,
    ) -> ChatResult:
        parts: list[str] = []
        usage = TokenUsage()
        finish_reason = "stop"
        # Per chunk, only what the chunk carries: most chunks are a bare string of text,
        # and usage or a finish reason come once, near the end. (`.text`, and adding an
        # empty usage, cost ≈3 µs a chunk, a tenth of LangChain's own per-chunk cost.)
        async for chunk in model.astream(messages, **kwargs):
            content = chunk.content
            text = content if type(content) is str else str(chunk.text)
            if text:
                parts.append(text)
                if on_text is not None:
                    on_text(text)
            if chunk.usage_metadata:
                usage = usage + _usage(chunk)
            if chunk.response_metadata:
                reason = chunk.response_metadata.get("finish_reason")
                if reason:
                    finish_reason = str(reason)
        return ChatResult(text="".join(parts), usage=usage, finish_reason=finish_reason, model=name)

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
            raise InvalidModelOutput(f"answer did not match {call.schema.__name__}")
        assert isinstance(parsed, call.schema)
        return ChatResult(parsed=parsed, usage=_usage(raw), model=name)

    async def _json_structured(
        self,
        model: BaseChatModel,
        target: ModelTarget,
        call: ChatCall,
        kwargs: dict[str, Any],
        name: str,
    ) -> ChatResult:
        """A structured call as a JSON answer: the portable schema first, JSON mode for a
        target that refuses it; validated by pydantic either way (models/structured.py)."""
        assert call.schema is not None
        messages = to_langchain(with_instruction(call.messages, call.schema))
        refused = self._refusals.reason(target.base_url, target.model)
        form = StructuredForm.JSON_OBJECT if refused else StructuredForm.JSON_SCHEMA
        refusal: ModelError | None = None
        try:
            result = await self._stream(model, messages, _asking(kwargs, call, form), None, name)
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
            result = await self._stream(model, messages, _asking(kwargs, call, form), None, name)
            self._refusals.remember(target.base_url, target.model, refused)
            log.warning(
                "%s refused the JSON schema (%s); its structured calls use JSON mode", name, refused
            )
        try:
            parsed = parse_answer(result.text, call.schema, form)
        except InvalidModelOutput as exc:
            if not refused:
                raise
            raise InvalidModelOutput(
                f"{exc.detail}; the server refused the JSON schema ({refused})"
            ) from None
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
    return {**kwargs, "extra_body": {"response_format": response_format(call.schema, form)}}


def _schema_refusal(error: ModelError | None) -> ModelError | None:
    """The error, when it is the server answering the schema request with an HTTP error
    status (a 4xx or a 5xx: llama.cpp answers a schema its grammar cannot take with 500),
    so JSON mode is worth a try; None for timeouts, 429s and unreachable servers."""
    if isinstance(error, ModelRejected | ModelUnavailable) and error.detail.startswith("HTTP "):
        return error
    return None
