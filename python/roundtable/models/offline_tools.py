"""How the offline model uses tools: deterministically, from the user's words.

When the user turn names a tool the member may call ("use weather for Paris",
"用 weather 查 巴黎"), the model calls it with the rest of the sentence as its one string
argument; once the tool answered, it replies quoting the result. So tests and the demo
exercise the whole tool path (records, approval, replay) with no network and no model.
"""

from __future__ import annotations

import json
import re

from roundtable.domain import prompt_sections as sections
from roundtable.models.base import ChatMessage, ModelToolCall, ToolSpec

_EN = re.compile(
    r"\buse\s+(?P<tool>[A-Za-z0-9_-]{1,64})\s+(?:(?:for|on|to|with|about)\s+)?(?P<rest>[^\n]+)",
    re.IGNORECASE,
)
_ZH = re.compile(
    r"用\s*+(?P<tool>[A-Za-z0-9_-]{1,64})\s*+(?:查询|查找|搜索|查|找|记录|记)?+\s*+(?P<rest>[^\n]+)"
)
_CJK = re.compile(r"[\u4e00-\u9fff]")


def user_turn_of(messages: tuple[ChatMessage, ...]) -> tuple[str, int]:
    """The user turn's text (the last user message, without the task) and its index."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "user":
            return message.content.split(sections.TASK)[0].strip(), index
    return "", -1


def planned_call(
    messages: tuple[ChatMessage, ...], tools: tuple[ToolSpec, ...]
) -> ModelToolCall | None:
    """The call the offline model makes, or None: no allowed tool is named, or it was
    called already this turn (a tool message follows the user turn)."""
    turn, index = user_turn_of(messages)
    if any(m.role == "tool" for m in messages[index + 1 :]):
        return None
    by_name = {t.name.lower(): t for t in tools}
    for pattern in (_EN, _ZH):
        for match in pattern.finditer(turn):
            tool = by_name.get(match.group("tool").lower())
            if tool is None:
                continue
            rest = match.group("rest").strip().rstrip(".!?。！？")
            arguments = {_argument_name(tool): rest}
            return ModelToolCall("", tool.name, json.dumps(arguments, ensure_ascii=False))
    return None


def _argument_name(tool: ToolSpec) -> str:
    """The tool's first string argument (its schema's first property), else `input`."""
    try:
        properties = json.loads(tool.parameters_json).get("properties") or {}
    except (ValueError, AttributeError):
        return "input"
    for name, spec in properties.items():
        if isinstance(spec, dict) and spec.get("type", "string") == "string":
            return str(name)
    return "input"


def answer_with_results(messages: tuple[ChatMessage, ...]) -> str:
    """A reply quoting the tool results that follow the user turn ("" when none do)."""
    turn, index = user_turn_of(messages)
    results = [m for m in messages[index + 1 :] if m.role == "tool"]
    if not results:
        return ""
    names = {call.call_id: call.name for m in messages[index + 1 :] for call in m.tool_calls}
    chinese = bool(_CJK.search(turn))
    parts = []
    for result in results:
        name = names.get(result.tool_call_id, "tool")
        text = " ".join(result.content.split())[:400]
        parts.append(f"{name} 的结果：“{text}”" if chinese else f"{name} says: \u201c{text}\u201d")
    return ("；".join(parts) + "。") if chinese else ("; ".join(parts) + ".")
