"""Structured output over the chat completions API, in forms real servers accept.

OpenAI-compatible servers differ most in structured output. Tool calls with a forced
`tool_choice` need a chat template that knows tools (llama.cpp without `--jinja` refuses
them); a `json_schema` response format is turned into a decoding grammar by servers that
enforce it (llama.cpp, vLLM, Ollama), and their converters each support a different subset
of JSON Schema. So a schema is sent in its most portable form:

- `response_format: {"type": "json_schema", "json_schema": {..., "strict": false}}`, whose
  schema is pydantic's with every `$ref` inlined, `Optional[X]` sent as `X` (not
  required), and only the keywords every converter knows (type, properties, required,
  items, enum, description, a short maxLength): other bounds, long lengths and patterns
  stay in pydantic, which validates every answer anyway. A call's `choices` (the
  snapshot's member ids, the turn's reply ids) are added as enums, and a list of them
  gets `maxItems` (llama.cpp's converter and llama-server take it: checked).
- When a server refuses that request (an HTTP error answered to it), the same attempt asks
  again in JSON mode (`{"type": "json_object"}`), with the schema in the prompt; the
  target is remembered, so its later calls go to JSON mode at once.

Either way the answer is parsed and validated here by pydantic, and a failure says which
form was used and why, never the model's text.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ValidationError

from roundtable.domain.errors import InvalidModelOutput
from roundtable.models.base import ChatMessage, Choices


class StructuredForm(StrEnum):
    """How a structured call asks the server for JSON."""

    JSON_SCHEMA = "json_schema"
    """`response_format` json_schema (strict off), the portable schema: the server may
    constrain decoding to it."""
    JSON_OBJECT = "json_object"
    """JSON mode: any JSON object; the schema is only in the prompt."""


_KEPT_KEYWORDS = frozenset(
    {"type", "properties", "required", "items", "enum", "description", "anyOf"}
)
"""JSON Schema keywords the portable form keeps: those that llama.cpp's, vLLM's and
Ollama's schema-to-grammar converters all understand. The rest (minimum, a maxLength over
256, pattern, default, title...) are checked by pydantic after the answer."""


_SHORT_MAX_LENGTH = 256
"""A `maxLength` up to this is kept (ids): under a grammar it is what stops a small model
writing one id for ever (SmolLM2 on llama-server wrote member_id digits until the token
cap). Longer ones are dropped: llama.cpp's grammar limits repetitions to 2,000 (builds that
expand `{0,4000}` refuse MemoryProposals, "failed to parse grammar"), and they bound nothing
a token cap does not."""


@functools.cache
def portable_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """The pydantic model's JSON schema in the portable form (see the module docstring).

    Made once per model class (a structured call sends it twice: in the response format and
    in the prompt); callers only read it.
    """
    full = schema.model_json_schema()
    portable: dict[str, Any] = _portable(full, full.get("$defs", {}))
    return portable


def _portable(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_portable(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        # Inlined: some converters resolve no $ref, and these schemas have no recursion.
        return _portable(defs[ref.removeprefix("#/$defs/")], defs)
    options = node.get("anyOf")
    if isinstance(options, list):
        kept = [o for o in options if o != {"type": "null"}]
        if len(kept) == 1:
            # Optional[X] -> X: the field has a default, so it is left out of "required"
            # and the model may omit it instead of writing null.
            merged = {k: v for k, v in node.items() if k != "anyOf"}
            return _portable({**kept[0], **merged}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "maxLength" and isinstance(value, int) and value <= _SHORT_MAX_LENGTH:
            out[key] = value
            continue
        if key not in _KEPT_KEYWORDS:
            continue
        if key == "properties":
            out[key] = {name: _portable(prop, defs) for name, prop in value.items()}
        else:
            out[key] = _portable(value, defs)
    return out


def schema_with(schema: type[BaseModel], choices: Choices) -> dict[str, Any]:
    """The portable schema with `choices` said as enums: a real model (SmolLM2 on
    llama-server) wrote display names, "user" and 64-digit numbers for member ids, and
    reply ids "#1" to "#53" until its token cap, where a grammar held to the snapshot's
    ids lets it write nothing else (outside testing). A list of the values themselves
    (`evidence_reply_ids`) holds each at most once, so it gets `maxItems` too: held to real
    ids, the same model still wrote them over and over until its cap."""
    portable = portable_schema(schema)
    if not choices:
        return portable
    out: dict[str, Any] = json.loads(json.dumps(portable))  # a copy: the cached one is shared
    for path, values in choices:
        node = out
        for name in path.split("."):
            node, array = node["properties"][name], None
            while node.get("type") == "array":
                array, node = node, node["items"]
        node["enum"] = list(values)
        if array is not None:  # the path's last property is a list of these values
            array["maxItems"] = len(values)
    return out


def response_format(
    schema: type[BaseModel], form: StructuredForm, choices: Choices = ()
) -> dict[str, Any]:
    """The `response_format` request field for a form."""
    if form is StructuredForm.JSON_OBJECT:
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": schema.__name__,
            "schema": schema_with(schema, choices),
            # Strict mode would make OpenAI demand every property be required and
            # additionalProperties false; the portable schema is not written for it.
            "strict": False,
        },
    }


def with_instruction(
    messages: tuple[ChatMessage, ...], schema: type[BaseModel], choices: Choices = ()
) -> tuple[ChatMessage, ...]:
    """The messages with the JSON answer's shape said in the (first) system message.

    Said in the prompt in every form: JSON mode constrains nothing but the syntax, and a
    small model given a grammar still writes better values when it sees what they mean.
    Appended to the system message already there, not added as a second one: some chat
    templates refuse a system message anywhere but first.
    """
    instruction = _instruction(schema) if not choices else _said(schema_with(schema, choices))
    if messages and messages[0].role == "system":
        first = ChatMessage("system", f"{messages[0].content}\n\n{instruction}")
        return (first, *messages[1:])
    return (ChatMessage("system", instruction), *messages)


@functools.cache
def _instruction(schema: type[BaseModel]) -> str:
    return _said(portable_schema(schema))


def _said(schema: dict[str, Any]) -> str:
    return "Answer with one JSON object and nothing else, matching this JSON schema:\n" + (
        json.dumps(schema, ensure_ascii=False)
    )


_FENCE = re.compile(r"^\s*+```(?:json)?+(.*)```\s*+\Z", re.DOTALL | re.IGNORECASE)
"""A reply wrapped in a ```json fence; its body is stripped in Python. Greedy to the last
fence, whitespace taken possessively: a model's reply is not ours to trust, and blanks, a
lazy body and blanks side by side let a reply of blanks without its closing fence take
time cubic in its length (hours for a 64 K reply)."""


def parse_answer(text: str, schema: type[BaseModel], form: StructuredForm) -> BaseModel:
    """Parses and validates a JSON answer.

    Accepts the object inside a ```json fence too: models in JSON mode still write one.

    Raises:
        InvalidModelOutput: naming the schema, the form and what was wrong (no JSON, or
            the fields that failed), never the text itself (it may echo the prompt).
    """
    fenced = _FENCE.match(text)
    body = (fenced.group(1) if fenced else text).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        raise InvalidModelOutput(f"{form.value}: answer is not JSON") from None
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        where = sorted({".".join(str(p) for p in e["loc"]) or "<root>" for e in exc.errors()})
        named = ", ".join(w[:64] for w in where[:5])
        raise InvalidModelOutput(
            f"{form.value}: answer did not match {schema.__name__} ({named})"
        ) from None


REFUSAL_TTL_S = 600.0
"""How long a refusal is believed: a server that answered a 5xx once (busy, restarting)
and then took JSON mode was perhaps not refusing the schema at all."""


class SchemaRefusals:
    """The targets whose server refused a JSON schema (or another form of request), so
    that their later calls use the fallback form at once instead of being refused each
    time. Bounded (oldest forgotten), per provider instance, in memory only, and for
    `ttl_s` after the last refusal: then the target is asked the first way again."""

    def __init__(
        self,
        capacity: int = 256,
        *,
        ttl_s: float = REFUSAL_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._seen: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock

    def reason(self, base_url: str, model: str) -> str:
        """Why this target gets the fallback form ("" when it has not refused lately)."""
        seen = self._seen.get((base_url, model))
        if seen is None:
            return ""
        if self._clock() >= seen[1]:
            del self._seen[(base_url, model)]
            return ""
        return seen[0]

    def remember(self, base_url: str, model: str, reason: str) -> None:
        """Records that the target refused the request, and the error it answered."""
        self._seen[(base_url, model)] = (reason, self._clock() + self._ttl_s)
        self._seen.move_to_end((base_url, model))
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
