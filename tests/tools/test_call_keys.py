"""The idempotency key a tool call is sent with, and kept under, across resumes and versions."""

from __future__ import annotations

from pathlib import Path

from roundtable.domain.tools import CallStatus, ToolCallRecord
from roundtable.store.sqlite import SqliteRunStore


def record(**given: object) -> ToolCallRecord:
    values: dict[str, object] = {
        "tenant": "acme",
        "run_id": "r-1",
        "call_key": "r-1#0/1",
        "reply_id": "r-1#0",
        "n": 1,
        "turn": 1,
        "tool": "note",
        "model_call_id": "c1",
        "arguments_json": "{}",
    }
    return ToolCallRecord(**{**values, **given})  # type: ignore[arg-type]


def test_a_call_goes_under_the_key_it_went_under_before() -> None:
    # Never sent: the key of this version, unique across tenants and runs.
    assert record().key_to_send == "acme/r-1/r-1#0/1"
    # Sent, never answered: the same key again, so a deduplicating server runs it once.
    sent = record(status=CallStatus.STARTED, sent_key="acme/r-1/r-1#0/1")
    assert sent.key_to_send == "acme/r-1/r-1#0/1"
    # Sent by an earlier version, which kept no key and sent the row key: that one again.
    assert record(status=CallStatus.STARTED).key_to_send == "r-1#0/1"


async def test_the_key_a_call_is_sent_with_is_kept_with_it(tmp_path: Path) -> None:
    store = await SqliteRunStore.open(tmp_path / "keys.db")
    try:
        await store.record_tool_calls([record()])
        await store.start_tool_call("acme", "r-1", "r-1#0/1", sent_key="acme/r-1/r-1#0/1")
        kept = await store.tool_call("acme", "r-1", "r-1#0/1")
    finally:
        await store.close()
    assert kept is not None and kept.status is CallStatus.STARTED
    assert kept.sent_key == kept.key_to_send == "acme/r-1/r-1#0/1"
