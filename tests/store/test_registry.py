"""The run registry's thread queries, on SQLite and Postgres alike."""

from __future__ import annotations

import time

from roundtable.store.base import RunRecord, RunStatus


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


async def test_live_thread_run_is_a_running_or_queued_run_under_a_live_lease(server) -> None:
    store = server.store
    now = time.time()
    assert await store.create_run(record("dead", RunStatus.RUNNING, lease_until=now - 1, age=3))
    assert await store.create_run(record("stopped", RunStatus.CANCELLED, age=2))
    assert await store.create_run(record("live", RunStatus.RUNNING, lease_until=now + 30, age=1))
    assert await store.create_run(record("waiting", RunStatus.QUEUED, lease_until=now + 30))

    found = await store.live_thread_run("acme", "t-1", exclude_run_id="", owner="me", now=now)
    assert found is not None and found.run_id == "waiting", "the most recent live one"
    found = await store.live_thread_run(
        "acme", "t-1", exclude_run_id="waiting", owner="me", now=now
    )
    assert found is not None and found.run_id == "live"
    assert (
        await store.live_thread_run("acme", "t-2", exclude_run_id="", owner="me", now=now) is None
    )
    assert (
        await store.live_thread_run("other", "t-1", exclude_run_id="", owner="me", now=now) is None
    )
    # A replica's own runs are left out: it knows them in memory.
    assert (
        await store.live_thread_run("acme", "t-1", exclude_run_id="", owner="replica-x", now=now)
        is None
    )
    # Once every lease has run out, nobody holds the thread (their replicas died).
    assert (
        await store.live_thread_run("acme", "t-1", exclude_run_id="", owner="me", now=now + 60)
        is None
    )


async def test_latest_resumable_can_leave_out_the_asking_run(server) -> None:
    store = server.store
    assert await store.create_run(record("earlier", RunStatus.CANCELLED, age=2))
    assert await store.create_run(record("continuing", RunStatus.INTERRUPTED, age=1))
    latest = await store.latest_resumable("acme", "t-1")
    assert latest is not None and latest.run_id == "continuing"
    other = await store.latest_resumable("acme", "t-1", exclude_run_id="continuing")
    assert other is not None and other.run_id == "earlier"
