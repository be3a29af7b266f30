"""A StartRunRequest as received: the parsed message plus what its bytes already tell.

A turn's request carries the whole history (up to 10,000 messages, ~1 MB). Two things the
edge needs are cheaper from the bytes gRPC received than from the parsed message:

- the request's size (`ByteSize()` walks the whole message: ≈0.45 ms at 10,000 messages);
- the idempotency fingerprint, a hash of the snapshot: hashing the snapshot's bytes as
  received skips serializing the message again (≈0.4 ms at 10,000 messages).

The snapshot's bytes are found by walking the request's top-level fields only (a handful:
context, snapshot, credentials entries, options); nothing inside them is looked at. The
snapshot holds no map fields, so the same snapshot serializes to the same bytes from any
client, and `snapshot_bytes` falls back to a deterministic serialization when the request
did not come off the wire or carries the snapshot field more than once (parsers merge
repeated message fields).
"""

from __future__ import annotations

from dataclasses import dataclass

from roundtable.v1 import orchestrator_service_pb2 as pb

_SNAPSHOT_FIELD = pb.StartRunRequest.DESCRIPTOR.fields_by_name["snapshot"].number
_LEN = 2  # wire type of length-delimited fields (messages, strings, map entries)
_EMPTY = pb.StartRunRequest()


@dataclass(slots=True)
class ReceivedStartRun:
    """A parsed StartRunRequest with its wire size and the span of its snapshot's bytes."""

    message: pb.StartRunRequest
    wire_size: int
    snapshot_wire: memoryview | None = None
    """The snapshot field's bytes as received; None when they cannot stand for it."""

    def release(self) -> None:
        """Lets go of the parsed request once it is converted.

        gRPC keeps the request object for as long as the response stream lasts, which
        for a run parked in a model call is minutes; the domain request holds what the
        run needs (a history window, not the whole history).
        """
        self.message = _EMPTY
        self.snapshot_wire = None

    @classmethod
    def parse(cls, data: bytes) -> ReceivedStartRun:
        """The gRPC request deserializer of StartRun."""
        message = pb.StartRunRequest.FromString(data)
        return cls(message, len(data), _field_bytes(data, _SNAPSHOT_FIELD))

    @classmethod
    def of(cls, message: pb.StartRunRequest) -> ReceivedStartRun:
        """A request built in process (no wire bytes)."""
        return cls(message, message.ByteSize())

    def snapshot_bytes(self) -> bytes | memoryview:
        """The snapshot's serialized bytes, for the fingerprint."""
        if self.snapshot_wire is not None:
            return self.snapshot_wire
        return self.message.snapshot.SerializeToString(deterministic=True)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _field_bytes(data: bytes, number: int) -> memoryview | None:
    """The payload of the one length-delimited top-level field `number`, or None.

    None when the field is absent or repeated, or the bytes are not what the walk expects
    (the parse before it succeeded, so that would be a field kind this request never has).
    """
    found: memoryview | None = None
    view = memoryview(data)
    pos, end = 0, len(data)
    try:
        while pos < end:
            key, pos = _varint(data, pos)
            field, wire_type = key >> 3, key & 7
            if wire_type != _LEN:
                return None
            length, pos = _varint(data, pos)
            if field == number:
                if found is not None:
                    return None
                found = view[pos : pos + length]
            pos += length
    except IndexError:
        return None
    return found if pos == end else None
