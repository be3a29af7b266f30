"""The shared store: run registry, event log and LangGraph checkpoints in one Postgres.

Several replicas use it at once. A lease on each live run (owner, expiry, renewed while
running) keeps two replicas from executing one run; a cancel recorded here reaches the
replica that owns the run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from roundtable.domain.errors import ThreadBusy
from roundtable.store.base import (
    RUN_COLUMNS,
    CancelMark,
    LeaseLost,
    RunRecord,
    StoredEvent,
    run_from_row,
    run_row,
)
from roundtable.store.statements import (
    Statements,
    acquire_params,
    finish_params,
    update_params,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rt_runs (
    tenant TEXT NOT NULL,
    run_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    plan_json TEXT NOT NULL DEFAULT '[]',
    finished_reply_ids TEXT NOT NULL DEFAULT '[]',
    last_seq BIGINT NOT NULL DEFAULT 0,
    trace_context TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT '',
    lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,
    cancel_mode TEXT NOT NULL DEFAULT '',
    cancel_reason TEXT NOT NULL DEFAULT '',
    continued_by TEXT NOT NULL DEFAULT '',
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, run_id)
);
CREATE INDEX IF NOT EXISTS rt_runs_thread ON rt_runs (tenant, thread_id, created_at);
CREATE TABLE IF NOT EXISTS rt_events (
    tenant TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    body BYTEA NOT NULL,
    PRIMARY KEY (tenant, run_id, seq)
);
"""

_ADDED_COLUMNS = {
    "continued_by": "ALTER TABLE rt_runs ADD COLUMN IF NOT EXISTS continued_by TEXT NOT NULL "
    "DEFAULT ''",
}
"""Columns added since the first schema: a table made before gets them at open. Looked up
first, so a replica starting next to running ones takes no ACCESS EXCLUSIVE lock."""
_INDEXES = "CREATE INDEX IF NOT EXISTS rt_runs_continued ON rt_runs (tenant, continued_by)"

_SQL = Statements.with_placeholder("%s")

THREAD_LOCK_TIMEOUT_S = 5.0
"""Longest wait for another replica's start of a run of the same thread."""


