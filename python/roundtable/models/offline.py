"""The built-in offline model: no network, no key, deterministic.

It is a real LangChain chat model (native async generate and stream, tool binding for
structured output), so it runs through exactly the same provider and harness path as a
remote model. It reads the prompt sections Roundtable writes (`domain.prompt_sections`):
a member answers its task in its persona's voice, a count-off task gets the number, the
supervisor gets a plan from the roster, and explicit statements ("remember that ...",
"记住…", "I prefer ...") become memory proposals.

Behaviour knobs for tests and demos come from the target's base_url query string, e.g.
`offline:?token_delay_ms=20&latency_ms=100&fail=error&fail_times=2`:

- `token_delay_ms`: pause between streamed tokens (default: the server's setting).
- `latency_ms`: pause before the first token.
- `fail`: `error` (a 5xx-like failure), `rate_limit`, `rejected` (a 4xx), `timeout` (never
  answers; the harness timeout fires), `bad_plan` (a supervisor plan naming a member that
  does not exist).
- `fail_times`: how many calls fail before the model behaves (default: all of them).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk
from langchain_core.outputs import ChatResult as LCChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import PrivateAttr, ValidationError

from roundtable.domain.errors import (
    InvalidModelOutput,
    ModelRateLimited,
    ModelRejected,
    ModelUnavailable,
)
from roundtable.domain.events import TokenUsage
from roundtable.domain.snapshot import ModelTarget
from roundtable.models import offline_script as script
from roundtable.models import offline_tools
from roundtable.models.base import ChatCall, ChatResult, TextSink

_TOKEN = re.compile(r"[\u3000-\u9fff\uff00-\uffef]|[^\s\u3000-\u9fff\uff00-\uffef]+\s*|\s+")


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What the offline model answers: text, or a tool call's arguments."""

    text: str = ""
    args: dict[str, Any] | None = None
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class OfflineKnobs:
    """Behaviour of one offline target (see the module docstring)."""

    token_delay_s: float = 0.0
    latency_s: float = 0.0
    fail: str = ""
    fail_times: int = -1
    """How many calls fail; -1 means every call."""

    @classmethod
    def from_target(
        cls, target: ModelTarget, *, default_token_delay_s: float = 0.0
    ) -> OfflineKnobs:
        """Reads the knobs from the target's base_url query string."""
        query = parse_qs(urlsplit(target.base_url).query) if target.base_url else {}

        def num(name: str, default: float) -> float:
            values = query.get(name)
            if not values:
                return default
            try:
                value = float(values[0])
            except ValueError:
                return default
            # nan, inf or a negative pause would stall a run until its deadline.
            return min(max(value, 0.0), 600_000.0) if math.isfinite(value) else default

        return cls(
            token_delay_s=num("token_delay_ms", default_token_delay_s * 1000) / 1000,
            latency_s=num("latency_ms", 0) / 1000,
            fail=query.get("fail", [""])[0],
            fail_times=int(num("fail_times", -1)),
        )


