"""The run registry's thread queries and continuation claims, on SQLite and Postgres alike."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg
import pytest
from roundtable.domain.errors import InvalidSettings, ThreadBusy
from roundtable.store.base import CancelMark, LeaseLost, RunRecord, RunStatus, StoredEvent
from roundtable.store.postgres import PostgresRunStore
from roundtable.store.sqlite import SqliteRunStore
from support.stores import OLD_RT_RUNS, drop_schema, new_schema, postgres_dsn


def record(run_id: str, status: RunStatus, *, lease_until: float = 0.0, age: float = 0.0):
    now = time.time() - age
    return RunRecord(
        tenant="acme",
        run_id=run_id,
        thread_id="t-1",
        fingerprint="f",
        status=status,
        created_at=now,
        updated_at=now,
        owner="replica-x" if lease_until else "",
        lease_until=lease_until,
    )


async def test_live_thread_runs_are_those_under_a_live_lease_and_parked_ones_nobody_holds(
    server,
) -> None:
    store = server.store
    now = time.time()
    assert await store.create_run(record("dead", RunStatus.RUNNING, lease_until=now - 1, age=3))
    assert await store.create_run(record("stopped", RunStatus.CANCELLED, age=2))
    assert await store.create_run(record("live", RunStatus.RUNNING, lease_until=now + 30, age=1))
    assert await store.create_run(record("waiting", RunStatus.QUEUED, lease_until=now + 30))
    parked = record("parked", RunStatus.AWAITING_APPROVAL, lease_until=now + 30)
    parked.created_at += 1
    assert await store.create_run(parked)

    def ids(runs: list[RunRecord]) -> list[str]:
        return [r.run_id for r in runs]

    found = await store.live_thread_runs("acme", "t-1", exclude_run_id="", owner="me", now=now)
    assert ids(found) == ["live", "waiting", "parked"], "oldest first"
    found = await store.live_thread_runs(
        "acme", "t-1", exclude_run_id="waiting", owner="me", now=now
    )
    assert ids(found) == ["live", "parked"]
    assert not await store.live_thread_runs("acme", "t-2", exclude_run_id="", owner="me", now=now)
    assert not await store.live_thread_runs("other", "t-1", exclude_run_id="", owner="me", now=now)
    # A replica's own runs are left out: it knows them in memory.
    assert not await store.live_thread_runs(
        "acme", "t-1", exclude_run_id="", owner="replica-x", now=now
    )
    # Once every lease has run out, their replicas died: the parked run still waits for
    # its StartRun (a person may still decide), the others are nobody's.
    found = await store.live_thread_runs("acme", "t-1", exclude_run_id="", owner="me", now=now + 60)
    assert ids(found) == ["parked"]
    # A parked run no replica ever held (a single process's) is one too.
    assert await store.create_run(record("unheld", RunStatus.AWAITING_APPROVAL, age=-2))
    found = await store.live_thread_runs(
        "acme", "t-1", exclude_run_id="", owner="replica-x", now=now
    )
    assert ids(found) == ["unheld"]


async def test_resumable_runs_newest_first_leaving_out_the_asking_run(server) -> None:
    store = server.store
    assert await store.create_run(record("earlier", RunStatus.CANCELLED, age=2))
    assert await store.create_run(record("continuing", RunStatus.INTERRUPTED, age=1))
    assert await store.create_run(record("done", RunStatus.SUCCEEDED))
    runs = await store.resumable_runs("acme", "t-1", limit=5)
    assert [r.run_id for r in runs] == ["continuing", "earlier"]
    runs = await store.resumable_runs("acme", "t-1", exclude_run_id="continuing", limit=5)
    assert [r.run_id for r in runs] == ["earlier"]
    assert [r.run_id for r in await store.resumable_runs("acme", "t-1")] == ["continuing"]


async def test_a_run_is_continued_by_one_run_only(server) -> None:
    store = server.store
    assert await store.create_run(record("earlier", RunStatus.CANCELLED))
    assert await store.create_run(record("done", RunStatus.SUCCEEDED))
    assert await store.claim_continuation("acme", "earlier", "first")
    assert not await store.claim_continuation("acme", "earlier", "second"), "taken already"
    assert not await store.claim_continuation("acme", "done", "second"), "not resumable"
    claimed = await store.continued_run("acme", "first")
    assert claimed is not None and claimed.run_id == "earlier"
    assert claimed.status is RunStatus.CONTINUED and claimed.continued_by == "first"
    assert await store.continued_run("acme", "second") is None
    assert await store.resumable_runs("acme", "t-1") == []


async def test_a_run_being_resumed_is_neither_claimed_nor_resumed_once_claimed(server) -> None:
    store = server.store
    now = time.time()
    resuming = record("resuming", RunStatus.INTERRUPTED, lease_until=now + 30)
    assert await store.create_run(resuming)
    assert not await store.claim_continuation("acme", "resuming", "c"), "a replica holds it"
    assert await store.create_run(record("stopped", RunStatus.CANCELLED))
    assert await store.claim_continuation("acme", "stopped", "c")
    assert not await store.acquire_lease("acme", "stopped", "replica-y", 10.0), (
        "a run a continue turn took over is never run again"
    )


async def assert_migrated(store) -> None:
    """The row written with the old layout reads back, and takes a continuation claim."""
    kept = await store.get_run("acme", "kept")
    assert kept is not None and kept.continued_by == ""
    assert await store.claim_continuation("acme", "kept", "next")


async def test_finishing_a_run_writes_its_end_and_frees_it_for_its_owner_only(server) -> None:
    store = server.store
    mine = record("mine", RunStatus.RUNNING, lease_until=time.time() + 30)
    assert await store.create_run(mine)
    await store.request_cancel("acme", "mine", "graceful", "stop_turn")
    mine.status, mine.last_seq = RunStatus.CANCELLED, 7
    # A replica that lost the run (its lease taken over) writes nothing.
    assert not await store.finish_run(mine, "replica-y")
    kept = await store.get_run("acme", "mine")
    assert kept is not None
    assert (kept.status, kept.owner, kept.cancel_mode) == (
        RunStatus.RUNNING,
        "replica-x",
        "graceful",
    )
    assert await store.finish_run(mine, "replica-x")
    done = await store.get_run("acme", "mine")
    assert done is not None
    assert (done.status, done.last_seq) == (RunStatus.CANCELLED, 7)
    assert (done.owner, done.lease_until, done.cancel_mode, done.cancel_reason) == ("", 0, "", "")


async def test_a_runs_end_writes_its_terminal_event_and_final_row_together_or_not_at_all(
    server,
) -> None:
    store = server.store
    mine = record("ending", RunStatus.RUNNING, lease_until=time.time() + 30)
    assert await store.create_run(mine)
    started = StoredEvent(1, "run_started", b"started")
    await store.append_event("acme", "ending", started, owner="replica-x")
    await store.request_cancel("acme", "ending", "graceful", "stop_turn")
    mine.status = RunStatus.CANCELLED

    async def unchanged() -> None:
        kept = await store.get_run("acme", "ending")
        assert kept is not None
        assert (kept.status, kept.owner, kept.last_seq) == (RunStatus.RUNNING, "replica-x", 0)
        assert await store.read_events("acme", "ending", 0) == [started]

    # A replica that lost the run writes neither its event nor its row.
    with pytest.raises(LeaseLost):
        await store.end_run(mine, "replica-y", StoredEvent(2, "run_cancelled", b"end"))
    await unchanged()
    # An event the log refuses (its seq is taken) takes the row's end back with it.
    with pytest.raises((sqlite3.IntegrityError, psycopg.errors.UniqueViolation)):
        await store.end_run(mine, "replica-x", StoredEvent(1, "run_cancelled", b"end"))
    await unchanged()

    ended = StoredEvent(2, "run_cancelled", b"end")
    await store.end_run(mine, "replica-x", ended)
    assert await store.read_events("acme", "ending", 0) == [started, ended]
    done = await store.get_run("acme", "ending")
    assert done is not None
    assert (done.status, done.last_seq) == (RunStatus.CANCELLED, 2)
    assert (done.owner, done.lease_until, done.cancel_mode, done.cancel_reason) == ("", 0, "", "")


async def test_a_database_file_from_before_continued_by_gets_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.execute(OLD_RT_RUNS)
    old.execute(
        "INSERT INTO rt_runs (tenant, run_id, thread_id, fingerprint, status, created_at,"
        " updated_at) VALUES ('acme', 'kept', 't-1', 'f', 'cancelled', 1, 1)"
    )
    old.commit()
    old.close()
    store = await SqliteRunStore.open(path)
    try:
        await assert_migrated(store)
    finally:
        await store.close()


async def test_a_postgres_table_from_before_continued_by_gets_the_column() -> None:
    dsn = postgres_dsn()
    url = new_schema(dsn)
    try:
        with psycopg.connect(url, autocommit=True) as old:
            old.execute(OLD_RT_RUNS)
            old.execute(
                "INSERT INTO rt_runs (tenant, run_id, thread_id, fingerprint, status, created_at,"
                " updated_at) VALUES ('acme', 'kept', 't-1', 'f', 'cancelled', 1, 1)"
            )
        store = await PostgresRunStore.open(url)
        try:
            await assert_migrated(store)
        finally:
            await store.close()
    finally:
        drop_schema(dsn, url)


async def test_a_thread_being_started_on_postgres_is_busy_for_others_until_let_go() -> None:
    dsn = postgres_dsn()
    url = new_schema(dsn)
    thread = "t-'1"  # a quote in the key: the lock's statement takes literals

    def advisory_locks_held() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            return int(row.fetchone()[0])

    try:
        store = await PostgresRunStore.open(url, thread_lock_timeout_s=0.2)
        other = await PostgresRunStore.open(url, thread_lock_timeout_s=0.2)  # a second replica
        try:
            async with store.thread_lock("acme", thread):
                assert advisory_locks_held() == 1
                with pytest.raises(ThreadBusy, match="being started elsewhere"):
                    async with other.thread_lock("acme", thread):
                        pytest.fail("two replicas held one thread's lock")
                async with other.thread_lock("acme", "t-2"):
                    pass  # another thread is free
                async with other.thread_lock("other-tenant", thread):
                    pass  # so is the same thread id under another tenant
            assert advisory_locks_held() == 0
            with pytest.raises(RuntimeError):
                async with other.thread_lock("acme", thread):
                    raise RuntimeError("the start failed")
            assert advisory_locks_held() == 0, "a failed start lets go of the lock too"
            async with store.thread_lock("acme", thread):
                pass  # the busy replica's connection went back to its pool usable
            async with other.pool.connection() as conn:
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        finally:
            await store.close()
            await other.close()
    finally:
        drop_schema(dsn, url)


async def test_a_cancel_recorded_after_the_run_ended_leaves_no_mark(server) -> None:
    # A cancel read a run as running, and the run ended before the cancel was written: a
    # mark left on a stopped run's row would stop its next resume at once.
    store = server.store
    run = record("ended", RunStatus.RUNNING, lease_until=time.time() + 30)
    assert await store.create_run(run)
    assert await store.request_cancel("acme", "ended", "graceful", "first")
    run.status = RunStatus.CANCELLED
    assert await store.finish_run(run, "replica-x")
    assert not await store.request_cancel("acme", "ended", "immediate", "late")
    kept = await store.get_run("acme", "ended")
    assert kept is not None
    assert (kept.status, kept.cancel_mode, kept.cancel_reason) == (RunStatus.CANCELLED, "", "")
    assert not await store.request_cancel("acme", "no-such-run", "graceful", "late")


async def test_a_shared_store_answers_the_cancel_recorded_on_the_run_with_each_append(
    server,
) -> None:
    store = server.store
    assert await store.create_run(record("r", RunStatus.RUNNING, lease_until=time.time() + 30))
    assert await store.append_event("acme", "r", StoredEvent(1, "run_started", b"a")) is None
    await store.request_cancel("acme", "r", "graceful", "stop_directive")
    mark = await store.append_event("acme", "r", StoredEvent(2, "speaker_started", b"b"))
    if store.shared:
        # Read in the append's round trip: the owner needs no query at its next boundary.
        assert mark == CancelMark("graceful", "stop_directive")
    else:
        assert mark is None, "a SQLite file has one process: cancels never go through the row"
    assert [e.seq for e in await store.read_events("acme", "r", 0)] == [1, 2]


async def test_an_append_by_a_replica_that_lost_the_run_is_refused(server) -> None:
    store = server.store
    now = time.time()
    run = record("r", RunStatus.RUNNING, lease_until=now - 1)  # replica-x's lease ran out
    assert await store.create_run(run)
    await store.append_event("acme", "r", StoredEvent(1, "run_started", b"x1"), owner="replica-x")
    assert await store.acquire_lease("acme", "r", "replica-y", 30.0)  # y takes the run over
    if not store.shared:
        # A SQLite file has one process: there is no other replica to fence out.
        await store.append_event("acme", "r", StoredEvent(2, "x", b"x2"), owner="replica-x")
        return
    # x, paused past its lease and not yet aware, appends its next event: refused.
    with pytest.raises(LeaseLost):
        await store.append_event("acme", "r", StoredEvent(2, "x", b"x2"), owner="replica-x")
    mark = await store.append_event("acme", "r", StoredEvent(2, "y", b"y2"), owner="replica-y")
    assert mark is None
    assert [(e.seq, e.body) for e in await store.read_events("acme", "r", 0)] == [
        (1, b"x1"),
        (2, b"y2"),
    ]


async def test_a_run_marked_interrupted_at_start_up_is_no_longer_its_late_owners() -> None:
    dsn = postgres_dsn()
    url = new_schema(dsn)
    try:
        late = await PostgresRunStore.open(url)  # replica A, slow to renew its lease
        starting = await PostgresRunStore.open(url)  # replica B, starting up
        try:
            now = time.time()
            stale = record("r", RunStatus.RUNNING, lease_until=now - 1)  # owner replica-x
            assert await late.create_run(stale)
            # The sweep of a live replica leaves a lease run out for less than a lease more:
            # its owner may only be late to renew it.
            assert await starting.mark_interrupted(expired_for_s=10.0) == []
            assert await starting.mark_interrupted() == [("acme", "r")]
            assert not await late.renew_lease("acme", "r", "replica-x", 10.0)
            with pytest.raises(LeaseLost):
                event = StoredEvent(1, "run_started", b"x")
                await late.append_event("acme", "r", event, owner="replica-x")
            row = await starting.get_run("acme", "r")
            assert row is not None and row.status is RunStatus.INTERRUPTED and row.owner == ""
        finally:
            await late.close()
            await starting.close()
    finally:
        drop_schema(dsn, url)


FIRST_RT_RUNS = (
    "CREATE TABLE rt_runs (tenant TEXT NOT NULL, run_id TEXT NOT NULL, thread_id TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL, status TEXT NOT NULL, plan_json TEXT NOT NULL DEFAULT '[]',"
    " finished_reply_ids TEXT NOT NULL DEFAULT '[]', last_seq INTEGER NOT NULL DEFAULT 0,"
    " created_at REAL NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (tenant, run_id))"
)
"""rt_runs as the first version made it (before trace context, leases and cancels)."""


async def test_a_database_file_from_the_first_version_opens_and_works(tmp_path: Path) -> None:
    path = tmp_path / "first.db"
    with sqlite3.connect(path) as old:
        old.execute(FIRST_RT_RUNS)
        old.execute(
            "INSERT INTO rt_runs (tenant, run_id, thread_id, fingerprint, status, created_at,"
            " updated_at) VALUES ('acme', 'kept', 't-1', 'f', 'succeeded', 1, 1)"
        )
    store = await SqliteRunStore.open(path)
    try:
        kept = await store.get_run("acme", "kept")
        assert kept is not None and kept.status is RunStatus.SUCCEEDED and kept.owner == ""
        assert await store.create_run(record("new", RunStatus.RUNNING, lease_until=time.time()))
        assert await store.acquire_lease("acme", "new", "replica-x", 10.0)
    finally:
        await store.close()


async def test_a_sqlite_file_is_served_by_one_process_at_a_time(tmp_path: Path) -> None:
    # A second server on the file would mark the first one's live runs interrupted at its
    # start-up (a rolling restart that overlaps), and they could then run twice.
    path = tmp_path / "rt.db"
    first = await SqliteRunStore.open(path)
    try:
        with pytest.raises(InvalidSettings, match="served by another roundtable process"):
            await SqliteRunStore.open(path)
    finally:
        await first.close()
    again = await SqliteRunStore.open(path)  # free once the first one closed
    await again.close()