class PostgresRunStore:
    """Run registry and event log in Postgres, over one async connection pool."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        checkpointer: AsyncPostgresSaver,
        *,
        thread_lock_timeout_s: float = THREAD_LOCK_TIMEOUT_S,
    ) -> None:
        self.pool = pool
        self.checkpointer = checkpointer
        self.thread_lock_timeout_s = thread_lock_timeout_s

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        max_size: int = 10,
        thread_lock_timeout_s: float = THREAD_LOCK_TIMEOUT_S,
    ) -> PostgresRunStore:
        """Connects, creates our tables and LangGraph's, and returns the store."""
        # autocommit + dict rows: what LangGraph's saver requires of a shared pool; every
        # statement of ours is its own transaction too.
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=False,
        )
        await pool.open(wait=True)
        async with pool.connection() as conn:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                await conn.execute(statement)
            cursor = await conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = 'rt_runs'"
            )
            present = {row["column_name"] for row in await cursor.fetchall()}
            for column, statement in _ADDED_COLUMNS.items():
                if column not in present:
                    await conn.execute(statement)
            await conn.execute(_INDEXES)
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        return cls(pool, saver, thread_lock_timeout_s=thread_lock_timeout_s)

    async def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(sql, params)
            return int(cursor.rowcount)

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(sql, params)
            return list(await cursor.fetchall())

    async def create_run(self, record: RunRecord) -> bool:
        return await self._execute(_SQL.create_run, run_row(record)) == 1

    async def get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        rows = await self._fetch(_SQL.get_run, (tenant, run_id))
        return run_from_row([rows[0][c] for c in RUN_COLUMNS]) if rows else None

    async def update_run(self, record: RunRecord) -> None:
        record.updated_at = time.time()
        await self._execute(_SQL.update_run, update_params(record))

    async def append_event(
        self, tenant: str, run_id: str, event: StoredEvent, *, owner: str | None = None
    ) -> CancelMark | None:
        values = (tenant, run_id, event.seq, event.kind, event.body)
        if owner is None:
            rows = await self._fetch(_SQL.append_event_read_cancel, (*values, tenant, run_id))
        else:
            rows = await self._fetch(_SQL.append_event_owned, (tenant, run_id, owner, *values))
            if not rows:
                raise LeaseLost(run_id)
        if not rows or not rows[0]["cancel_mode"]:
            return None
        return CancelMark(rows[0]["cancel_mode"], rows[0]["cancel_reason"])

    async def read_events(self, tenant: str, run_id: str, after_seq: int) -> list[StoredEvent]:
        rows = await self._fetch(_SQL.read_events, (tenant, run_id, after_seq))
        return [StoredEvent(r["seq"], r["kind"], bytes(r["body"])) for r in rows]

    async def resumable_runs(
        self, tenant: str, thread_id: str, *, exclude_run_id: str = "", limit: int = 1
    ) -> list[RunRecord]:
        rows = await self._fetch(_SQL.resumable_runs, (tenant, thread_id, exclude_run_id, limit))
        return [run_from_row([row[c] for c in RUN_COLUMNS]) for row in rows]

    async def live_thread_runs(
        self, tenant: str, thread_id: str, *, exclude_run_id: str, owner: str, now: float
    ) -> list[RunRecord]:
        rows = await self._fetch(
            _SQL.live_thread_runs, (tenant, thread_id, exclude_run_id, owner, now)
        )
        return [run_from_row([row[c] for c in RUN_COLUMNS]) for row in rows]

    @contextlib.asynccontextmanager
    async def thread_lock(self, tenant: str, thread_id: str) -> AsyncIterator[None]:
        """A Postgres advisory lock on the thread, held by a transaction of one pooled
        connection.

        Transaction-level: it ends with the transaction however the block exits (the pool
        rolls back a connection handed back mid-transaction, e.g. when the StartRun is
        cancelled while waiting), and with the connection should this process die. The
        statements inside use other connections: the lock only orders the replicas. A
        wait longer than `thread_lock_timeout_s` (another replica stuck mid-start) answers
        ThreadBusy rather than holding the caller.
        """
        # One round trip takes it: BEGIN, the wait's bound (SET LOCAL: this transaction
        # only) and the lock, sent as one simple query, which runs its statements in
        # order; one more ends it. Every turn takes this lock, and each round trip costs
        # about half a millisecond of this process's time (four before, with a statement
        # each). Literals, not parameters: the simple protocol takes none.
        acquire = sql.SQL(
            "BEGIN; SET LOCAL lock_timeout = {}; "
            "SELECT pg_advisory_xact_lock(hashtextextended({}, 0))"
        ).format(
            sql.Literal(f"{round(self.thread_lock_timeout_s * 1000)}ms"),
            sql.Literal(f"{tenant}/{thread_id}"),
        )
        async with self.pool.connection() as conn:
            try:
                await conn.execute(acquire, prepare=False)
            except psycopg.errors.LockNotAvailable:
                await conn.execute("ROLLBACK")
                raise ThreadBusy(f"thread {thread_id!r} is being started elsewhere") from None
            try:
                yield
            finally:
                # Nothing was written in this transaction: ending it only frees the lock.
                # COMMIT, not ROLLBACK: measured ≈0.1 ms cheaper a turn through the pool.
                await conn.execute("COMMIT")

    async def claim_continuation(self, tenant: str, run_id: str, by_run_id: str) -> bool:
        now = time.time()
        params = (by_run_id, now, tenant, run_id, now)
        return await self._execute(_SQL.claim_continuation, params) == 1

    async def continued_run(self, tenant: str, by_run_id: str) -> RunRecord | None:
        rows = await self._fetch(_SQL.continued_run, (tenant, by_run_id))
        return run_from_row([rows[0][c] for c in RUN_COLUMNS]) if rows else None

    async def mark_interrupted(self) -> list[tuple[str, str]]:
        now = time.time()
        rows = await self._fetch(
            # The owner goes too: a replica that was only late to renew (a pause) then
            # finds the run is not its own any more (LeaseLost) instead of running on
            # under an 'interrupted' row nobody else can cancel or see.
            "UPDATE rt_runs SET status='interrupted', owner='', lease_until=0, updated_at=%s "
            "WHERE status IN ('running','queued') AND lease_until<%s RETURNING tenant, run_id",
            (now, now),
        )
        return [(row["tenant"], row["run_id"]) for row in rows]

    async def acquire_lease(self, tenant: str, run_id: str, owner: str, ttl_s: float) -> bool:
        params = acquire_params(tenant, run_id, owner, ttl_s, time.time())
        return await self._execute(_SQL.acquire_lease, params) == 1

    async def renew_lease(self, tenant: str, run_id: str, owner: str, ttl_s: float) -> bool:
        params = (time.time() + ttl_s, tenant, run_id, owner)
        return await self._execute(_SQL.renew_lease, params) == 1

    async def finish_run(self, record: RunRecord, owner: str) -> bool:
        record.updated_at = time.time()
        return await self._execute(_SQL.finish_run, finish_params(record, owner)) == 1

    async def request_cancel(self, tenant: str, run_id: str, mode: str, reason: str) -> bool:
        return await self._execute(_SQL.request_cancel, (mode, reason, tenant, run_id)) == 1

    async def count_rows(self) -> int:
        rows = await self._fetch(
            "SELECT (SELECT COUNT(*) FROM rt_runs) + (SELECT COUNT(*) FROM rt_events)"
            " + (SELECT COUNT(*) FROM checkpoints) + (SELECT COUNT(*) FROM checkpoint_writes)"
            " AS n",
            (),
        )
        return int(rows[0]["n"])

    @property
    def shared(self) -> bool:
        return True

    async def close(self) -> None:
        await self.pool.close()
