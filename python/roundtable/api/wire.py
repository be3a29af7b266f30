"""A StartRunRequest as received: the parsed message plus what its bytes already tell.

A turn's request carries the whole history (up to 10,000 messages, ~1 MB). Two things the
edge needs are cheaper from the bytes gRPC received than from the parsed message:

- the request's size (`ByteSize()` walks the whole message: ≈0.45 ms at 10,000 messages);
- the idempotency fingerprint, a hash of the snapshot: hashing the snapshot's bytes as
  received skips serializing the message again (≈0.4 ms at 10,000 messages).

Parsing is cheaper too: the request is parsed as a StartRunRequest whose snapshot keeps each
history message as its bytes (`ReceivedHistory` parses a message when it is read). Only
the last `history_window` messages are ever read; the others are counted and hashed into
the fingerprint, never parsed (≈1.1 → 0.2 ms for 10,000 messages, and far less memory
touched). Every other field is parsed as usual.

The snapshot's bytes are found by walking the request's top-level fields only (a handful:
context, snapshot, credentials entries, options); nothing inside them is looked at. The
snapshot holds no map fields, so the same snapshot serializes to the same bytes from any
client, and `snapshot_bytes` falls back to a deterministic serialization of the parsed
snapshot (its history messages as received) when the request did not come off the wire or
carries the snapshot field more than once (parsers merge repeated message fields).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast, overload

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor

from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb

_SNAPSHOT_FIELD = pb.StartRunRequest.DESCRIPTOR.fields_by_name["snapshot"].number
_LEN = 2  # wire type of length-delimited fields (messages, strings, map entries)
_EMPTY = pb.StartRunRequest()


def _received_class() -> Any:
    """StartRunRequest as the edge parses it: the same fields, except `snapshot.history`,
    whose messages stay bytes (the wire format of a message field and of a bytes field is
    the same). Built in a pool of its own from the generated descriptors, so it follows
    the contract as it changes."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: FileDescriptor) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        if file.name == spb.DESCRIPTOR.name:
            snapshot = next(m for m in proto.message_type if m.name == "Snapshot")
            history = next(f for f in snapshot.field if f.name == "history")
            history.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
            history.ClearField("type_name")
        pool.Add(proto)
        added.add(file.name)

    add(pb.DESCRIPTOR)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(pb.StartRunRequest.DESCRIPTOR.full_name)
    )


_RECEIVED = _received_class()


class ReceivedHistory(Sequence[spb.HistoryMessage]):
    """A received snapshot's history: each message is parsed the first time it is read.

    Reading a message whose bytes do not parse raises `google.protobuf.message.DecodeError`
    (validation names the field). A message nobody reads is never parsed, so never checked.
    """

    __slots__ = ("_parsed", "_raw")

    def __init__(self, raw: Sequence[bytes]) -> None:
        self._raw = raw
        self._parsed: dict[int, spb.HistoryMessage] = {}

    def __len__(self) -> int:
        return len(self._raw)

    @overload
    def __getitem__(self, index: int) -> spb.HistoryMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[spb.HistoryMessage]: ...

    def __getitem__(self, index: int | slice) -> spb.HistoryMessage | list[spb.HistoryMessage]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._raw)))]
        size = len(self._raw)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(index)
        message = self._parsed.get(index)
        if message is None:
            message = spb.HistoryMessage.FromString(self._raw[index])
            self._parsed[index] = message
        return message


@dataclass(slots=True)
class ReceivedStartRun:
    """A parsed StartRunRequest with its wire size and the span of its snapshot's bytes.

    `message` has every field of a StartRunRequest; read the history through `history`,
    never through `message.snapshot.history` (which holds bytes when the request came off
    the wire).
    """

    message: pb.StartRunRequest
    wire_size: int
    snapshot_wire: memoryview | None = None
    """The snapshot field's bytes as received; None when they cannot stand for it."""
    history: Sequence[spb.HistoryMessage] = field(default_factory=tuple)
    """The snapshot's history messages."""

    def release(self) -> None:
        """Lets go of the parsed request once it is converted.

        gRPC keeps the request object for as long as the response stream lasts, which
        for a run parked in a model call is minutes; the domain request holds what the
        run needs (a history window, not the whole history).
        """
        self.message = _EMPTY
        self.snapshot_wire = None
        self.history = ()

    @classmethod
    def parse(cls, data: bytes) -> ReceivedStartRun:
        """The gRPC request deserializer of StartRun."""
        message = _RECEIVED.FromString(data)
        return cls(
            cast(pb.StartRunRequest, message),
            len(data),
            _field_bytes(data, _SNAPSHOT_FIELD),
            ReceivedHistory(message.snapshot.history),
        )

    @classmethod
    def of(cls, message: pb.StartRunRequest) -> ReceivedStartRun:
        """A request built in process (no wire bytes)."""
        return cls(message, message.ByteSize(), history=message.snapshot.history)

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
