"""`ToolCallAccumulator` on fragments no scripted server sends, and the OpenAI formats."""

from __future__ import annotations

import pytest
from roundtable.models.base import ChatMessage, ModelToolCall, ToolSpec
from roundtable.models.tool_calls import ToolCallAccumulator, openai_messages, openai_tools


def test_a_split_name_is_joined_and_fragments_without_an_index_continue_the_latest() -> None:
    calls = ToolCallAccumulator()
    calls.add(None, "a", "get_", "")
    calls.add(None, None, "weather", '{"city"')
    calls.add(None, None, None, ': "Oslo"}')
    calls.add(None, "b", "clock", "{}")  # another id: another call

    assert calls.calls() == (
        ModelToolCall("a", "get_weather", '{"city": "Oslo"}'),
        ModelToolCall("b", "clock", "{}"),
    )


def test_an_id_arriving_late_is_kept_and_an_empty_fragment_is_no_call() -> None:
    calls = ToolCallAccumulator()
    calls.add(0, None, "weather", "{")
    calls.add(0, "late", None, "}")
    calls.add(1, None, None, None)

    assert calls.calls() == (ModelToolCall("late", "weather", "{}"),)


def test_whole_message_entries_read_as_dicts_with_the_id_in_function() -> None:
    calls = ToolCallAccumulator()
    entry = {"function": {"id": "f1", "name": "weather", "arguments": "{}"}}
    calls.add_openai(entry, index=0)
    calls.add_openai({"id": "c2", "function": {"name": "weather", "arguments": "{}"}}, index=1)

    assert calls.calls() == (
        ModelToolCall("f1", "weather", "{}"),
        ModelToolCall("c2", "weather", "{}"),
    )


def test_tools_need_an_object_schema() -> None:
    assert openai_tools([ToolSpec("t", "", "")]) == [
        {"type": "function", "function": {"name": "t", "parameters": {}}}
    ]
    with pytest.raises(ValueError, match="not a JSON object"):
        openai_tools([ToolSpec("t", "", "[]")])


def test_plain_messages_keep_their_openai_shape() -> None:
    assert openai_messages(
        [ChatMessage("system", "s"), ChatMessage("user", "u"), ChatMessage("assistant", "a")]
    ) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]
