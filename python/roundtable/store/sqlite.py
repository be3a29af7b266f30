"""The embedded store: one SQLite file in WAL mode, shared with the LangGraph checkpointer.

Two connections to the one file:

- LangGraph's `AsyncSqliteSaver` gets an aiosqlite connection (a thread of its own), as
  LangGraph requires; it writes a checkpoint at plan and round boundaries only.
- The run registry and event log use a plain `sqlite3` connection on the event loop's
  thread. A statement there costs ≈10-20 µs; the same statement through aiosqlite costs
  ≈80 µs, most of it two thread hand-offs (measured in bench/, B1 parts), and a turn makes
  about fifteen of them, each one on the path of an event the gateway is waiting for.
  Both connections are in autocommit mode, so a write lock is held for one statement
  only; `busy_timeout` bounds the rare wait for the saver's statement.

WAL checkpoints (copying the log back into the database file, the fsync-heavy part of
WAL) never run on the loop's thread: that connection has `wal_autocheckpoint=0`, and
every `checkpoint_every` writes the store checkpoints on a worker thread, through a
connection of its own (`SqliteRunStore._checkpoint_wal`). Without them the log would
only grow: the saver, the one connection that checkpoints by itself, writes nothing for a
turn that completes (durability "exit"), and a served turn appends ≈110 KB to the log.

The tables and statements are the ones Postgres runs too (`roundtable.store.schema`,
`roundtable.store.registry`); this module holds what is SQLite's own: the connections and
their pragmas, the checkpoints off the loop, and the lock that keeps a file to one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiosqlite
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from roundtable.domain.errors import InvalidSettings
from roundtable.store.base import CancelMark, LeaseLost, RunRecord, StoredEvent, StoreUnavailable
from roundtable.store.registry import SqlRegistry
from roundtable.store.schema import (
    TABLES,
    ColumnType,
    Dialect,
    add_missing_columns,
    create_indexes,
    create_tables,
    drop_retired_indexes,
)
from roundtable.store.statements import Statements, end_params, event_params
from roundtable.store.tool_calls import SqlToolCalls, ToolStatements

log = logging.getLogger(__name__)

SQLITE = Dialect(
    name="sqlite",
    types={
        ColumnType.TEXT: "TEXT",
        ColumnType.INTEGER: "INTEGER",
        ColumnType.REAL: "REAL",
        ColumnType.BLOB: "BLOB",
    },
    parameter=":{}",
    # The log is read by its key only: without a rowid its rows sit in key order.
    clustered=" WITHOUT ROWID",
)


def _lock_for_this_process(path: Path) -> int | None:
    """Takes `<file>.lock` for as long as this process serves the file, or refuses.

    A SQLite store belongs to one process: at start-up it marks every run left running as
    interrupted, so a second server on the file (a rolling restart that starts the new one
    before the old one has drained) would break the first one's live runs, which could
    then run twice. The lock goes with the process, however it ends.
    """
    if str(path) == ":memory:":
        return None
    # The lock sits beside the file: make the folder first (a fresh clone has no ./var).
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InvalidSettings(
            f"{path} is served by another roundtable process: a SQLite store belongs to one "
            "process (replicas share a Postgres store)"
        ) from None
    return fd


_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA busy_timeout=5000",
    "PRAGMA journal_size_limit=16777216",
)
"""WAL + synchronous=NORMAL: a committed row survives a killed process (not power loss),
at a fraction of FULL's cost per commit. After a checkpoint the log restarts from its
beginning; `journal_size_limit` (16 MiB) truncates a file that once grew larger."""

CHECKPOINT_EVERY = 256
"""Writes between two WAL checkpoints: ≈20 served turns, ≈2-3 MB of log."""
_GATED_PASS_MAX_WRITES = 32
"""Writes made during an ungated pass beyond which another one runs before the gated one."""
_UNGATED_PASSES = 3


def sqlite_path(url: str) -> Path:
    """The file of a SQLite store URL, written as SQLAlchemy and most tools write it.

    `sqlite:///var/rt.db` is the relative path `var/rt.db` (relative to the cwd), and
    `sqlite:////srv/rt.db` (four slashes) is the absolute path `/srv/rt.db`: the URL's
    path after its empty host is taken as it stands.

    Raises:
        InvalidSettings: not a `sqlite:///` URL, or no file named.
    """
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise InvalidSettings(
            f"store: not a SQLite URL: {url!r} (expected sqlite:///relative/file.db "
            "or sqlite:////absolute/file.db)"
        )
    return Path(url[len(prefix) :])


def _not_a_file_path(path: Path) -> str:
    """Why `path` can never be a database file ("" when it may be one): it is a folder, or
    what should be a folder above it is a file. sqlite3 says only "unable to open
    database file" for both."""
    if path.is_dir():
        return f"{path} is a directory, not a database file"
    for parent in path.parents:
        if parent.exists():
            return "" if parent.is_dir() else f"{parent} is not a directory"
    return ""


