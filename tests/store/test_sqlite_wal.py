"""The SQLite store keeps its write-ahead log bounded while writes go on."""

from __future__ import annotations

import asyncio
from pathlib import Path

from roundtable.store.base import StoredEvent
from roundtable.store.sqlite import SqliteRunStore


def size(path: Path) -> int:
    return path.stat().st_size


async def test_the_log_is_copied_back_and_restarts_under_continuous_writes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "roundtable.db"
    store = await SqliteRunStore.open(db, checkpoint_every=100)
    body = b"x" * 400
    try:
        for seq in range(1, 3001):
            await store.append_event("acme", "run-1", StoredEvent(seq, "assistant_final", body))
            if seq % 10 == 0:
                await asyncio.sleep(0)  # a served turn yields between its writes too
        # Each autocommitted event is at least one 4 KiB page in the log: ≈12 MB unbounded.
        assert size(db.with_name(db.name + "-wal")) < 2 * 1024 * 1024
        assert store.wal_checkpoints >= 10
        assert size(db) > 1024 * 1024, "the events reached the database file"
        events = await store.read_events("acme", "run-1", 0)
        assert [e.seq for e in events] == list(range(1, 3001))
    finally:
        await store.close()
    # Reopened, the file holds every event.
    store = await SqliteRunStore.open(db)
    try:
        assert len(await store.read_events("acme", "run-1", 0)) == 3000
    finally:
        await store.close()
