"""The request as received: its size and its snapshot's bytes come from the wire."""

from __future__ import annotations

import pytest
from roundtable.api.convert import run_request_from_proto
from roundtable.api.limits import RequestLimits
from roundtable.api.wire import ReceivedStartRun
from roundtable.domain.snapshot import Budgets
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import start_request


def _request(**kwargs: object) -> pb.StartRunRequest:
    request = start_request("hello", run_id="w-1", **kwargs)  # type: ignore[arg-type]
    for i in range(50):
        request.snapshot.history.add(
            message_id=f"m{i}", role=spb.MESSAGE_ROLE_USER, content=f"message {i}"
        )
    return request


def as_sent(received: ReceivedStartRun) -> pb.StartRunRequest:
    """The received request as a StartRunRequest (its history was kept as bytes)."""
    return pb.StartRunRequest.FromString(received.message.SerializeToString())


def _fingerprint(received: ReceivedStartRun | pb.StartRunRequest) -> str:
    return run_request_from_proto(received, limits=RequestLimits(), defaults=Budgets()).fingerprint


def test_the_snapshot_bytes_are_those_received() -> None:
    request = _request(credentials={"k": "secret"}, options=pb.RunOptions(delta_window_ms=5))
    data = request.SerializeToString()
    received = ReceivedStartRun.parse(data)
    assert received.wire_size == len(data)
    assert received.snapshot_wire is not None
    assert bytes(received.snapshot_wire) == request.snapshot.SerializeToString()
    assert as_sent(received) == request
    # Once converted, the servicer lets the parsed request go for the rest of the stream.
    received.release()
    assert received.message.ByteSize() == 0 and received.snapshot_wire is None


def test_history_messages_are_parsed_when_read() -> None:
    request = _request()
    received = ReceivedStartRun.parse(request.SerializeToString())
    assert len(received.history) == 50
    assert received.history[-1] == request.snapshot.history[49]
    assert received.history[47:] == list(request.snapshot.history[47:])
    assert received.history[-1] is received.history[49], "parsed once"
    for outside in (50, -51):
        with pytest.raises(IndexError):
            received.history[outside]


def test_the_fingerprint_is_the_same_off_the_wire_and_in_process() -> None:
    request = _request()
    assert _fingerprint(ReceivedStartRun.parse(request.SerializeToString())) == _fingerprint(
        request
    )


def test_a_retry_with_other_credentials_options_and_request_id_is_the_same_turn() -> None:
    first = _request(credentials={"k": "old"})
    retry = _request(credentials={"k": "rotated"}, options=pb.RunOptions(stream_deltas=False))
    retry.context.request_id = "another-request"
    assert _fingerprint(ReceivedStartRun.parse(first.SerializeToString())) == _fingerprint(
        ReceivedStartRun.parse(retry.SerializeToString())
    )
    changed = _request()
    changed.snapshot.history[3].content = "edited"
    assert _fingerprint(ReceivedStartRun.parse(changed.SerializeToString())) != _fingerprint(first)


def test_a_snapshot_sent_in_two_parts_is_fingerprinted_as_parsed() -> None:
    # Protobuf merges a message field that appears twice; the received bytes of either part
    # would not stand for the whole, so the parsed snapshot is serialized instead.
    request = _request()
    head = pb.StartRunRequest(context=request.context).SerializeToString()
    part_1 = pb.StartRunRequest(snapshot=spb.Snapshot(session=request.snapshot.session))
    rest = spb.Snapshot()
    rest.CopyFrom(request.snapshot)
    rest.ClearField("session")
    part_2 = pb.StartRunRequest(snapshot=rest)
    data = head + part_1.SerializeToString() + part_2.SerializeToString()
    received = ReceivedStartRun.parse(data)
    assert received.snapshot_wire is None
    assert as_sent(received) == request
    assert _fingerprint(received) == _fingerprint(request)
