"""The edge, as an attacker and a careless client meet it: what it reads, holds and answers.

Run against a real `roundtable serve` process, so the memory measured is the server's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2
from grpc_status import rpc_status
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb

from tests.support.builders import start_request
from tests.support.process import ServerProcess

TOKEN = "edge-test-token-0123456789"
START_RUN = "/roundtable.v1.OrchestratorService/StartRun"
GET_RUN = "/roundtable.v1.OrchestratorService/GetRun"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _big_request(size: int) -> bytes:
    """A StartRunRequest of about `size` bytes that parses (one huge history message)."""
    request = start_request("hello")
    request.snapshot.history.add(message_id="m-big", role=spb.MESSAGE_ROLE_USER, content="x" * size)
    return request.SerializeToString()


def _raw_call(channel: grpc.aio.Channel, method: str, streaming: bool) -> object:
    """A call that sends the given bytes as they are."""
    make = channel.unary_stream if streaming else channel.unary_unary
    return make(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)


async def _code_of(call: object) -> grpc.aio.AioRpcError:
    try:
        result = call
        if hasattr(result, "__aiter__"):
            async for _ in result:  # type: ignore[attr-defined]
                pass
        else:
            await result  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        return error
    raise AssertionError("the call succeeded")


@pytest.fixture
async def guarded(tmp_path: Path):
    server = await ServerProcess(
        tmp_path / "rt.db",
        tmp_path / "serve.log",
        "--auth-tokens",
        f"{TOKEN}=*",
        "--max-calls-per-caller",
        "3",
        "--offline-token-delay-ms",
        "300",
    ).start()
    try:
        yield server
    finally:
        await server.stop()


async def test_token_less_requests_are_refused_before_they_are_read(guarded) -> None:
    body = _big_request(16_500_000)
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    async with grpc.aio.insecure_channel(guarded.address, options=options) as channel:
        start = _raw_call(channel, START_RUN, streaming=True)
        await _code_of(start(b""))  # warm the server's paths with a small refused call
        before = _rss_kib(guarded.proc.pid)
        gate = asyncio.Semaphore(16)

        async def attack() -> grpc.StatusCode:
            async with gate:
                return (await _code_of(start(body, timeout=60))).code()

        codes = await asyncio.gather(*(attack() for _ in range(64)))
        after = _rss_kib(guarded.proc.pid)
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
    # Reading the 64 bodies would have cost the server GBs (it did: 127 MB -> 2.1 GB).
    assert after - before < 20 * 1024, f"RSS grew by {(after - before) // 1024} MiB"


async def test_a_caller_holds_a_bounded_number_of_calls(guarded) -> None:
    auth = (("authorization", f"Bearer {TOKEN}"),)
    async with grpc.aio.insecure_channel(guarded.address) as channel:
        from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc

        stub = pb_grpc.OrchestratorServiceStub(channel)
        # Three slow turns held open (the offline model pauses 2 s per token) ...
        slow = [
            stub.StartRun(
                start_request("@all hello", thread_id=f"t-{i}", tenant="acme"), metadata=auth
            )
            for i in range(3)
        ]
        for call in slow:
            await call.read()  # the first event: the call is in flight
        # ... and a fourth call of the same caller is refused, with a hint when to retry.
        error = await _code_of(
            stub.GetRun(pb.GetRunRequest(run_id="r", tenant="acme"), metadata=auth)
        )
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        details = rpc_status.from_call(error).details
        assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in details)
        for call in slow:
            call.cancel()
        await asyncio.sleep(0.2)
        # Once they end, the caller's calls go through again.
        error = await _code_of(
            stub.GetRun(pb.GetRunRequest(run_id="r", tenant="acme"), metadata=auth)
        )
        assert error.code() is grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    "method, streaming",
    [
        (START_RUN, True),
        (GET_RUN, False),
        ("/roundtable.v1.OrchestratorService/CancelRun", False),
        ("/roundtable.v1.OrchestratorService/StreamRun", True),
        ("/grpc.health.v1.Health/Check", False),
    ],
)
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x0a\x02\xff\xfe", id="invalid-utf8"),
        pytest.param(b"\x0a\x10abc", id="truncated"),
        pytest.param(b"\x08" + b"\xff" * 11, id="overlong-varint"),
    ],
)
async def test_bytes_that_do_not_parse_are_invalid_argument(
    guarded, method: str, streaming: bool, body: bytes
) -> None:
    auth = (("authorization", f"Bearer {TOKEN}"),)
    async with grpc.aio.insecure_channel(guarded.address) as channel:
        error = await _code_of(_raw_call(channel, method, streaming)(body, metadata=auth))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error
    assert "class" not in (error.details() or "") and "DecodeError" not in (error.details() or "")
    assert method in (error.details() or "")


async def test_health_needs_no_token_and_still_answers(guarded) -> None:
    async with grpc.aio.insecure_channel(guarded.address) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        answer = await check(health_pb2.HealthCheckRequest(), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_run_takes_a_bounded_number_of_streams(tmp_path: Path) -> None:
    from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc

    server = await ServerProcess(
        tmp_path / "rt.db",
        tmp_path / "serve.log",
        "--max-streams-per-run",
        "3",
        "--offline-token-delay-ms",
        "300",
    ).start()
    try:
        async with server.channel() as channel:
            stub = pb_grpc.OrchestratorServiceStub(channel)
            turn = stub.StartRun(start_request("@all hello", run_id="run-many"))
            await turn.read()
            followers = [
                stub.StreamRun(pb.StreamRunRequest(run_id="run-many", tenant="tenant-1"))
                for _ in range(2)
            ]
            for follower in followers:
                await follower.read()
            # The turn's own stream and two followers: a third follower is one too many.
            error = await _code_of(
                stub.StreamRun(pb.StreamRunRequest(run_id="run-many", tenant="tenant-1"))
            )
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "streams attached" in (error.details() or "")
            followers[0].cancel()
            await asyncio.sleep(0.2)
            again = stub.StreamRun(pb.StreamRunRequest(run_id="run-many", tenant="tenant-1"))
            assert (await again.read()).event.seq == 1
            turn.cancel()
    finally:
        await server.stop()


async def test_only_the_retryable_resource_exhausted_carries_a_retry_info(
    start_server, caplog: pytest.LogCaptureFixture
) -> None:
    # The transport's size limit (max_request_bytes + 1 MiB) answers RESOURCE_EXHAUSTED
    # with no RetryInfo: the contract's sign that sending it again cannot help. A client's
    # mistake: the server logs no error for it (it logged two tracebacks per call).
    async with (
        start_server(max_request_bytes=1024) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        start = _raw_call(channel, START_RUN, streaming=True)
        get = _raw_call(channel, GET_RUN, streaming=False)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            error = await _code_of(start(_big_request(2 * 1024 * 1024), timeout=30))
            unary = await _code_of(get(_big_request(2 * 1024 * 1024), timeout=30))
            await asyncio.sleep(0.2)  # the server's side of the calls finishes
    assert unary.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    details = rpc_status.from_call(error)
    assert details is None or not any(
        d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in details.details
    )


def _reason(error: grpc.aio.AioRpcError) -> str | None:
    status = rpc_status.from_call(error)
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.domain == "roundtable.v1"
            return info.reason
    return None


def test_the_proto_error_table_lists_every_reason_the_server_sends() -> None:
    import re

    from roundtable.api.errors import WIRE

    proto = (
        Path(__file__).parents[2] / "proto/roundtable/v1/orchestrator_service.proto"
    ).read_text()
    table = proto[proto.index("// Errors are gRPC") : proto.index("service OrchestratorService")]
    listed = set(re.findall(r"\[([A-Z_]+)\]", table))
    sent = {wire.reason for wire in WIRE.values()} | {"INTERNAL"}
    assert listed == sent
    for wire in WIRE.values():  # each reason under its own status code's heading
        heading = table.index(f"//   {wire.code.name}")
        nxt = [m.start() for m in re.finditer(r"\n//   [A-Z_]+ ", table) if m.start() > heading]
        section = table[heading : nxt[0]] if nxt else table[heading:]
        assert f"[{wire.reason}]" in section, (wire.reason, wire.code.name)


async def test_errors_carry_their_reason(guarded) -> None:
    auth = (("authorization", f"Bearer {TOKEN}"),)
    from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(guarded.address) as channel:
        stub = pb_grpc.OrchestratorServiceStub(channel)
        missing = await _code_of(
            stub.GetRun(pb.GetRunRequest(run_id="r", tenant="t"), metadata=auth)
        )
        bad = await _code_of(stub.GetRun(pb.GetRunRequest(run_id="", tenant="t"), metadata=auth))
        garbled = await _code_of(_raw_call(channel, GET_RUN, False)(b"\x0a\x10abc", metadata=auth))
        anonymous = await _code_of(stub.GetRun(pb.GetRunRequest(run_id="r", tenant="t")))
    assert _reason(missing) == "RUN_NOT_FOUND"
    assert _reason(bad) == "INVALID_REQUEST"
    assert _reason(garbled) == "UNDECODABLE_REQUEST"
    assert _reason(anonymous) == "UNAUTHENTICATED"


async def test_a_bug_is_internal_with_a_plain_message_and_logged_whole(caplog) -> None:
    from roundtable.api.auth import Authenticator
    from roundtable.api.edge import CallLimiter, EdgeInterceptor

    async def boom(request: bytes, context: object) -> bytes:
        raise KeyError("a-detail-of-the-bug")

    server = grpc.aio.server(interceptors=[EdgeInterceptor(Authenticator(), CallLimiter(0))])
    handler = grpc.unary_unary_rpc_method_handler(boom)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("t.T", {"Boom": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            error = await _code_of(_raw_call(channel, "/t.T/Boom", False)(b""))
    finally:
        await server.stop(None)
    assert error.code() is grpc.StatusCode.INTERNAL
    assert error.details() == "internal error: /t.T/Boom"
    assert _reason(error) == "INTERNAL"
    assert "a-detail-of-the-bug" in caplog.text  # the log has it all


async def test_a_status_the_client_left_before_is_no_bug_to_log(caplog) -> None:
    # Seen in CI: a stream aborted with its error just as its client left: the abort found
    # the call over, the edge logged that as a bug and aborted again ("Abort already
    # called!"), two ERROR tracebacks for a client that had simply gone.
    from google.rpc import status_pb2
    from roundtable.api.auth import Authenticator
    from roundtable.api.edge import CallLimiter, EdgeInterceptor

    ended = asyncio.Event()

    async def stream(request: bytes, context: grpc.aio.ServicerContext):
        yield b"first"
        # As a stream whose run's error came just as its client left:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        try:
            unavailable = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0])
            await context.abort_with_status(rpc_status.to_status(unavailable))
        finally:
            ended.set()

    server = grpc.aio.server(interceptors=[EdgeInterceptor(Authenticator(), CallLimiter(0))])
    handler = grpc.unary_stream_rpc_method_handler(stream)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"S": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = _raw_call(channel, "/t.T/S", True)(b"")
            async for _ in call:  # type: ignore[attr-defined]
                call.cancel()  # type: ignore[attr-defined]
                break
            await asyncio.wait_for(ended.wait(), 10)
            await asyncio.sleep(0.2)  # the edge's handling of what the abort raised
    finally:
        await server.stop(None)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