class OfflineChatModel(BaseChatModel):
    """A deterministic chat model that plays its part from the prompt alone."""

    knobs: OfflineKnobs = OfflineKnobs()
    model_name: str = "roundtable-offline"
    _calls: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "roundtable-offline"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Binds tools the way LangChain's structured output expects."""
        kwargs.pop("ls_structured_output_format", None)
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    # -- generation ---------------------------------------------------------------------

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LCChatResult:
        message = await self._answer(messages, kwargs)
        if message.tool_calls:
            return LCChatResult(generations=[ChatGeneration(message=message)])
        parts = [chunk.text async for chunk in self._astream(messages, stop, None, **kwargs)]
        text = "".join(parts)
        return LCChatResult(
            generations=[
                ChatGeneration(
                    message=AIMessage(content=text, usage_metadata=message.usage_metadata)
                )
            ]
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LCChatResult:
        raise NotImplementedError("the offline model is async only")

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        message = await self._answer(messages, kwargs)
        text = message.text
        delay = self.knobs.token_delay_s
        tokens = _TOKEN.findall(text) or [text]
        budget = int(kwargs.get("max_tokens") or len(tokens))
        finish = "length" if len(tokens) > budget else "stop"
        for i, token in enumerate(tokens[:budget]):
            if delay and i:
                await asyncio.sleep(delay)
            yield ChatGenerationChunk(message=AIMessageChunk(content=token))
        usage = message.usage_metadata
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=usage,
                response_metadata={"finish_reason": finish},
                chunk_position="last",
            )
        )

    async def _answer(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        """Decides the whole answer up front (tool call or text), after faults and latency."""
        system = "\n".join(m.text for m in messages if m.type == "system")
        last_user = next((m.text for m in reversed(messages) if m.type == "human"), "")
        tools = kwargs.get("tools") or []
        tool = tools[0]["function"]["name"] if tools else ""
        decision = await self.decide(
            system, last_user, sum(len(m.text) for m in messages), tool=tool
        )
        usage = UsageMetadata(
            input_tokens=decision.input_tokens,
            output_tokens=decision.output_tokens,
            total_tokens=decision.input_tokens + decision.output_tokens,
        )
        if tool:
            return AIMessage(
                content="",
                tool_calls=[{"name": tool, "args": decision.args, "id": f"call_{self._calls}"}],
                usage_metadata=usage,
            )
        return AIMessage(content=decision.text, usage_metadata=usage)

    async def decide(
        self, system: str, last_user: str, prompt_chars: int, *, tool: str = ""
    ) -> Decision:
        """The whole answer to a prompt (text, or `tool`'s arguments), after faults and latency."""
        self._calls += 1
        failing = self.knobs.fail and (
            self.knobs.fail_times < 0 or self._calls <= self.knobs.fail_times
        )
        if failing and self.knobs.fail != "bad_plan":
            await self._fail(self.knobs.fail)
        if self.knobs.latency_s:
            await asyncio.sleep(self.knobs.latency_s)
        input_tokens = prompt_chars // 4 + 1
        if tool:
            args = script.tool_args(tool, system, last_user, bad=bool(failing))
            return Decision(args=args, input_tokens=input_tokens, output_tokens=8)
        text = script.reply(system, last_user)
        return Decision(
            text=text, input_tokens=input_tokens, output_tokens=len(_TOKEN.findall(text))
        )

    @staticmethod
    async def _fail(kind: str) -> None:
        if kind == "timeout":
            await asyncio.Event().wait()  # never answers: the harness's timeout must fire
        if kind == "rate_limit":
            raise ModelRateLimited("offline fault injection: 429")
        if kind == "rejected":
            raise ModelRejected("offline fault injection: 400")
        raise ModelUnavailable("offline fault injection: 500")


def iter_tokens(text: str) -> Iterator[str]:
    """Splits text into the tokens the offline model streams (words, or CJK characters)."""
    yield from _TOKEN.findall(text)


MAX_OFFLINE_MODELS = 256
"""Offline models (each with its fault counter) kept, one per target named."""


class OfflineProvider:
    """The offline model served natively: the same answers as `OfflineChatModel`, without
    LangChain's per-chunk callback machinery (≈50 µs a token), so streaming costs only what
    Roundtable's own pipe costs. One model (and its fault counter) per target."""

    name = "offline"

    def __init__(self, *, default_token_delay_s: float = 0.0) -> None:
        self._build = offline_factory(default_token_delay_s=default_token_delay_s)
        self._models: OrderedDict[ModelTarget, OfflineChatModel] = OrderedDict()

    def base_url_problem(self, base_url: str) -> str:
        """Why the offline model can never read its knobs from `base_url` ("" when it can;
        a `domain.snapshot.BaseUrlRule`, applied at the edge). Any text splits as a URL
        (unknown knobs are ignored) but one whose host has an unclosed "[": every call
        of it would fail with a ValueError."""
        try:
            urlsplit(base_url)
        except ValueError:
            return "does not parse as a URL (the offline model's knobs: offline:?latency_ms=600)"
        return ""

    def model_for(self, target: ModelTarget) -> OfflineChatModel:
        """The model of a target (created on first use; the least recently used of more
        than MAX_OFFLINE_MODELS go, since requests name their targets)."""
        model = self._models.get(target)
        if model is not None:
            self._models.move_to_end(target)
            return model
        built = self._build(target, None)
        assert isinstance(built, OfflineChatModel)
        self._models[target] = built
        if len(self._models) > MAX_OFFLINE_MODELS:
            self._models.popitem(last=False)
        return built

    async def complete(
        self, target: ModelTarget, call: ChatCall, *, api_key: str | None, on_text: TextSink | None
    ) -> ChatResult:
        """Answers one call; see `ChatProvider.complete`."""
        model = self.model_for(target)
        messages = call.messages
        system = "\n".join(m.content for m in messages if m.role == "system")
        last_user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        chars = sum(len(m.content) for m in messages)
        name = f"{target.provider}/{target.model}"
        if call.schema is not None:
            tool = str(call.schema.model_config.get("title") or call.schema.__name__)
            decision = await model.decide(system, last_user, chars, tool=tool)
            usage = TokenUsage(decision.input_tokens, decision.output_tokens)
            try:
                parsed = call.schema.model_validate(decision.args or {})
            except ValidationError:
                error = InvalidModelOutput(f"answer did not match {tool}")
                error.spent = usage
                raise error from None
            return ChatResult(parsed=parsed, usage=usage, model=name)
        decision = await model.decide(system, last_user, chars)
        text = decision.text
        if call.tools:
            planned = offline_tools.planned_call(messages, call.tools)
            if planned is not None:
                usage = TokenUsage(decision.input_tokens, 8)
                return ChatResult(tool_calls=(planned,), usage=usage, model=name)
        output_tokens = decision.output_tokens
        quoted = offline_tools.answer_with_results(messages)
        if quoted:
            text, output_tokens = quoted, len(_TOKEN.findall(quoted))
        tokens = _TOKEN.findall(text) or [text]
        budget = call.max_tokens or len(tokens)
        delay = model.knobs.token_delay_s
        for i, token in enumerate(tokens[:budget]):
            if delay and i:
                await asyncio.sleep(delay)
            if on_text is not None:
                on_text(token)
        return ChatResult(
            text="".join(tokens[:budget]),
            usage=TokenUsage(decision.input_tokens, min(output_tokens, budget)),
            finish_reason="length" if len(tokens) > budget else "stop",
            model=name,
        )


def offline_factory(
    *, default_token_delay_s: float = 0.0
) -> Callable[[ModelTarget, str | None], BaseChatModel]:
    """A model factory for `LangChainProvider`: one offline model per target."""

    def build(target: ModelTarget, _api_key: str | None) -> BaseChatModel:
        knobs = OfflineKnobs.from_target(target, default_token_delay_s=default_token_delay_s)
        return OfflineChatModel(knobs=knobs, model_name=target.model)

    return build
