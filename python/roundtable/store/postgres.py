"""The shared store: run registry, event log and LangGraph checkpoints in one Postgres.

Several replicas use it at once. A lease on each live run (owner, expiry, renewed while
running) keeps two replicas from executing one run; a cancel recorded here reaches the
replica that owns the run.

The tables and most statements are the ones SQLite runs too (`roundtable.store.schema`,
`roundtable.store.registry`). What only a shared database needs lives here:

- a connection pool (autocommit, dict rows: what LangGraph's saver asks of a shared pool);
- the thread lock (`thread_lock`): a transaction-level advisory lock per thread, so two
  replicas never start runs of one thread at once;
- the owner fence: an append names the run's owner and is refused (`LeaseLost`) once
  another replica took the run over, checked under a row lock in the same statement;
  each append also reads the cancel recorded on the run's row, in the same round trip;
- start-up marks only runs whose lease expired (other replicas' live runs are theirs).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import psycopg
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from roundtable.domain.errors import ThreadBusy
from roundtable.store.base import CancelMark, LeaseLost, RunRecord, StoredEvent, StoreUnavailable
from roundtable.store.registry import SqlRegistry
from roundtable.store.schema import (
    INDEXES,
    TABLES,
    ColumnType,
    Dialect,
    add_missing_columns,
    create_indexes,
    create_tables,
    drop_retired_indexes,
)
from roundtable.store.statements import (
    EVENT_COLUMNS,
    EVENT_VALUES,
    FINISH_RUN,
    Statements,
    end_params,
    event_params,
)
from roundtable.store.tool_calls import SqlToolCalls, ToolStatements

POSTGRES = Dialect(
    name="postgres",
    types={
        ColumnType.TEXT: "TEXT",
        ColumnType.INTEGER: "BIGINT",
        ColumnType.REAL: "DOUBLE PRECISION",
        ColumnType.BLOB: "BYTEA",
    },
    parameter="%({})s",
    # IF NOT EXISTS: two replicas starting at once may both find a column missing.
    add_column="ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}",
    # CONCURRENTLY: replicas of the earlier version go on writing rt_runs meanwhile (a plain
    # CREATE INDEX holds the table's SHARE lock for a scan of every run, DROP INDEX its
    # ACCESS EXCLUSIVE lock). The pool is autocommit, as it must be: CONCURRENTLY cannot
    # run inside a transaction.
    create_index="CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({columns}){where}",
    drop_index="DROP INDEX CONCURRENTLY IF EXISTS {name}",
)

_APPEND_READ_CANCEL = POSTGRES.bind(
    # One round trip: the append, and the run's cancel marks as of it.
    f"WITH appended AS (INSERT INTO rt_events ({EVENT_COLUMNS}) VALUES ({EVENT_VALUES})) "
    "SELECT cancel_mode, cancel_reason FROM rt_runs WHERE tenant=:tenant AND run_id=:run_id"
)
_APPEND_OWNED = POSTGRES.bind(
    # The same, only while the row names the owner (the owner fence). FOR SHARE orders it
    # with a takeover's UPDATE of the owner: the append waits for it and then sees the new
    # owner, or the takeover waits for the append, whose row its log read then sees. No
    # row back: another replica owns the run, nothing written.
    "WITH run AS (SELECT cancel_mode, cancel_reason FROM rt_runs "
    "WHERE tenant=:tenant AND run_id=:run_id AND owner=:owner FOR SHARE), "
    f"appended AS (INSERT INTO rt_events ({EVENT_COLUMNS}) SELECT {EVENT_VALUES} FROM run) "
    "SELECT cancel_mode, cancel_reason FROM run"
)

_END_RUN = POSTGRES.bind(
    # One round trip: the final row, and the terminal event only with it. The UPDATE's row
    # lock orders it with a takeover's UPDATE of the owner, as the append's FOR SHARE does.
    f"WITH finished AS ({FINISH_RUN} RETURNING run_id) "
    f"INSERT INTO rt_events ({EVENT_COLUMNS}) SELECT {EVENT_VALUES} FROM finished"
)

_SCHEMA_LOCK_KEY = "hashtext(current_schema() || '/roundtable schema')"
_SCHEMA_LOCK = f"SELECT pg_try_advisory_lock({_SCHEMA_LOCK_KEY}) AS held"
_SCHEMA_UNLOCK = f"SELECT pg_advisory_unlock({_SCHEMA_LOCK_KEY})"

_INVALID_INDEXES = (
    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND NOT i.indisvalid"
)

THREAD_LOCK_TIMEOUT_S = 5.0
"""Longest wait for another replica's start of a run of the same thread."""


CONNECT_TIMEOUT_S = 10
"""How long a connection may take when the DSN sets no `connect_timeout` (libpq's own
parameter, which wins): libpq's default is to wait for the OS, minutes for a host that
drops packets, and the pool's own default wait is 30 s before a bare PoolTimeout."""


def _connect_timeout(dsn: str) -> dict[str, Any]:
    """The connection argument that bounds a connect, unless the DSN bounds it itself."""
    try:
        given = "connect_timeout" in conninfo_to_dict(dsn)
    except psycopg.Error:
        given = False  # the connect says what is wrong with the DSN
    return {} if given else {"connect_timeout": CONNECT_TIMEOUT_S}


async def _probe(dsn: str) -> None:
    """Connects once, so that a server not reached fails at once with libpq's reason (the
    pool would retry in the background for 30 s, then say only "pool initialization
    incomplete").

    Raises:
        StoreUnavailable: no connection within the connect timeout, or a refused one.
    """
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, **_connect_timeout(dsn))
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect: {_said(exc, dsn)}") from None
    await conn.close()


