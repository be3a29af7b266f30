"""The shared coordination's reads of cancels recorded by other replicas, against a store
that fails for a moment (as a Postgres connection does when it is dropped)."""

from __future__ import annotations

import asyncio
import dataclasses

from roundtable.graph.context import StopSignal
from roundtable.runs.coordination import SharedCoordination
from roundtable.store.base import RunRecord, RunStatus
from support.stores import run_record

RECORD = run_record("queued", RunStatus.QUEUED)


class FailsFirst:
    """A store whose first read of the run fails; the later ones see a cancel recorded."""

    def __init__(self) -> None:
        self.reads = 0

    async def get_run(self, tenant: str, run_id: str) -> RunRecord:
        self.reads += 1
        if self.reads == 1:
            raise OSError("the connection to the store was dropped")
        return dataclasses.replace(RECORD, cancel_mode="graceful", cancel_reason="by_b")


async def test_a_queued_run_hears_a_cancel_after_a_store_error(caplog) -> None:
    # Review: the first store error ended the queued run's poll for good (its task died),
    # so a cancel recorded on another replica was never heard; at a speaker boundary the
    # same error failed the run.
    store = FailsFirst()
    coordination = SharedCoordination(store, owner="a", lease_s=10.0, poll_s=0.01)  # type: ignore[arg-type]
    stop = StopSignal()
    stop.poller = lambda now: coordination.remote_cancel(RECORD)
    watcher = coordination.watch_queued(stop)
    assert watcher is not None
    try:
        await asyncio.wait_for(stop.wait(), timeout=2.0)
    finally:
        watcher.cancel()
    assert stop.reason == "by_b" and store.reads >= 2
    assert "reading the run's cancel failed: OSError" in caplog.text


async def test_a_speaker_boundary_goes_on_when_the_store_fails_for_a_moment() -> None:
    store = FailsFirst()
    coordination = SharedCoordination(store, owner="a", lease_s=10.0)  # type: ignore[arg-type]
    stop = StopSignal()
    stop.poller = lambda now: coordination.remote_cancel(RECORD)

    await stop.refresh(now=True)  # the boundary: no stop seen, no error
    assert not stop.requested
    await stop.refresh(now=True)  # the next one hears it
    assert stop.reason == "by_b"