async def connect_sqlite(path: Path) -> aiosqlite.Connection:
    """Opens the checkpointer's connection to the database file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = await aiosqlite.connect(os.fspath(path), isolation_level=None)
    for pragma in _PRAGMAS:
        await conn.execute(pragma)
    return conn


def connect_log(path: Path) -> sqlite3.Connection:
    """Opens the run registry's and event log's connection, used on the loop's thread."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(os.fspath(path), isolation_level=None, check_same_thread=False)
    for pragma in _PRAGMAS:
        conn.execute(pragma)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    return conn


def _create_schema(conn: sqlite3.Connection) -> None:
    """Creates the tables, adds the columns a file from an earlier version lacks (every
    version's file opens), then the indexes, and drops the retired ones."""
    for statement in create_tables(SQLITE):
        conn.execute(statement)
    for table in TABLES:
        present = [
            row[0] for row in conn.execute("SELECT name FROM pragma_table_info(?)", (table.name,))
        ]
        for statement in add_missing_columns(SQLITE, table, present):
            conn.execute(statement)
    for statement in [*create_indexes(SQLITE), *drop_retired_indexes(SQLITE)]:
        conn.execute(statement)


class SqliteRunStore(SqlRegistry, SqlToolCalls):
    """Run registry and event log in SQLite. Autocommit: each statement is its own commit.

    The methods are coroutines (the `RunStore` protocol) that do not await (a write waits
    only for a WAL checkpoint's short final pass): each is one short statement on the
    loop's thread (see the module docstring for why).
    """

    sql = Statements.for_dialect(SQLITE)
    tool_sql = ToolStatements.for_dialect(SQLITE)

    def __init__(
        self,
        conn: sqlite3.Connection,
        checkpointer: AsyncSqliteSaver,
        *,
        path: Path | None = None,
        checkpoint_every: int = CHECKPOINT_EVERY,
        lock_fd: int | None = None,
    ) -> None:
        self.conn = conn
        self.checkpointer = checkpointer
        """LangGraph's saver on its own aiosqlite connection to the same file."""
        self._path = path
        self._checkpoint_every = checkpoint_every
        self._writes = 0
        self._wal_conn: sqlite3.Connection | None = None
        self._wal_task: asyncio.Task[None] | None = None
        self._wal_gate: asyncio.Event | None = None
        self.wal_checkpoints = 0
        """Checkpoints that copied the whole log back (the next write restarts it)."""
        self._lock_fd = lock_fd
        """The open `<file>.lock` this process holds while it serves the file."""

    async def _before_write(self) -> None:
        """Waits out a checkpoint's final pass, counts the write, starts a checkpoint when due."""
        if self._wal_gate is not None:
            await self._wal_gate.wait()
        self._writes += 1
        if self._writes >= self._checkpoint_every and self._path and self._wal_task is None:
            self._writes = 0
            self._wal_task = asyncio.get_running_loop().create_task(self._checkpoint_wal())

    async def _checkpoint_wal(self) -> None:
        """Copies the WAL back into the file, so that the next write restarts the log.

        The log restarts (instead of growing) only at a write that finds it wholly copied
        back. A first pass copies the bulk while writes go on (and, when many came in
        meanwhile, up to two more, each shorter). A last pass copies the rest while the
        store's writes wait for it (`_before_write`: they await, the loop runs on; ≈1-3 ms,
        a few pages and one fsync of the file, every `checkpoint_every` writes). A reader
        holding an old snapshot (the saver's connection mid-read) blocks a full copy: the
        log then waits for the next checkpoint.
        """
        try:
            for _ in range(_UNGATED_PASSES):
                self._writes = 0
                frames, _copied = await asyncio.to_thread(self._passive_checkpoint)
                if frames == 0:
                    return  # the log is empty: it restarted already
                if self._writes <= _GATED_PASS_MAX_WRITES:
                    break  # little to copy under the gate; else another pass, shorter
            self._wal_gate = asyncio.Event()
            try:
                frames, copied = await asyncio.to_thread(self._passive_checkpoint)
            finally:
                self._wal_gate.set()
                self._wal_gate = None
            if copied == frames:
                self.wal_checkpoints += 1
        except Exception:
            # A failed checkpoint leaves the log as it was; the next one retries.
            log.warning("SQLite WAL checkpoint failed", exc_info=True)
        finally:
            self._wal_task = None

    def _passive_checkpoint(self) -> tuple[int, int]:
        """(frames in the log, frames copied back), or (1, 0) when it could not run (busy)."""
        # A connection of its own, used by one worker thread at a time (one checkpoint at a
        # time): the loop's connection never waits for the disk.
        if self._wal_conn is None:
            assert self._path is not None
            self._wal_conn = sqlite3.connect(
                os.fspath(self._path), isolation_level=None, check_same_thread=False
            )
            for pragma in _PRAGMAS:
                self._wal_conn.execute(pragma)
        (busy, frames, copied), *_ = self._wal_conn.execute(
            "PRAGMA wal_checkpoint(PASSIVE)"
        ).fetchall()
        return (1, 0) if busy else (frames, copied)

    @classmethod
    async def open(cls, path: Path, *, checkpoint_every: int = CHECKPOINT_EVERY) -> SqliteRunStore:
        """Opens (and creates) the store and the checkpoint tables in a database file.

        Raises:
            InvalidSettings: another process serves the file.
            StoreUnavailable: the path cannot be a database file, or the file is not one.
        """
        problem = _not_a_file_path(path)
        if problem:
            # Before the lock: a lock file beside a folder would outlive the mistake.
            raise StoreUnavailable(problem)
        try:
            lock_fd = _lock_for_this_process(path)
        except OSError as exc:
            raise StoreUnavailable(f"cannot open it: {exc.strerror or exc}") from None
        try:
            conn = connect_log(path)
            _create_schema(conn)
            saver = AsyncSqliteSaver(await connect_sqlite(path))
            await saver.setup()
        except BaseException as exc:
            if lock_fd is not None:
                os.close(lock_fd)  # not served after all
            if isinstance(exc, OSError | sqlite3.Error):
                # sqlite3's own words ("file is not a database"), or the OS's.
                why = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
                raise StoreUnavailable(f"cannot open it: {why}") from None
            raise
        return cls(conn, saver, path=path, checkpoint_every=checkpoint_every, lock_fd=lock_fd)

    async def _write(self, sql: str, params: Mapping[str, Any]) -> int:
        await self._before_write()
        return int(self.conn.execute(sql, params).rowcount)

    async def _read(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        return self.conn.execute(sql, params).fetchall()

    async def append_event(
        self, tenant: str, run_id: str, event: StoredEvent, *, owner: str | None = None
    ) -> CancelMark | None:
        # No fence: the file is this process's alone (start-up marks a dead one's runs).
        await self._write(
            self.sql.append_event, event_params(tenant, run_id, event.seq, event.kind, event.body)
        )
        return None  # the file is this process's: its cancels never go through the row

    async def end_run(self, record: RunRecord, holder: str, event: StoredEvent) -> None:
        # Two statements, one commit: the commit, not the statement, is what a write costs
        # here (measured: a served turn spends ≈1 % of its time per commit).
        await self._before_write()
        record.updated_at = time.time()
        params = end_params(record, holder, event)
        conn = self.conn
        conn.execute("BEGIN")
        try:
            ours = conn.execute(self.sql.finish_run, params).rowcount == 1
            if ours:
                conn.execute(self.sql.append_event, params)
            conn.execute("COMMIT" if ours else "ROLLBACK")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if not ours:
            raise LeaseLost(record.run_id)

    @contextlib.asynccontextmanager
    async def thread_lock(self, tenant: str, thread_id: str) -> AsyncIterator[None]:
        """A no-op: the file belongs to one process, whose RunManager serializes starts."""
        yield

    async def mark_interrupted(self, *, expired_for_s: float = 0.0) -> list[tuple[str, str]]:
        await self._before_write()
        cursor = self.conn.execute(
            # The file belongs to this process: whoever held these runs is gone.
            "UPDATE rt_runs SET status='interrupted', owner='', lease_until=0, updated_at=:now "
            "WHERE status IN ('running','queued') RETURNING tenant, run_id",
            {"now": time.time()},
        )
        return [(tenant, run_id) for tenant, run_id in cursor.fetchall()]

    @property
    def shared(self) -> bool:
        return False

    async def close(self) -> None:
        self._path = None  # no checkpoint starts from here on
        while self._wal_task is not None:
            await asyncio.gather(self._wal_task, return_exceptions=True)
        if self._wal_conn is not None:
            self._wal_conn.close()
        self.conn.close()
        # The saver's connection closes last: the last connection out folds the WAL back.
        await self.checkpointer.conn.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # lets the next process have the file
            self._lock_fd = None
