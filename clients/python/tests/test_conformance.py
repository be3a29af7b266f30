"""The scenarios of clients/conformance.md, each against a real `roundtable serve`."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest
from roundtable.v1 import events_pb2, orchestrator_service_pb2
from roundtable_client import (
    CONTRACT_VERSION,
    SHUTDOWN_REASON,
    AttemptsExhausted,
    Client,
    Reason,
    RoundtableError,
    TurnOptions,
)
from support import (
    PATIENT,
    CutProxy,
    Sidecar,
    ToolServer,
    collect,
    demo_request,
    self_signed,
    tool_request,
)


def test_contract_version() -> None:
    assert orchestrator_service_pb2.DESCRIPTOR.package == CONTRACT_VERSION


async def test_c1_clean_turn(sidecar) -> None:
    server = await sidecar("--offline-token-delay-ms", "2")
    async with Client.connect(server.address) as client:
        seen = await collect(client, demo_request("c1", "大家报数！"))
        seen.assert_completed_once()
        assert seen.kinds()[:2] == ["run_started", "plan_created"]
        for number, final in enumerate(seen.finals(), start=1):
            assert str(number) in final.content
        assert seen.retries == []
        run = await client.get_run("c1", "demo")
        assert run.status == orchestrator_service_pb2.RUN_STATUS_SUCCEEDED
        assert run.last_seq == seen.events[-1].seq


@pytest.mark.parametrize(
    ("wire", "seen_events", "finals_seen"),
    [(1, 0, 0), (0, 3, 0), (0, 0, 2)],
    ids=["after_1_message", "after_3rd_event", "after_2nd_final"],
)
async def test_c2_stream_cut(sidecar, wire: int, seen_events: int, finals_seen: int) -> None:
    """The connection dies after the first message on the wire (the client may not have
    yielded it yet), or once the caller has seen its 3rd event or its 2nd final (cut from
    the caller's callback: counting on the wire, the client can lose messages it had
    received but not yet yielded when the connection goes, and rightly starts again)."""
    server = await sidecar("--offline-token-delay-ms", "5")
    proxy = CutProxy(server.address, after=wire)
    address = await proxy.start()
    events = finals = 0

    def cut_when_seen(event: events_pb2.RunEvent) -> None:
        nonlocal events, finals
        events += 1
        if events == seen_events:
            proxy.cut()
        if event.HasField("assistant_final"):
            finals += 1
            if finals == finals_seen:
                proxy.cut()

    try:
        async with Client.connect(address) as client:
            seen = await collect(
                client,
                demo_request(
                    f"c2-{wire}-{seen_events}-{finals_seen}", "@all tell me about your day"
                ),
                on_event=cut_when_seen,
            )
    finally:
        await proxy.close()
    seen.assert_completed_once()
    assert proxy.cuts >= 1 and seen.retries, "the cut was retried"
    for seen_retry in seen.retries:
        if seen_retry.last_seen > 0:  # events were yielded: re-attach right after the last
            assert seen_retry.retry.op == "StreamRun"
            assert seen_retry.retry.after_seq == seen_retry.last_seen
    if not wire:
        assert any(r.retry.op == "StreamRun" for r in seen.retries)


async def restart_mid_turn(sidecar, sig: int, run_id: str):
    """Runs a turn; after its 2nd assistant_final the sidecar gets `sig` and starts again on
    the same port and database."""
    server: Sidecar = await sidecar("--offline-token-delay-ms", "10", "--grace-seconds", "5")
    finals = 0
    restarted: list[asyncio.Task[Sidecar]] = []

    async def stop_after_second_final(event: events_pb2.RunEvent) -> None:
        nonlocal finals
        if event.HasField("assistant_final"):
            finals += 1
            if finals == 2:
                await server.stop(sig)
                restarted.append(asyncio.create_task(server.start()))

    async with Client.connect(server.address) as client:
        async with asyncio.timeout(90):
            seen = await collect(
                client,
                demo_request(run_id, "@all tell me about your day"),
                PATIENT,
                on_event=stop_after_second_final,
            )
        await asyncio.gather(*restarted)
    seen.assert_completed_once()
    assert any(r.retry.op == "StartRun" for r in seen.retries), seen.retries
    return seen


async def test_c3_sigkill_restart(sidecar) -> None:
    seen = await restart_mid_turn(sidecar, signal.SIGKILL, "c3")
    assert any(e.HasField("run_started") and e.run_started.resumed for e in seen.events)


async def test_c4_graceful_shutdown_restart(sidecar) -> None:
    seen = await restart_mid_turn(sidecar, signal.SIGTERM, "c4")
    assert any(
        e.HasField("run_cancelled") and e.run_cancelled.reason == SHUTDOWN_REASON
        for e in seen.events
    ), seen.kinds()
    assert all(r.retry.op == "StartRun" for r in seen.retries if r.retry.ended is not None)


async def test_c5_resource_exhausted(sidecar) -> None:
    server = await sidecar("--offline-token-delay-ms", "25", "--max-runs", "1")
    async with Client.connect(server.address) as client:
        holder_started = asyncio.Event()
        holder = asyncio.create_task(
            collect(
                client,
                demo_request("c5-holder", "@all tell me about your day"),
                on_event=lambda _: holder_started.set(),
            )
        )
        await holder_started.wait()

        # Too few attempts to outlast the holder: a typed TOO_MANY_RUNS.
        refused = await collect(
            client, demo_request("c5-refused", "大家报数！"), TurnOptions(max_attempts=2)
        )
        error = refused.error
        assert isinstance(error, AttemptsExhausted), repr(error)
        assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.reason == Reason.TOO_MANY_RUNS and error.retryable
        assert error.retry_delay is not None and error.retry_delay > 0
        assert error.attempts == 2
        assert refused.events == [] and [r.retry.op for r in refused.retries] == ["StartRun"]

        # Patient: it waits per RetryInfo and completes once the slot frees.
        waited = await collect(client, demo_request("c5-waits", "大家报数！"), PATIENT)
        waited.assert_completed_once()
        assert waited.retries
        for seen_retry in waited.retries:
            assert seen_retry.retry.op == "StartRun"
            assert seen_retry.retry.error is not None
            assert seen_retry.retry.error.reason == Reason.TOO_MANY_RUNS
            assert seen_retry.retry.delay == seen_retry.retry.error.retry_delay
        (await holder).assert_completed_once()


async def test_c6_invalid_argument(sidecar) -> None:
    server = await sidecar()
    request = demo_request("c6", "@nobody hello")
    request.snapshot.session.primary_member_id = "ghost"  # no such member
    request.snapshot.members[1].member_id = "lin"  # a duplicate id
    request.snapshot.user_turn.mentions.append("nobody-with-this-id")  # names no member
    async with Client.connect(server.address) as client:
        seen = await collect(client, request)
    error = seen.error
    assert error is not None and not isinstance(error, AttemptsExhausted), repr(error)
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert error.reason == Reason.INVALID_REQUEST and not error.retryable
    assert error.attempts == 1 and seen.retries == []
    fields = {v.field for v in error.violations}
    assert {
        "snapshot.session.primary_member_id",
        "snapshot.members[1].member_id",
        "snapshot.user_turn.mentions[0]",
    } <= fields, error.violations
    assert all(v.description for v in error.violations)


async def test_c7_token_over_tls(sidecar, tmp_path: Path) -> None:
    cert, key, pem = self_signed(tmp_path)
    server = await sidecar(
        "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--auth-tokens", "tok-right=demo"
    )
    async with Client.connect(server.address, root_certificates=pem, token="tok-right") as client:
        (await collect(client, demo_request("c7", "大家报数！"))).assert_completed_once()
    async with Client.connect(server.address, root_certificates=pem, token="tok-wrong") as client:
        wrong = await collect(client, demo_request("c7-wrong", "大家报数！"))
    error = wrong.error
    assert error is not None and not isinstance(error, AttemptsExhausted), repr(error)
    assert error.code is grpc.StatusCode.UNAUTHENTICATED
    assert error.reason == Reason.UNAUTHENTICATED and not error.retryable
    assert error.attempts == 1 and wrong.retries == []
    assert "tok-wrong" not in str(error)


def test_a_token_is_not_sent_in_cleartext() -> None:
    with pytest.raises(ValueError, match="cleartext"):
        Client.connect("127.0.0.1:1", token="tok")


async def test_c8_permission_approval(sidecar, tool_server: ToolServer) -> None:
    """A tool call that needs approval: the turn's stream stays open while the run waits;
    resolve_permission decides, and the same iteration goes on to the reply."""
    server = await sidecar("--offline-token-delay-ms", "2")
    approve, deny = (
        orchestrator_service_pb2.PERMISSION_DECISION_APPROVE,
        (orchestrator_service_pb2.PERMISSION_DECISION_DENY),
    )
    async with Client.connect(server.address) as client:
        # (a) Approved: the tool runs once, the reply quotes it, its final lists the call.
        asked: list[events_pb2.PermissionRequired] = []

        async def approve_it(event: events_pb2.RunEvent) -> None:
            if event.HasField("permission_required"):
                request = event.permission_required
                asked.append(request)
                run = await client.get_run("c8", "demo")
                assert [p.permission_request_id for p in run.pending_permissions] == [
                    request.permission_request_id
                ]
                answer = await client.resolve_permission(
                    "c8", "demo", request.permission_request_id, approve
                )
                assert answer.decision == approve and answer.run.run_id == "c8"
                assert answer.HasField("decided_at")

        seen = await collect(
            client,
            tool_request("c8", "@Mei use note to buy milk", tool_server.url),
            on_event=approve_it,
        )
        assert seen.error is None, repr(seen.error)
        assert seen.kinds()[-1] == "run_completed"
        (request,) = asked
        key = request.permission_request_id
        assert (request.member_id, request.tool_name) == ("mei", "note")
        assert request.arguments["text"] == "buy milk" and request.arguments_json
        assert request.HasField("expires_at")
        (final,) = seen.finals()
        assert "noted 'buy milk'" in final.content
        assert [(c.call_id, c.tool_name, c.outcome) for c in final.tool_calls] == [
            (key, "note", events_pb2.TOOL_CALL_OUTCOME_OK)
        ]
        # The tool server sees the call's idempotency key: <tenant>/<run_id>/<request id>.
        assert tool_server.counts("note") == {f"demo/c8/{key}": 1}

        # (b) Decided: the same decision again answers the same; the other one, an unknown
        # request and an unknown run are typed errors.
        again = await client.resolve_permission("c8", "demo", key, approve)
        assert again.decision == approve
        for run_id, request_id, code, reason in [
            ("c8", key, grpc.StatusCode.FAILED_PRECONDITION, Reason.PERMISSION_DECIDED),
            ("c8", "c8#0/9", grpc.StatusCode.NOT_FOUND, Reason.PERMISSION_NOT_FOUND),
            ("no-such-run", "x#0/1", grpc.StatusCode.NOT_FOUND, Reason.RUN_NOT_FOUND),
        ]:
            with pytest.raises(RoundtableError) as refused:
                await client.resolve_permission(run_id, "demo", request_id, deny, "too late")
            error = refused.value
            assert (error.code, error.reason, error.retryable) == (code, reason, False)
            if reason == Reason.PERMISSION_DECIDED:
                assert "approve" in error.message, error.message

        # (c) Denied: the tool never runs, the member is told, the final says DENIED.
        denied: list[str] = []

        async def deny_it(event: events_pb2.RunEvent) -> None:
            if event.HasField("permission_required"):
                denied.append(event.permission_required.permission_request_id)
                await client.resolve_permission(
                    "c8-deny", "demo", denied[0], deny, reason="not today"
                )

        seen = await collect(
            client,
            tool_request("c8-deny", "@Mei use note to sell the car", tool_server.url),
            on_event=deny_it,
        )
        assert seen.error is None, repr(seen.error)
        (final,) = seen.finals()
        assert [c.outcome for c in final.tool_calls] == [events_pb2.TOOL_CALL_OUTCOME_DENIED]
        assert denied and tool_server.counts("note").get(f"demo/c8-deny/{denied[0]}") is None
