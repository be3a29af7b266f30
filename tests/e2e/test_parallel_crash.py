"""A parallel round killed mid-way: a real `roundtable serve` (process A) runs an @all whose
four speakers answer at once and is SIGKILLed right after the first final; process B, a
new server on the same store (a SQLite file, or Postgres as a second replica), gets the same
StartRun and finishes the round. The finished speaker never speaks again, the three cut
off speak once, and every reply has one final across both processes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, last_execution, member, of_kind, start_request
from support.process import ServerProcess

from e2e.test_crash_resume import dispatch_calls, run_until_killed

pytestmark = pytest.mark.e2e


def parallel_round(run_id: str) -> pb.StartRunRequest:
    # The first member answers at once; the others take a while, so A dies with three
    # speakers mid-answer.
    def model(latency_ms: int) -> spb.ModelRef:
        return spb.ModelRef(
            target=spb.ModelTarget(
                provider="offline",
                model="m",
                base_url=f"offline:?latency_ms={latency_ms}&token_delay_ms=5",
            )
        )

    roster = [
        member(m, name, model=model(latency))
        for m, name, latency in (
            ("a", "Ann", 0),
            ("b", "Bo", 700),
            ("c", "Cy", 700),
            ("d", "Di", 700),
        )
    ]
    request = start_request(
        "@all introduce yourselves", members=roster, run_id=run_id, thread_id=f"t-{run_id}"
    )
    request.snapshot.session.speaker_concurrency = spb.SPEAKER_CONCURRENCY_PARALLEL
    return request


async def test_a_killed_parallel_round_resumes_its_unfinished_speakers_once(
    tmp_path: Path, store_url: str
) -> None:
    request = parallel_round("par-kill")
    # A short lease: on Postgres, B takes the run over once A's lease has run out.
    lease = ("--lease-seconds", "1")
    a = await ServerProcess(store_url, tmp_path / "a.log", *lease).start()
    a_events = await run_until_killed(
        a, request, lambda e: e.WhichOneof("payload") == "assistant_final"
    )
    assert [f.member_id for f in finals(a_events)] == ["a"]
    assert len(of_kind(a_events, "speaker_started")) == 4, "all four had started in A"
    b = await ServerProcess(store_url, tmp_path / "b.log", *lease).start()
    try:
        async with b.channel() as channel:
            events = await collect(b.stub(channel).StartRun(request))
    finally:
        await b.stop()
    b_events = last_execution(events)
    assert b_events[0].run_started.resumed
    assert sorted(f.member_id for f in finals(b_events)) == ["b", "c", "d"]
    assert {e.speaker_started.member_id for e in of_kind(b_events, "speaker_started")} == {
        "b",
        "c",
        "d",
    }, "the finished speaker does not start again"
    assert dispatch_calls(b) == 3, "B calls the model for the three cut off, and only them"
    every = Counter(f.reply_id for f in finals(events))
    assert every == Counter({f"par-kill#{i}": 1 for i in range(4)}), "one final per reply"
    assert events[-1].WhichOneof("payload") == "run_completed"
    assert [r.member_id for r in events[-1].run_completed.replies] == ["a", "b", "c", "d"]
