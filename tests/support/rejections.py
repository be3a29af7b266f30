"""How a call failed, as a client sees it: its status and the fields it names."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


@dataclass(frozen=True)
class Rejection:
    """What a failed call said: its code, its message and its decoded rich status."""

    code: grpc.StatusCode
    details: str
    status: status_pb2.Status | None

    @property
    def violations(self) -> dict[str, str]:
        """field path -> description, from the google.rpc.BadRequest detail (exactly one)."""
        assert self.status is not None, "no google.rpc.Status in the trailers"
        bad_requests = []
        for detail in self.status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                bad_requests.append(bad)
        assert len(bad_requests) == 1, f"expected one BadRequest detail, got {self.status}"
        fields = [v.field for v in bad_requests[0].field_violations]
        assert len(fields) == len(set(fields)), f"a field is reported twice: {fields}"
        return {v.field: v.description for v in bad_requests[0].field_violations}


async def rejection(call: grpc.aio.Call) -> Rejection:
    """Drives a unary or streaming call to its end; it must fail. Returns how it failed."""
    with pytest.raises(grpc.aio.AioRpcError):
        if isinstance(call, grpc.aio.UnaryStreamCall):
            async for _ in call:
                pass
        else:
            await call
    # Public alias of grpc_status._async.from_call; it also checks that the rich status
    # agrees with the call's own code and message.
    status = await rpc_status.aio.from_call(call)
    return Rejection(await call.code(), await call.details(), status)
