"""LangGraph checkpoints: once when the run ends (the default), or after each plan and round.

The event log, not the checkpoint, decides who already spoke (tests/e2e/test_crash_resume.py
shows resume with no checkpoint at all); these tests show what the checkpointer is given.
"""

from __future__ import annotations

import grpc
import pytest
from roundtable.runs.manager import checkpoint_thread
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from support.builders import collect, finals, start_request


@pytest.mark.parametrize(
    ("durability", "expected"),
    [
        ("exit", [{"steps": 4, "replies": 4}]),
        # Newest first: the round of four speakers, then the plan.
        ("async", [{"steps": 4, "replies": 4}, {"steps": 4, "replies": 0}]),
    ],
)
async def test_checkpoints_of_a_count_off(start_server, durability, expected) -> None:
    async with (
        start_server(checkpoint_durability=durability) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        events = await collect(stub.StartRun(start_request("报数", run_id="ck-1", tenant="acme")))
        assert len(finals(events)) == 4
        thread = checkpoint_thread("acme", "ck-1")
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        saved = [c async for c in server.store.checkpointer.alist(config)]
    shapes = [
        {
            "steps": len(c.checkpoint["channel_values"].get("steps", [])),
            "replies": len(c.checkpoint["channel_values"].get("replies", [])),
        }
        for c in saved
    ]
    assert shapes == expected
    latest = saved[0].checkpoint["channel_values"]
    assert [r["reply_id"] for r in latest["replies"]] == [f"ck-1#{i}" for i in range(4)]
    # Nothing of the snapshot or the context is in a checkpoint: only progress.
    assert "snapshot" not in latest and "credentials" not in str(saved[0].metadata)