def _said(exc: BaseException, dsn: str) -> str:
    """What a driver error says, on one line and without the DSN's password (libpq's
    messages name hosts, ports, users and databases; a password only by accident)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    try:
        password = urlsplit(dsn).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


async def _create_schema(conn: psycopg.AsyncConnection[Any]) -> None:
    """Creates the tables, adds the columns a table from an earlier version lacks, then the
    indexes, and drops the retired ones. Columns are looked up first, so a replica starting
    next to running ones takes no ACCESS EXCLUSIVE lock.

    One replica at a time (a session advisory lock per schema): two concurrent index
    builds can wait for each other, and an index another replica is building looks like
    the invalid leftover of a failed build. The lock is polled in short statements: a
    blocking wait would hold a snapshot, which a concurrent index build waits out.
    """
    while True:
        row = await (await conn.execute(_SCHEMA_LOCK)).fetchone()
        if row is not None and row["held"]:
            break
        await asyncio.sleep(0.05)
    try:
        await _create_schema_locked(conn)
    finally:
        await conn.execute(_SCHEMA_UNLOCK)


async def _create_schema_locked(conn: psycopg.AsyncConnection[Any]) -> None:
    for statement in create_tables(POSTGRES):
        await conn.execute(statement)
    for table in TABLES:
        cursor = await conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %(table)s",
            {"table": table.name},
        )
        present = [row["column_name"] for row in await cursor.fetchall()]
        for statement in add_missing_columns(POSTGRES, table, present):
            await conn.execute(statement)
    # A concurrent build that failed (its replica died) leaves an invalid index that IF NOT
    # EXISTS would keep for good: dropped first, then built again. Under the lock, no
    # other replica of this version is building one now.
    cursor = await conn.execute(_INVALID_INDEXES)
    invalid = {row["relname"] for row in await cursor.fetchall()} & {i.name for i in INDEXES}
    drops = [POSTGRES.drop_index.format(name=name) for name in sorted(invalid)]
    for statement in [*drops, *create_indexes(POSTGRES), *drop_retired_indexes(POSTGRES)]:
        await conn.execute(statement)


class PostgresRunStore(SqlRegistry, SqlToolCalls):
    """Run registry and event log in Postgres, over one async connection pool."""

    sql = Statements.for_dialect(POSTGRES)
    tool_sql = ToolStatements.for_dialect(POSTGRES)

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
        """Connects, creates our tables and LangGraph's, and returns the store.

        Raises:
            StoreUnavailable: the server cannot be reached within the connect timeout, or
                refuses us (authentication, no such database, no right to create tables).
        """
        await _probe(dsn)
        # autocommit + dict rows: what LangGraph's saver requires of a shared pool; every
        # statement of ours is its own transaction too.
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            kwargs={
                "autocommit": True,
                "prepare_threshold": 0,
                "row_factory": dict_row,
                **_connect_timeout(dsn),
            },
            open=False,
        )
        try:
            await pool.open(wait=True)
            async with pool.connection() as conn:
                await _create_schema(conn)
            saver = AsyncPostgresSaver(pool)
            await saver.setup()
        except (psycopg.Error, PoolTimeout) as exc:
            await pool.close()
            raise StoreUnavailable(f"cannot set it up: {_said(exc, dsn)}") from None
        except BaseException:
            await pool.close()
            raise
        return cls(pool, saver, thread_lock_timeout_s=thread_lock_timeout_s)

    async def _write(self, sql: str, params: Mapping[str, Any]) -> int:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(sql, params)
            return int(cursor.rowcount)

    async def _read(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        # Tuples, as sqlite3 gives them: the pool's rows are dicts (LangGraph's saver's need).
        async with self.pool.connection() as conn:
            cursor = conn.cursor(row_factory=tuple_row)
            await cursor.execute(sql, params)
            rows: list[tuple[Any, ...]] = await cursor.fetchall()
            return rows

    async def append_event(
        self, tenant: str, run_id: str, event: StoredEvent, *, owner: str | None = None
    ) -> CancelMark | None:
        params = event_params(tenant, run_id, event.seq, event.kind, event.body)
        if owner is None:
            rows = await self._read(_APPEND_READ_CANCEL, params)
        else:
            rows = await self._read(_APPEND_OWNED, {**params, "owner": owner})
            if not rows:
                raise LeaseLost(run_id)
        if not rows or not rows[0][0]:
            return None
        mode, reason = rows[0]
        return CancelMark(mode, reason)

    async def end_run(self, record: RunRecord, holder: str, event: StoredEvent) -> None:
        record.updated_at = time.time()
        if not await self._write(_END_RUN, end_params(record, holder, event)):
            raise LeaseLost(record.run_id)

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

    async def mark_interrupted(self, *, expired_for_s: float = 0.0) -> list[tuple[str, str]]:
        now = time.time()
        rows = await self._read(
            # The owner goes too: a replica that was only late to renew (a pause) then
            # finds the run is not its own any more (LeaseLost) instead of running on
            # under an 'interrupted' row nobody else can cancel or see.
            "UPDATE rt_runs SET status='interrupted', owner='', lease_until=0, updated_at=%(now)s "
            "WHERE status IN ('running','queued') AND lease_until<%(expired)s "
            "RETURNING tenant, run_id",
            {"now": now, "expired": now - expired_for_s},
        )
        return [(tenant, run_id) for tenant, run_id in rows]

    @property
    def shared(self) -> bool:
        return True

    async def close(self) -> None:
        await self.pool.close()
