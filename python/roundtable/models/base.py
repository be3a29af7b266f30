"""The one small interface every provider implements.

A provider turns a `ModelTarget` (+ its API key, if any) into a LangChain chat model and
maps the provider's own exceptions onto `roundtable.domain.errors.ModelError`. It knows
nothing of retries, breakers or the graph: the harness wraps it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel

from roundtable.domain.events import TokenUsage
from roundtable.domain.snapshot import ModelTarget


@dataclass(frozen=True, slots=True)
class ModelToolCall:
    """A tool call as a model asked for it."""

    call_id: str
    """The model's id of the call (the idempotency key when the model gave none)."""
    name: str
    arguments_json: str
    """The arguments exactly as the model gave them (JSON text, perhaps not valid)."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as a model is told of it (an OpenAI function definition)."""

    name: str
    description: str
    parameters_json: str
    """The JSON Schema of its arguments."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One prompt message.

    An assistant message may carry the tool calls the model asked for; a `tool` message
    answers one of them (`tool_call_id`) with the tool's result as its content.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ModelToolCall, ...] = ()
    tool_call_id: str = ""


CHARS_PER_TOKEN_BOUND = 64
"""A generous bound on one token's characters: tokenizers' longest pieces (runs of
spaces, code indentation) stay below it, so a reply within its token budget never
reaches its character bound."""

MAX_REPLY_CHARS = 262_144
"""No reply holds more characters, whatever its budget: at most 4 bytes each in UTF-8,
a reply's final stays within 1 MiB, well inside the 4 MiB a default gRPC client accepts
(so a gateway can always replay the run)."""


def reply_char_bound(max_tokens: int) -> int:
    """The most characters a reply of `max_tokens` output tokens may have (0: no token
    budget, only the absolute bound)."""
    if max_tokens <= 0:
        return MAX_REPLY_CHARS
    return min(max_tokens * CHARS_PER_TOKEN_BOUND, MAX_REPLY_CHARS)


TextSink = Callable[[str], None]
"""Receives streamed text chunks as the model produces them."""


def unheard(text: str) -> None:
    """A text sink that keeps nothing: a call whose text no stream shows (deltas off, a
    supervisor's plan, a memory proposal) still hands the harness its chunks, which time
    the attempt by its silence and count the tokens of one that breaks off."""


def heard(on_text: TextSink | None) -> None:
    """Tells `on_text` that the model sent a chunk without text (a piece of a tool call's
    arguments), if it wants to know: the harness's silence watch does (`heard()`), since a
    model writing a long argument is not silent and those pieces are output tokens too
    (outside testing: a tool call whose arguments streamed for longer than the timeout,
    with no text beside them, was cut as silent). Sinks of text alone are not told."""
    note = getattr(on_text, "heard", None)
    if note is not None:
        note()


Choices = tuple[tuple[str, tuple[str, ...]], ...]
"""`ChatCall.choices`: (a dotted path of properties, the values its strings may take)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatCall:
    """What to ask a model, independent of which model answers."""

    messages: tuple[ChatMessage, ...]
    max_tokens: int = 512
    temperature: float | None = None
    schema: type[BaseModel] | None = None
    """When set, the answer is structured output validated against this pydantic model."""
    choices: Choices = ()
    """For a structured call: the only values some string fields of the answer may take in
    this call, as (a dotted path of properties through arrays, the values): the JSON
    schema sent (and said in the prompt) holds them as an `enum`, so a server that
    constrains decoding cannot write another (`("steps.member_id", ("lin", "bo"))`), and a
    list of them as at most that many items.
    Pydantic still validates the answer, and a provider without JSON schemas ignores it."""
    tools: tuple[ToolSpec, ...] = ()
    """Tools the model may call instead of answering (never together with `schema`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatResult:
    """A model's complete answer."""

    text: str = ""
    parsed: BaseModel | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)
    finish_reason: str = "stop"
    model: str = ""
    """`provider/model` of the target that answered (after failover)."""
    attempts: int = 1
    """Model attempts the harness made for it, retries and failovers included."""
    tool_calls: tuple[ModelToolCall, ...] = ()
    """Tool calls the model asked for (then `text` is what it said beside them, if anything)."""


class ChatProvider(Protocol):
    """Runs one attempt of a call against one target.

    A provider that reads `ModelTarget.base_url` also has `base_url_problem(base_url) ->
    str` (a `domain.snapshot.BaseUrlRule`): the edge refuses a target whose base_url it
    can never use. A provider without one takes any base_url.
    """

    name: str

    async def complete(
        self,
        target: ModelTarget,
        call: ChatCall,
        *,
        api_key: str | None,
        on_text: TextSink | None,
    ) -> ChatResult:
        """Calls the model once. Streams its text to `on_text` when given (a structured
        answer's JSON too, where the provider streams it: the harness times an attempt by
        its chunks, and nobody shows a plan's).

        Raises:
            ModelError: a subclass saying what failed (timeout, 429, 5xx, 4xx, bad output).
        """
        ...


ModelFactory = Callable[[ModelTarget, str | None], BaseChatModel]
"""Builds a LangChain chat model for a target and its API key."""

ProviderRegistry = Mapping[str, ChatProvider]
"""Providers by name (`ModelTarget.provider`); the composition root builds it."""
