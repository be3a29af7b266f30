"""A StartRun whose member may call tools on the test MCP server, and how a test reads
its stream while the run waits for a decision (tests of tools and approval share these)."""

from __future__ import annotations

import asyncio
import json

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb

from support.builders import kinds, member, of_kind, start_request
from support.mcp_server import McpServerProcess

WEATHER_SCHEMA = json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
)
NOTE_SCHEMA = json.dumps(
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
)
APPROVE, DENY = pb.PERMISSION_DECISION_APPROVE, pb.PERMISSION_DECISION_DENY


def tool_request(
    text: str, mcp: McpServerProcess, run_id: str, *, approval_timeout_s: int = 0
) -> pb.StartRunRequest:
    """A single chat whose member may call `weather` (read-only, no approval) and `note`
    (a write that needs approval)."""
    mei = member("mei", "Mei")
    mei.tool_names.extend(["weather", "note"])
    request = start_request(
        text,
        members=[mei],
        run_id=run_id,
        thread_id=f"t-{run_id}",
        kind=spb.SESSION_KIND_SINGLE,
        budgets=spb.Budgets(approval_timeout_seconds=approval_timeout_s)
        if approval_timeout_s
        else None,
    )
    session = request.snapshot.session
    session.tool_servers.add(server_id="local", url=mcp.url)
    session.tools.add(
        name="weather",
        description="The weather in a city.",
        input_schema_json=WEATHER_SCHEMA,
        server_id="local",
        read_only=True,
    )
    session.tools.add(
        name="note",
        description="Writes a note.",
        input_schema_json=NOTE_SCHEMA,
        server_id="local",
        approval=spb.APPROVAL_POLICY_ALWAYS,
    )
    return request


def group_tool_request(
    text: str, mcp: McpServerProcess, run_id: str, *, parallel: bool = False
) -> pb.StartRunRequest:
    """`tool_request` as a group of three alike (Mei, Kai, Lin), one after another unless
    `parallel`."""
    request = tool_request(text, mcp, run_id)
    mei = request.snapshot.members[0]
    for member_id, name in (("kai", "Kai"), ("lin", "Lin")):
        other = request.snapshot.members.add()
        other.CopyFrom(mei)
        other.member_id, other.display_name = member_id, name
    session = request.snapshot.session
    session.kind = spb.SESSION_KIND_GROUP
    session.primary_member_id = "mei"
    if parallel:
        session.speaker_concurrency = spb.SPEAKER_CONCURRENCY_PARALLEL
    return request


def one_waits_while_others_answer(mcp: McpServerProcess, run_id: str) -> pb.StartRunRequest:
    """A parallel `group_tool_request` in which only Mei may use tools: her `note` call
    waits for a person while Kai and Lin (no tools, a slow model) still answer."""
    request = group_tool_request("@all use note for buy milk", mcp, run_id, parallel=True)
    slow = spb.ModelTarget(provider="offline", model="slow", base_url="offline:?token_delay_ms=60")
    for other in request.snapshot.members[1:]:
        del other.tool_names[:]
        other.model.target.CopyFrom(slow)
    return request


class Reader:
    """A StartRun stream read event by event in the background."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self.call = call
        self.events: list[epb.RunEvent] = []
        self._arrived = asyncio.Event()
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            self.events.append(response.event)
            self._arrived.set()

    async def until(self, kind: str, wait_s: float = 20.0, *, nth: int = 1) -> epb.RunEvent:
        """The `nth` event of `kind` (the first by default), once it arrived."""
        async with asyncio.timeout(wait_s):
            while True:
                found = of_kind(self.events, kind)
                if len(found) >= nth:
                    return found[nth - 1]
                if self.task.done():
                    self.task.result()
                    raise AssertionError(f"stream ended without {kind}: {kinds(self.events)}")
                self._arrived.clear()
                await self._arrived.wait()

    async def end(self, wait_s: float = 20.0) -> list[epb.RunEvent]:
        try:
            async with asyncio.timeout(wait_s):
                await self.task
        except TimeoutError:
            raise AssertionError(f"the stream did not end: {kinds(self.events)}") from None
        return self.events


async def waiting_run(stub: pb_grpc.OrchestratorServiceStub, run_id: str) -> pb.Run:
    """The run once it waits (it parks a moment after permission_required is sent; until
    then it is running, with the request already listed)."""
    async with asyncio.timeout(10):
        while True:
            run = (await stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant="tenant-1"))).run
            assert run.pending_permissions
            if run.status == pb.RUN_STATUS_AWAITING_APPROVAL:
                return run
            assert run.status == pb.RUN_STATUS_RUNNING
            await asyncio.sleep(0.01)


def reason_of(error: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(error)
    assert status is not None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return ""


def sent_key(run_id: str, call_key: str, *, tenant: str = "tenant-1") -> str:
    """The idempotency key the tool server gets for the run's call `call_key` (its
    permission_request_id, `<reply_id>/<n>`): the test MCP server counts by it."""
    return f"{tenant}/{run_id}/{call_key}"


def resolve(
    run_id: str, request_id: str, decision: int, *, tenant: str = "tenant-1", **kwargs: str
) -> pb.ResolvePermissionRequest:
    return pb.ResolvePermissionRequest(
        run_id=run_id,
        tenant=tenant,
        permission_request_id=request_id,
        decision=decision,
        **kwargs,
    )
