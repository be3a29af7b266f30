"""One schema and one set of statements, rendered for SQLite and Postgres alike."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import sqlite3
import time
from pathlib import Path

import psycopg
from roundtable.store.base import RunRecord, RunStatus
from roundtable.store.postgres import POSTGRES, PostgresRunStore
from roundtable.store.schema import RETIRED_INDEXES, RUNS
from roundtable.store.sqlite import SQLITE, SqliteRunStore
from roundtable.store.statements import Statements
from support.stores import (
    OLD_PARKED_INDEX,
    OLD_RT_RUNS,
    drop_schema,
    new_schema,
    postgres_dsn,
)


def test_the_registry_columns_are_the_records_fields() -> None:
    assert set(RUNS.column_names) == {f.name for f in dataclasses.fields(RunRecord)}


def test_each_dialect_gets_every_statement_in_its_own_parameter_style() -> None:
    sqlite, postgres = Statements.for_dialect(SQLITE), Statements.for_dialect(POSTGRES)
    for field in dataclasses.fields(Statements):
        ours, theirs = getattr(sqlite, field.name), getattr(postgres, field.name)
        assert "%(" not in ours
        assert not re.search(r"(?<![:\w]):\w", theirs), theirs
        assert re.sub(r"%\((\w+)\)s", r":\1", theirs) == ours


def new_run(run_id: str) -> RunRecord:
    now = time.time()
    return RunRecord(
        tenant="acme",
        run_id=run_id,
        thread_id="t-1",
        fingerprint="f",
        status=RunStatus.RUNNING,
        created_at=now,
        updated_at=now,
    )


async def takes_a_run_to_its_end(store: SqliteRunStore | PostgresRunStore) -> None:
    """A run is created, leased and finished on a table that still has dropped columns."""
    run = new_run("new")
    assert await store.create_run(run)
    assert await store.acquire_lease("acme", "new", "replica-x", 10.0)
    run.status, run.last_seq = RunStatus.SUCCEEDED, 3
    assert await store.finish_run(run, "replica-x")
    done = await store.get_run("acme", "new")
    assert done is not None and (done.status, done.last_seq) == (RunStatus.SUCCEEDED, 3)


async def test_a_sqlite_file_with_the_dropped_plan_columns_still_works(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:
        old.execute(OLD_RT_RUNS)  # plan_json and finished_reply_ids, with defaults
        old.execute(OLD_PARKED_INDEX)
    store = await SqliteRunStore.open(path)
    try:
        await takes_a_run_to_its_end(store)
        indexes = {
            name: sql
            for name, sql in store.conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            )
        }
    finally:
        await store.close()
    assert not set(RETIRED_INDEXES) & set(indexes)
    assert "WHERE status = 'awaiting_approval'" in indexes["rt_runs_awaiting"]


async def test_a_postgres_table_with_the_dropped_plan_columns_still_works() -> None:
    dsn = postgres_dsn()
    url = new_schema(dsn)
    try:
        with psycopg.connect(url, autocommit=True) as old:
            old.execute(OLD_RT_RUNS)
            old.execute(OLD_PARKED_INDEX)
        store = await PostgresRunStore.open(url)
        try:
            await takes_a_run_to_its_end(store)
        finally:
            await store.close()
        with psycopg.connect(url, autocommit=True) as conn:
            indexes = dict(
                conn.execute(
                    "SELECT indexname, indexdef FROM pg_indexes "
                    "WHERE schemaname = current_schema() AND tablename = 'rt_runs'"
                ).fetchall()
            )
    finally:
        drop_schema(dsn, url)
    assert not set(RETIRED_INDEXES) & set(indexes)
    assert "WHERE (status = 'awaiting_approval'::text)" in indexes["rt_runs_awaiting"]


PARTIAL_LOOKUPS = {
    "renew_parked": "rt_runs_awaiting",
    "decided_parked": "rt_runs_awaiting",
    "live_thread_runs": "rt_runs_thread_live",
}
"""The statements of the parked-run watch and lease renewal, run every 0.2 s while a run
waits, and the busy-thread look-up of every StartRun: each must find its runs through its
partial index, not by reading every run (or every run of a long thread)."""
LOOKUP_PARAMS = {
    "owner": "replica-x",
    "lease_until": 0.0,
    "tenant": "acme",
    "thread_id": "t-1",
    "exclude_run_id": "r-1",
    "now": 0.0,
}


async def test_sqlite_finds_parked_and_live_runs_through_the_partial_indexes(
    tmp_path: Path,
) -> None:
    store = await SqliteRunStore.open(tmp_path / "plans.db")
    try:
        sql = Statements.for_dialect(SQLITE)
        for name, index in PARTIAL_LOOKUPS.items():
            statement = f"EXPLAIN QUERY PLAN {getattr(sql, name)}"
            plan = " ".join(row[-1] for row in store.conn.execute(statement, LOOKUP_PARAMS))
            assert index in plan, (name, plan)
    finally:
        await store.close()


async def test_postgres_finds_parked_and_live_runs_through_the_partial_indexes() -> None:
    dsn = postgres_dsn()
    url = new_schema(dsn)
    try:
        store = await PostgresRunStore.open(url)
        await store.close()
        sql = Statements.for_dialect(POSTGRES)
        with psycopg.connect(url, autocommit=True) as conn:
            # An empty table is read whole whatever its indexes; this asks whether the
            # index can serve the lookup at all.
            conn.execute("SET enable_seqscan = off")
            for name, index in PARTIAL_LOOKUPS.items():
                statement = f"EXPLAIN {getattr(sql, name)}"
                plan = " ".join(row[0] for row in conn.execute(statement, LOOKUP_PARAMS))
                assert index in plan, (name, plan)
    finally:
        drop_schema(dsn, url)


async def test_a_new_sqlite_file_has_the_schemas_columns_only(tmp_path: Path) -> None:
    store = await SqliteRunStore.open(tmp_path / "new.db")
    try:
        columns = [
            row[0] for row in store.conn.execute("SELECT name FROM pragma_table_info('rt_runs')")
        ]
        assert columns == list(RUNS.column_names)
    finally:
        await store.close()


async def test_postgres_builds_again_an_index_a_failed_concurrent_build_left_invalid() -> None:
    # CREATE INDEX CONCURRENTLY leaves an invalid index behind when its process dies; IF NOT
    # EXISTS alone would keep it (unused) for good.
    dsn = postgres_dsn()
    url = new_schema(dsn)
    valid = (
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relname = 'rt_runs_awaiting'"
    )
    try:
        await (await PostgresRunStore.open(url)).close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "UPDATE pg_index SET indisvalid = false "
                "WHERE indexrelid = 'rt_runs_awaiting'::regclass"
            )
            assert conn.execute(valid).fetchall() == [(False,)]
        await (await PostgresRunStore.open(url)).close()
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute(valid).fetchall() == [(True,)]
    finally:
        drop_schema(dsn, url)


async def test_replicas_starting_at_once_make_the_schema_one_at_a_time() -> None:
    # Concurrent index builds on one table can wait for each other, and one replica would
    # take the other's build in progress for a failed one's leftover.
    dsn = postgres_dsn()
    url = new_schema(dsn)
    try:
        stores = await asyncio.gather(*(PostgresRunStore.open(url) for _ in range(3)))
        for store in stores:
            await store.close()
        await (await PostgresRunStore.open(url)).close()  # the lock was let go
        with psycopg.connect(url, autocommit=True) as conn:
            indexes = conn.execute(
                "SELECT c.relname, i.indisvalid FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relname LIKE 'rt_%'"
            ).fetchall()
    finally:
        drop_schema(dsn, url)
    assert ("rt_runs_awaiting", True) in indexes
    assert all(valid for _, valid in indexes)
