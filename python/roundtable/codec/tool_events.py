"""The tool parts of the event codec: permission requests and a reply's tool calls.

Kept beside `codec.events` (which maps every event kind) so that module stays about the
envelope; both are the one place that knows the domain types and the wire types.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.struct_pb2 import Struct

from roundtable.codec.timestamps import seconds_of, set_timestamp
from roundtable.domain import events as ev
from roundtable.domain.tools import ToolCallSummary, ToolOutcome, json_object
from roundtable.v1 import events_pb2 as epb

_OUTCOME = {
    ToolOutcome.OK: epb.TOOL_CALL_OUTCOME_OK,
    ToolOutcome.DENIED: epb.TOOL_CALL_OUTCOME_DENIED,
    ToolOutcome.EXPIRED: epb.TOOL_CALL_OUTCOME_EXPIRED,
    ToolOutcome.FAILED: epb.TOOL_CALL_OUTCOME_FAILED,
}
_OUTCOME_IN = {int(wire): domain for domain, wire in _OUTCOME.items()}


def tool_calls_to_proto(calls: Iterable[ToolCallSummary]) -> list[epb.ToolCallSummary]:
    """A reply's tool calls as `AssistantFinal.tool_calls`."""
    return [
        epb.ToolCallSummary(call_id=t.call_id, tool_name=t.tool_name, outcome=_OUTCOME[t.outcome])
        for t in calls
    ]


def tool_calls_from_proto(calls: Iterable[epb.ToolCallSummary]) -> tuple[ToolCallSummary, ...]:
    """A logged reply's tool calls (an outcome this version does not know reads as failed)."""
    return tuple(
        ToolCallSummary(t.call_id, t.tool_name, _OUTCOME_IN.get(t.outcome, ToolOutcome.FAILED))
        for t in calls
    )


def permission_to_proto(e: ev.PermissionRequired) -> epb.PermissionRequired:
    """A permission request as the contract's message (GetRun lists the waiting ones)."""
    out = epb.PermissionRequired()
    encode_permission(e, out)
    return out


def encode_permission(e: ev.PermissionRequired, p: epb.PermissionRequired) -> None:
    """Fills `p` from a permission request."""
    p.permission_request_id, p.member_id, p.reply_id, p.step = (
        e.permission_request_id,
        e.member_id,
        e.reply_id,
        e.step,
    )
    p.action = p.tool_name = e.tool_name
    p.arguments_json = e.arguments_json
    arguments = arguments_struct(e.arguments_json)
    if arguments is not None:
        p.arguments.CopyFrom(arguments)
    set_timestamp(p.expires_at, e.expires_at)


def arguments_struct(arguments_json: str) -> Struct | None:
    """Tool arguments as a Struct, when they are a JSON object (None otherwise)."""
    value = json_object(arguments_json)
    if value is None:
        return None
    out = Struct()
    try:
        out.update(value)
    except (ValueError, TypeError, OverflowError):  # one Struct cannot hold (a huge integer)
        return None
    return out


def decode_permission(p: epb.PermissionRequired) -> ev.PermissionRequired:
    return ev.PermissionRequired(
        permission_request_id=p.permission_request_id,
        reply_id=p.reply_id,
        member_id=p.member_id,
        step=p.step,
        tool_name=p.tool_name or p.action,
        arguments_json=p.arguments_json,
        expires_at=seconds_of(p.expires_at),
    )
