"""Checkpoints land at speaker boundaries: the start, the plan, then one after each speaker."""

from __future__ import annotations

from roundtable.runs.manager import checkpoint_thread
from support.builders import collect, finals, start_request


async def test_a_checkpoint_per_speaker_boundary_in_the_runs_thread(server, stub) -> None:
    events = await collect(stub.StartRun(start_request("报数", run_id="ck-1", tenant="acme")))
    assert len(finals(events)) == 4
    config = {"configurable": {"thread_id": checkpoint_thread("acme", "ck-1"), "checkpoint_ns": ""}}
    saved = [c async for c in server.store.checkpointer.alist(config)]
    assert len(saved) == 6, "the start (hydrated progress), the plan, then each of four speakers"
    latest = saved[0].checkpoint["channel_values"]
    assert [r["reply_id"] for r in latest["replies"]] == [f"ck-1#{i}" for i in range(4)]
    assert len(latest["steps"]) == 4
    # Nothing of the snapshot or the context is in a checkpoint: only progress.
    assert "snapshot" not in latest and "credentials" not in str(saved[0].metadata)
