"""LangGraph checkpoints: the one a stopped run resumes from, or one after each plan and round.

The event log, not the checkpoint, decides who already spoke (tests/e2e/test_crash_resume.py
shows resume with no checkpoint at all); these tests show what the database is given.
A completed run is never resumed (only replayed, from the event log), so with the default
durability ("exit") a completed turn leaves no checkpoint, while a stopped one leaves the
checkpoint it resumes from.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from roundtable.runs.execution import checkpoint_thread
from roundtable.store.checkpoints import BoundarySaver
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, last_execution, member, of_kind, start_request

SLOW = spb.ModelRef(
    target=spb.ModelTarget(provider="offline", model="slow", base_url="offline:?token_delay_ms=15")
)


async def saved_checkpoints(server: Any, tenant: str, run_id: str) -> list[Any]:
    """The run's checkpoints in the database, newest first."""
    thread = checkpoint_thread(tenant, run_id)
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return [c async for c in server.store.checkpointer.alist(config)]


def shapes(saved: list[Any]) -> list[dict[str, int]]:
    return [
        {
            "steps": len(c.checkpoint["channel_values"].get("steps", [])),
            "replies": len(c.checkpoint["channel_values"].get("replies", [])),
        }
        for c in saved
    ]


@pytest.mark.parametrize(
    ("durability", "text", "expected"),
    [
        ("exit", "报数", []),
        ("exit", "@all hello", []),
        # Newest first. A count-off has nothing to remember, so its round ends the graph:
        # that finished checkpoint is never resumed and is not written; only the plan is.
        ("async", "报数", [{"steps": 4, "replies": 0}]),
        # A turn that goes on to propose memories keeps the round of four, then the plan.
        ("async", "@all hello", [{"steps": 4, "replies": 4}, {"steps": 4, "replies": 0}]),
    ],
)
async def test_checkpoints_of_a_completed_turn(start_server, durability, text, expected) -> None:
    async with (
        start_server(checkpoint_durability=durability) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        events = await collect(stub.StartRun(start_request(text, run_id="ck-1", tenant="acme")))
        assert len(finals(events)) == 4
        saved = await saved_checkpoints(server, "acme", "ck-1")
    assert shapes(saved) == expected
    for checkpoint in saved:
        values = checkpoint.checkpoint["channel_values"]
        replies = [r["reply_id"] for r in values.get("replies", [])]
        assert replies in ([], [f"ck-1#{i}" for i in range(4)])
        # Nothing of the snapshot or the context is in a checkpoint: only progress.
        assert "snapshot" not in values and "credentials" not in str(checkpoint.metadata)
        # Plain data only, so a strict serializer (LANGGRAPH_STRICT_MSGPACK) reads it back.
        assert not_plain(values) == []


def not_plain(value: Any, path: str = "") -> list[str]:
    """Where a value holds anything but JSON-like builtins (an enum, a dataclass...)."""
    if type(value) in (str, int, float, bool, type(None)):
        return []
    if type(value) is list:
        return [p for i, v in enumerate(value) for p in not_plain(v, f"{path}[{i}]")]
    if type(value) is dict:
        return [p for k, v in value.items() for p in not_plain(v, f"{path}.{k}")]
    return [f"{path}: {type(value).__qualname__}"]


def count_reads(server: Any) -> list[str]:
    """Records the thread of every checkpoint read that reaches the database."""
    inner = server.manager.executor.checkpoints.inner
    reads: list[str] = []
    read = inner.aget_tuple

    async def counted(config: Any) -> Any:
        reads.append(config["configurable"]["thread_id"])
        return await read(config)

    inner.aget_tuple = counted
    return reads


async def test_a_stopped_run_keeps_the_checkpoint_it_resumes_from(start_server) -> None:
    members = [member(m, m.upper(), model=SLOW) for m in "abcd"]
    request = start_request("@all hello", run_id="ck-stop", tenant="acme", members=members)
    async with (
        start_server() as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.OrchestratorServiceStub(channel)
        reads = count_reads(server)
        call = stub.StartRun(request)
        async for response in call:
            if response.event.WhichOneof("payload") == "speaker_started":
                break
        await stub.CancelRun(pb.CancelRunRequest(run_id="ck-stop", tenant="acme"))
        first = await collect(call)
        assert of_kind(first, "run_cancelled")
        saved = await saved_checkpoints(server, "acme", "ck-stop")
        # One checkpoint, written when the run stopped: the plan of four steps.
        assert [s["steps"] for s in shapes(saved)] == [4]
        assert "snapshot" not in saved[0].checkpoint["channel_values"]

        # A first execution never reads a checkpoint from the database.
        assert reads == []

        # The same StartRun resumes from it: no second plan, nobody speaks twice; and the
        # completed resume adds no checkpoint of its own.
        second = last_execution(await collect(stub.StartRun(request)))
        assert checkpoint_thread("acme", "ck-stop") in reads, "a resume reads its checkpoint"
        assert second[0].run_started.resumed and not of_kind(second, "plan_created")
        done = [f.reply_id for f in finals(first + second)]
        assert sorted(done) == [f"ck-stop#{i}" for i in range(4)]
        assert of_kind(second, "run_completed")
        assert len(await saved_checkpoints(server, "acme", "ck-stop")) == 1


async def test_a_new_runs_first_read_skips_the_database() -> None:
    reads: list[str] = []

    class Inner(BoundarySaver):
        def __init__(self) -> None:
            from langgraph.checkpoint.memory import InMemorySaver

            super().__init__(InMemorySaver())

        async def aget_tuple(self, config):  # type: ignore[no-untyped-def]
            reads.append(config["configurable"]["thread_id"])
            return await self.inner.aget_tuple(config)

    saver = BoundarySaver(Inner())
    saver.expect_new("t/new")
    config: Any = {"configurable": {"thread_id": "t/new"}}
    assert await saver.aget_tuple(config) is None
    assert reads == [], "a new run's thread is not looked up"
    # The mark is read once: a later read of the same thread asks the database.
    assert await saver.aget_tuple(config) is None
    assert reads == ["t/new"]
    saver.expect_new("t/other")
    saver.forget_new("t/other")
    await saver.aget_tuple({"configurable": {"thread_id": "t/other"}})
    assert reads == ["t/new", "t/other"]
