"""A model's tool calls, from tool definitions out to the calls it streamed back.

Servers that speak OpenAI's chat API stream a tool call as deltas keyed by `index`, but not
all alike. `ToolCallAccumulator` assembles the four dialects seen in the wild
(docs/research/issue-20-tools-and-approval.md, section 5):

- **openai**: the first delta of a call carries `id`, `type` and `function.name` with empty
  arguments; later deltas carry only `index` and argument fragments.
- **llamacpp-old** (llama.cpp before ggml-org/llama.cpp#13800): the id sits inside `function`
  and the whole name is repeated in every delta.
- **whole**: a call in one delta (Ollama; servers that parse the reply before sending it).
- **index0**: parallel calls that all use `index: 0`, told apart only by their ids
  (ollama/ollama#15457).

LangChain's own chunk merging gets llamacpp-old wrong (the name comes out repeated, the id
lost), so both providers assemble calls here from the fragments they see.

The other way, the tools and the calls a prompt already holds go out in each client's
format: `openai_tools` and `openai_messages` for OpenAI's (the SDK's requests, and
`bind_tools`), `langchain_tool_calls` for an assistant message of LangChain's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.messages import InvalidToolCall, ToolCall

from roundtable.domain.tools import json_object
from roundtable.models.base import ChatMessage, ModelToolCall, ToolSpec


class _Partial:
    """A call being assembled."""

    __slots__ = ("arguments", "call_id", "name")

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.name = ""
        self.arguments: list[str] = []


class ToolCallAccumulator:
    """Assembles tool calls from streamed fragments, in the order the calls began.

    Fragments are keyed by `index`, with three fixes for the dialects above: a fragment whose
    id differs from the one at its index begins a new call (index0); a name that arrives
    again whole is not appended (llamacpp-old; the caller reads its id from `function.id`);
    a fragment without an index continues the latest call unless its id says otherwise.

    Not told apart: two calls at one index with no ids at all (no server is known to send
    them); their arguments would run together, and the result is invalid JSON, which the
    caller validates anyway.
    """

    __slots__ = ("_at", "_calls")

    def __init__(self) -> None:
        self._calls: list[_Partial] = []
        self._at: dict[int | None, _Partial] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def add(
        self, index: int | None, call_id: str | None, name: str | None, arguments: str | None
    ) -> None:
        """Adds one fragment: any of its fields may be missing (None or "")."""
        call = self._at.get(index) if index is not None else self._latest()
        if call is None or (call_id and call.call_id and call_id != call.call_id):
            call = _Partial(call_id or "")
            self._calls.append(call)
            self._at[index] = call
        elif call_id and not call.call_id:
            call.call_id = call_id
        if name and name != call.name:
            # A split name is joined; the same whole name again is llamacpp-old's repeat.
            call.name += name
        if arguments:
            call.arguments.append(arguments)

    def add_openai(self, delta: Any, *, index: int | None = None) -> None:
        """Adds one entry of a reply's `tool_calls` in OpenAI's format: a streamed delta's
        entry (`ChoiceDeltaToolCall`), or with `index` given, a whole message's entry (which
        has none), as the openai SDK parsed it or as a plain dict."""
        if isinstance(delta, Mapping):
            function = delta.get("function") or {}
            call_id = delta.get("id")
            name, arguments = function.get("name"), function.get("arguments")
            function_id = function.get("id")
            if index is None:
                index = delta.get("index")
        else:
            # Read leniently: the SDK builds its models from the server's JSON unvalidated.
            function = getattr(delta, "function", None)
            call_id = getattr(delta, "id", None)
            name = getattr(function, "name", None)
            arguments = getattr(function, "arguments", None)
            function_id = (getattr(function, "model_extra", None) or {}).get("id")
            if index is None:
                index = getattr(delta, "index", None)
        if not call_id and isinstance(function_id, str):
            call_id = function_id  # llamacpp-old: the id inside `function`
        self.add(
            index if isinstance(index, int) else None,
            call_id if isinstance(call_id, str) else None,
            name if isinstance(name, str) else None,
            arguments if isinstance(arguments, str) else None,
        )

    def calls(self) -> tuple[ModelToolCall, ...]:
        """The calls assembled so far; a fragment that named nothing is left out."""
        return tuple(
            ModelToolCall(call_id=c.call_id, name=c.name, arguments_json="".join(c.arguments))
            for c in self._calls
            if c.name or c.arguments
        )

    def _latest(self) -> _Partial | None:
        return self._calls[-1] if self._calls else None


def openai_tools(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """The tools as OpenAI function definitions (what `tools` in a request holds).

    Raises:
        ValueError: a tool's `parameters_json` is not a JSON object (a bug of the caller's:
            tools come from validated snapshots).
    """
    definitions = []
    for tool in tools:
        parameters = json.loads(tool.parameters_json or "{}")
        if not isinstance(parameters, dict):
            raise ValueError(f"tool {tool.name!r}: parameters_json is not a JSON object")
        function: dict[str, Any] = {"name": tool.name, "parameters": parameters}
        if tool.description:
            function["description"] = tool.description
        definitions.append({"type": "function", "function": function})
    return definitions


def openai_messages(messages: Iterable[ChatMessage]) -> list[dict[str, Any]]:
    """The prompt in OpenAI's chat format, tool calls and their results included; the calls'
    arguments exactly as the model gave them."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            out.append(
                {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
            )
        elif message.role == "assistant" and message.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    # OpenAI's own shape: null content beside the calls when nothing was said.
                    "content": message.content or None,
                    "tool_calls": [openai_tool_call(call) for call in message.tool_calls],
                }
            )
        else:
            out.append({"role": message.role, "content": message.content})
    return out


def openai_tool_call(call: ModelToolCall) -> dict[str, Any]:
    """One call in OpenAI's format (an assistant message's `tool_calls` entry)."""
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }


def langchain_tool_calls(
    calls: Iterable[ModelToolCall],
) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """An assistant message's tool calls as LangChain's `AIMessage` takes them: its
    `tool_calls`, and in its `invalid_tool_calls` the calls whose arguments are not a JSON
    object, sent back as the model gave them."""
    valid: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for call in calls:
        args = _json_object(call.arguments_json)
        if args is None:
            invalid.append(
                InvalidToolCall(
                    type="invalid_tool_call",
                    name=call.name,
                    args=call.arguments_json,
                    id=call.call_id,
                    error=None,
                )
            )
        else:
            valid.append(ToolCall(type="tool_call", name=call.name, args=args, id=call.call_id))
    return valid, invalid


def _json_object(text: str) -> dict[str, Any] | None:
    """`text` parsed, when it is a JSON object (no text: an empty one); else None."""
    return json_object(text or "{}")
