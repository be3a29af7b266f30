"""A first end-to-end check: a count-off over the real server, offline model."""

from __future__ import annotations

from support.builders import collect, finals, kinds, start_request


async def test_count_off_over_grpc(stub) -> None:
    events = await collect(stub.StartRun(start_request("报数")))
    assert [f.content for f in finals(events)] == ["1!", "2!", "3!", "4!"]
    assert kinds(events)[0] == "run_started" and kinds(events)[-1] == "run_completed"
    assert [e.seq for e in events if e.WhichOneof("payload") != "assistant_delta"] == list(
        range(1, len(kinds(events)) + 1)
    )
