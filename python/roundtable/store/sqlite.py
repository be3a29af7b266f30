"""The embedded store: one SQLite file in WAL mode, shared with the LangGraph checkpointer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import aiosqlite
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from roundtable.store.base import RUN_COLUMNS, RunRecord, StoredEvent, run_from_row, run_row

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rt_runs (
    tenant TEXT NOT NULL,
    run_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    plan_json TEXT NOT NULL DEFAULT '[]',
    finished_reply_ids TEXT NOT NULL DEFAULT '[]',
    last_seq INTEGER NOT NULL DEFAULT 0,
    trace_context TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT '',
    lease_until REAL NOT NULL DEFAULT 0,
    cancel_mode TEXT NOT NULL DEFAULT '',
    cancel_reason TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (tenant, run_id)
);
CREATE INDEX IF NOT EXISTS rt_runs_thread ON rt_runs (tenant, thread_id, created_at);
CREATE TABLE IF NOT EXISTS rt_events (
    tenant TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (tenant, run_id, seq)
) WITHOUT ROWID;
"""


def sqlite_path(url: str) -> Path:
    """The file of a `sqlite:///path` URL (relative paths are relative to the cwd)."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise ValueError(f"not a sqlite URL: {url!r} (expected sqlite:///path/to/file.db)")
    return Path(url[len(prefix) :])


async def connect_sqlite(path: Path) -> aiosqlite.Connection:
    """Opens the database file with the settings durability needs and speed allows.

    WAL + synchronous=NORMAL: a committed row survives a killed process (not power loss),
    at a fraction of FULL's cost per commit.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = await aiosqlite.connect(os.fspath(path), isolation_level=None)
    await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute("PRAGMA synchronous=NORMAL")
    await conn.execute("PRAGMA busy_timeout=5000")
    return conn


_COLUMNS = ", ".join(RUN_COLUMNS)
_PLACEHOLDERS = ",".join("?" * len(RUN_COLUMNS))


class SqliteRunStore:
    """Run registry and event log in SQLite. Autocommit: each statement is its own commit."""

    def __init__(self, conn: aiosqlite.Connection, checkpointer: AsyncSqliteSaver) -> None:
        self.conn = conn
        self.checkpointer = checkpointer
        """LangGraph's saver on the same connection: one file, one writer thread."""

    @classmethod
    async def open(cls, path: Path) -> SqliteRunStore:
        """Opens (and creates) the store and the checkpoint tables in a database file."""
        conn = await connect_sqlite(path)
        await conn.executescript(_SCHEMA)
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        return cls(conn, saver)

    async def create_run(self, record: RunRecord) -> bool:
        cursor = await self.conn.execute(
            f"INSERT INTO rt_runs ({_COLUMNS}) VALUES ({_PLACEHOLDERS}) "
            "ON CONFLICT (tenant, run_id) DO NOTHING",
            run_row(record),
        )
        return cursor.rowcount == 1

    async def get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        async with self.conn.execute(
            f"SELECT {_COLUMNS} FROM rt_runs WHERE tenant=? AND run_id=?", (tenant, run_id)
        ) as cursor:
            row = await cursor.fetchone()
        return run_from_row(row) if row else None

    async def update_run(self, record: RunRecord) -> None:
        record.updated_at = time.time()
        await self.conn.execute(
            "UPDATE rt_runs SET status=?, plan_json=?, finished_reply_ids=?, last_seq=?, "
            "updated_at=? WHERE tenant=? AND run_id=?",
            (
                record.status.value,
                record.plan_json,
                json.dumps(record.finished_reply_ids),
                record.last_seq,
                record.updated_at,
                record.tenant,
                record.run_id,
            ),
        )

    async def append_event(self, tenant: str, run_id: str, event: StoredEvent) -> None:
        await self.conn.execute(
            "INSERT INTO rt_events (tenant, run_id, seq, kind, body) VALUES (?,?,?,?,?)",
            (tenant, run_id, event.seq, event.kind, event.body),
        )

    async def read_events(self, tenant: str, run_id: str, after_seq: int) -> list[StoredEvent]:
        async with self.conn.execute(
            "SELECT seq, kind, body FROM rt_events WHERE tenant=? AND run_id=? AND seq>? "
            "ORDER BY seq",
            (tenant, run_id, after_seq),
        ) as cursor:
            rows = await cursor.fetchall()
        return [StoredEvent(r[0], r[1], bytes(r[2])) for r in rows]

    async def latest_resumable(self, tenant: str, thread_id: str) -> RunRecord | None:
        async with self.conn.execute(
            f"SELECT {_COLUMNS} FROM rt_runs WHERE tenant=? AND thread_id=? "
            "AND status IN ('cancelled','interrupted') ORDER BY created_at DESC LIMIT 1",
            (tenant, thread_id),
        ) as cursor:
            row = await cursor.fetchone()
        return run_from_row(row) if row else None

    async def mark_interrupted(self) -> int:
        cursor = await self.conn.execute(
            # The file belongs to this process: whoever held these runs is gone.
            "UPDATE rt_runs SET status='interrupted', owner='', lease_until=0, updated_at=? "
            "WHERE status IN ('running','queued')",
            (time.time(),),
        )
        return cursor.rowcount

    async def acquire_lease(self, tenant: str, run_id: str, owner: str, ttl_s: float) -> bool:
        now = time.time()
        cursor = await self.conn.execute(
            "UPDATE rt_runs SET owner=?, lease_until=? WHERE tenant=? AND run_id=? "
            "AND (owner='' OR owner=? OR lease_until<?)",
            (owner, now + ttl_s, tenant, run_id, owner, now),
        )
        return cursor.rowcount == 1

    async def renew_lease(self, tenant: str, run_id: str, owner: str, ttl_s: float) -> bool:
        cursor = await self.conn.execute(
            "UPDATE rt_runs SET lease_until=? WHERE tenant=? AND run_id=? AND owner=?",
            (time.time() + ttl_s, tenant, run_id, owner),
        )
        return cursor.rowcount == 1

    async def release_lease(self, tenant: str, run_id: str, owner: str) -> None:
        await self.conn.execute(
            "UPDATE rt_runs SET owner='', lease_until=0, cancel_mode='', cancel_reason='' "
            "WHERE tenant=? AND run_id=? AND owner=?",
            (tenant, run_id, owner),
        )

    async def request_cancel(self, tenant: str, run_id: str, mode: str, reason: str) -> None:
        await self.conn.execute(
            "UPDATE rt_runs SET cancel_mode=?, cancel_reason=? WHERE tenant=? AND run_id=?",
            (mode, reason, tenant, run_id),
        )

    @property
    def shared(self) -> bool:
        return False

    async def count_rows(self) -> int:
        async with self.conn.execute(
            "SELECT (SELECT COUNT(*) FROM rt_runs) + (SELECT COUNT(*) FROM rt_events)"
            " + (SELECT COUNT(*) FROM checkpoints) + (SELECT COUNT(*) FROM writes)"
        ) as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def close(self) -> None:
        await self.conn.close()
