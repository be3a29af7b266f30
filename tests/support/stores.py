"""Test databases: a fresh SQLite file or a fresh Postgres schema per test, rt_runs as an
older version made it, and ways to read back what a store wrote (every byte, for the
secret-canary checks; its rows, counted)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from roundtable.store.base import RunRecord, RunStatus
from roundtable.store.postgres import PostgresRunStore
from roundtable.store.sqlite import SqliteRunStore

DSN_VARIABLE = "ROUNDTABLE_TEST_POSTGRES_DSN"

OLD_RT_RUNS = (
    "CREATE TABLE rt_runs (tenant TEXT NOT NULL, run_id TEXT NOT NULL, thread_id TEXT NOT"
    " NULL, fingerprint TEXT NOT NULL, status TEXT NOT NULL, plan_json TEXT NOT NULL DEFAULT"
    " '[]', finished_reply_ids TEXT NOT NULL DEFAULT '[]', last_seq INTEGER NOT NULL DEFAULT"
    " 0, trace_context TEXT NOT NULL DEFAULT '', owner TEXT NOT NULL DEFAULT '', lease_until"
    " REAL NOT NULL DEFAULT 0, cancel_mode TEXT NOT NULL DEFAULT '', cancel_reason TEXT NOT"
    " NULL DEFAULT '', created_at REAL NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY"
    " (tenant, run_id))"
)
"""rt_runs as versions before `continued_by` made it (the same on SQLite and Postgres)."""

OLD_PARKED_INDEX = "CREATE INDEX rt_runs_parked ON rt_runs (status, owner)"
"""The parked runs' index as versions before `rt_runs_awaiting` made it: every run in it."""


def postgres_dsn() -> str:
    """The test server's DSN; in CI its absence is a failure, elsewhere a skip."""
    dsn = os.environ.get(DSN_VARIABLE, "")
    if not dsn:
        if os.environ.get("CI"):
            pytest.fail(f"{DSN_VARIABLE} is not set: .ci/run must start PostgreSQL")
        pytest.skip(f"{DSN_VARIABLE} is not set (make test starts PostgreSQL and sets it)")
    return dsn


def new_schema(dsn: str) -> str:
    """Creates an empty schema; returns a DSN whose search_path is that schema."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in dsn else "?"
    return f"{dsn}{separator}options={quote(f'-csearch_path={schema}')}"


def drop_schema(dsn: str, schema_dsn: str) -> None:
    """Drops the schema a `new_schema` DSN points at."""
    schema = schema_dsn.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def written_bytes(store_url: str) -> bytes:
    """Everything the store holds, as raw bytes: SQLite's files, or every row of every table."""
    if store_url.startswith("sqlite:///"):
        path = Path(store_url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    out = bytearray()
    with psycopg.connect(store_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
        for (table,) in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, bytes | bytearray | memoryview):
                        out += bytes(value)
                    elif value is not None:
                        out += str(value).encode()
    return bytes(out)


def query(store_url: str, sql: str) -> list[tuple[object, ...]]:
    """Rows of a query run on the store from outside, as a person inspecting it would
    (a SQLite file a server is using reads fine beside it: WAL)."""
    if store_url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(store_url.removeprefix("sqlite:///"))) as conn:
            return conn.execute(sql).fetchall()
    with psycopg.connect(store_url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


CHECKPOINT_TABLES = {
    "sqlite": ("checkpoints", "writes"),
    "postgres": ("checkpoints", "checkpoint_writes"),
}
"""LangGraph's checkpoint tables holding rows a run writes, by store."""


async def count_rows(store: object) -> int:
    """Rows in the run registry, the event log and the checkpoint tables together, read
    through the store's own connection (what a refused request must leave at zero)."""
    if isinstance(store, SqliteRunStore):
        tables = ("rt_runs", "rt_events", *CHECKPOINT_TABLES["sqlite"])
        return sum(store.conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables)
    if isinstance(store, PostgresRunStore):
        tables = ("rt_runs", "rt_events", *CHECKPOINT_TABLES["postgres"])
        total = 0
        async with store.pool.connection() as conn:
            for table in tables:
                cursor = await conn.execute(f"SELECT COUNT(*) AS n FROM {table}")
                row = await cursor.fetchone()
                total += int(row["n"]) if row else 0
        return total
    raise TypeError(f"no row count for {type(store).__name__}")


def run_record(run_id: str, status: RunStatus = RunStatus.RUNNING, **fields: Any) -> RunRecord:
    """A registry row for tests that need one without a server: tenant "acme", thread
    "t-1", created now, unless `fields` say otherwise."""
    now = time.time()
    values: dict[str, Any] = {
        "tenant": "acme",
        "thread_id": "t-1",
        "fingerprint": "f",
        "created_at": now,
        "updated_at": now,
        **fields,
    }
    return RunRecord(run_id=run_id, status=status, **values)
