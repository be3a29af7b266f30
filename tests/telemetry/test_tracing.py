"""Spans and metrics as an OpenTelemetry collector receives them over OTLP."""

from __future__ import annotations

import contextlib

import grpc
import pytest
from roundtable.telemetry.attributes import CALLER_NODE, REQUEST_ID, RUN_ID, TENANT, THREAD_ID
from roundtable.telemetry.setup import telemetry_from_env
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, member, model_ref, start_request
from support.otlp import OtlpReceiver

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
RPC_SPAN = "/roundtable.v1.OrchestratorService/StartRun"


def traceparent(
    trace_id: str = CLIENT_TRACE, span_id: str = CLIENT_SPAN
) -> tuple[tuple[str, str], ...]:
    return (("traceparent", f"00-{trace_id}-{span_id}-01"), ("baggage", "tenant=tenant-1"))


async def run_traced(start_server, request) -> tuple[OtlpReceiver, list]:
    with OtlpReceiver() as receiver:
        telemetry = telemetry_from_env(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                "OTEL_SERVICE_NAME": "roundtable-test",
            }
        )
        async with start_server(telemetry=telemetry) as server:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                events = await collect(stub.StartRun(request, metadata=traceparent()))
            telemetry.force_flush()
    return receiver, events


async def test_a_group_turn_is_one_trace_under_the_client_span(start_server) -> None:
    roster = [
        member(
            "a",
            "Alice",
            "SECRET-PERSONA-TEXT speaks softly.",
            model=model_ref("offline", "member-model"),
        ),
        member("b", "Bob"),
    ]
    request = start_request(
        "USER-TEXT-MARKER what should we cook?", members=roster, run_id="traced-1", thread_id="th-9"
    )
    receiver, events = await run_traced(start_server, request)
    spans = receiver.spans
    assert spans, "spans were exported"
    assert {s.trace_id for s in spans} == {CLIENT_TRACE}, "one trace, the gateway's"
    (rpc,) = receiver.named(RPC_SPAN)
    assert rpc.parent_span_id == CLIENT_SPAN, "the RPC span is a child of the client span"
    (run,) = receiver.named("roundtable.run")
    by_id = {s.span_id: s for s in spans}
    for node in (
        "hydrate_context",
        "route_session",
        "classify_directive",
        "supervisor",
        "dispatch",
        "convergence",
        "propose_memory",
    ):
        assert receiver.named(node), f"a span for node {node}"
        assert all(by_id[s.parent_span_id] is run for s in receiver.named(node))
    agents = [s for s in spans if s.name.startswith("invoke_agent ")]
    assert agents and all(by_id[s.parent_span_id].name == "dispatch" for s in agents)
    assert {s.attributes["gen_ai.agent.id"] for s in agents} == {
        f.member_id for f in finals(events)
    }
    chats = [s for s in spans if s.name.startswith("chat ")]
    parents = {by_id[s.parent_span_id].name for s in chats}
    assert "supervisor" in parents and any(p.startswith("invoke_agent ") for p in parents)
    member_chat = next(s for s in chats if by_id[s.parent_span_id].name == "invoke_agent Alice")
    assert member_chat.attributes["gen_ai.operation.name"] == "chat"
    assert member_chat.attributes["gen_ai.provider.name"] == "offline"
    assert member_chat.attributes["gen_ai.request.model"] == "member-model"
    assert member_chat.attributes["gen_ai.usage.output_tokens"] > 0
    assert member_chat.attributes["gen_ai.conversation.id"] == "th-9"
    for span in spans:
        attrs = span.attributes
        assert attrs[THREAD_ID] == "th-9" and attrs[RUN_ID] == "traced-1", span.name
        assert attrs[TENANT] == "tenant-1" and attrs[REQUEST_ID] == request.context.request_id
        assert attrs[CALLER_NODE], span.name
        text = repr(attrs)
        assert "SECRET-PERSONA-TEXT" not in text and "USER-TEXT-MARKER" not in text
        assert not any(f.content in text for f in finals(events))
    assert {s.attributes[CALLER_NODE] for s in chats} >= {"supervisor", "dispatch"}


async def test_count_off_has_a_deterministic_router_span(start_server) -> None:
    receiver, _ = await run_traced(start_server, start_request("报数", run_id="traced-2"))
    assert receiver.named("deterministic_router") and not receiver.named("supervisor")
    assert len([s for s in receiver.spans if s.name.startswith("invoke_agent ")]) == 4
    # Nothing to remember: convergence ends the graph at dispatch, propose_memory never runs.
    assert receiver.named("convergence") and not receiver.named("propose_memory")


async def test_a_resumed_run_continues_the_new_trace_and_links_to_the_first(start_server) -> None:
    slow = spb.ModelRef(
        target=spb.ModelTarget(
            provider="offline", model="slow", base_url="offline:?token_delay_ms=15"
        )
    )
    roster = [member(m, n, model=slow) for m, n in (("a", "Alice"), ("b", "Bob"), ("c", "Carol"))]
    request = start_request("@all hi", members=roster, run_id="traced-3", thread_id="th-3")
    second_trace, second_span = "11111111111111111111111111111111", "2222222222222222"
    with OtlpReceiver() as receiver:
        telemetry = telemetry_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        async with start_server(telemetry=telemetry) as server:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                call = stub.StartRun(request, metadata=traceparent())
                async for response in call:
                    if response.event.WhichOneof("payload") == "speaker_started":
                        await stub.CancelRun(
                            pb.CancelRunRequest(
                                run_id="traced-3", tenant="tenant-1", mode=pb.CANCEL_MODE_IMMEDIATE
                            )
                        )
                await collect(
                    stub.StartRun(request, metadata=traceparent(second_trace, second_span))
                )
            telemetry.force_flush()
    runs = receiver.named("roundtable.run")
    assert len(runs) == 2
    first_rpc = next(s for s in receiver.named(RPC_SPAN) if s.trace_id == CLIENT_TRACE)
    resumed = next(s for s in runs if s.trace_id == second_trace)
    assert resumed.attributes["roundtable.resumed"] is True
    assert resumed.links == [(CLIENT_TRACE, first_rpc.span_id)]


async def test_get_stream_and_cancel_spans_carry_the_run_they_are_about(start_server) -> None:
    request = start_request("报数", run_id="traced-4", thread_id="th-4")
    with OtlpReceiver() as receiver:
        telemetry = telemetry_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        async with start_server(telemetry=telemetry) as server:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                await collect(stub.StartRun(request))
                ids = dict(run_id="traced-4", tenant="tenant-1")
                await stub.GetRun(pb.GetRunRequest(**ids))
                await collect(stub.StreamRun(pb.StreamRunRequest(**ids)))
                await stub.CancelRun(pb.CancelRunRequest(**ids))
                with pytest.raises(grpc.aio.AioRpcError) as gap:
                    await collect(stub.StreamRun(pb.StreamRunRequest(**ids, after_seq=99)))
            telemetry.force_flush()
    assert gap.value.code() is grpc.StatusCode.FAILED_PRECONDITION  # STREAM_GAP
    spans = {
        rpc: receiver.named(f"/roundtable.v1.OrchestratorService/{rpc}")
        for rpc in ("GetRun", "StreamRun", "CancelRun")
    }
    assert [len(spans[rpc]) for rpc in spans] == [1, 2, 1]
    for rpc, of_rpc in spans.items():
        for span in of_rpc:
            attrs = span.attributes
            assert (attrs[RUN_ID], attrs[TENANT], attrs[CALLER_NODE]) == (
                "traced-4",
                "tenant-1",
                rpc,
            )
            # Review: StreamRun's had none; then a failed one's (past the last seq) had none.
            assert attrs[THREAD_ID] == "th-4", rpc


async def test_a_failed_rpcs_span_says_its_status_code(start_server) -> None:
    # Outside testing: every failed RPC's span said rpc.grpc.status_code 0: the interceptor
    # learns a code from abort or set_code, not from abort_with_status. (Its status stays
    # unset for a caller's mistake, as OpenTelemetry's gRPC conventions want of a server.)
    bad = start_request("hi", run_id="traced-5")
    bad.context.tenant = ""
    with OtlpReceiver() as receiver:
        telemetry = telemetry_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        async with start_server(telemetry=telemetry) as server:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                for call in (
                    stub.GetRun(pb.GetRunRequest(run_id="nobody", tenant="tenant-1")),
                    collect(stub.StartRun(bad)),
                ):
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await call
            telemetry.force_flush()
    for rpc, code in (
        ("GetRun", grpc.StatusCode.NOT_FOUND),
        ("StartRun", grpc.StatusCode.INVALID_ARGUMENT),
    ):
        (span,) = receiver.named(f"/roundtable.v1.OrchestratorService/{rpc}")
        assert span.attributes["rpc.grpc.status_code"] == code.value[0], rpc


async def test_metrics_are_exported(start_server) -> None:
    with OtlpReceiver() as receiver:
        telemetry = telemetry_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        async with start_server(telemetry=telemetry) as server:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                await collect(stub.StartRun(start_request("报数")))
            telemetry.force_flush()
    assert receiver.metric_names >= {
        "roundtable.runs",
        "roundtable.run.duration",
        "roundtable.speaker.duration",
        "gen_ai.client.operation.duration",
        "roundtable.events.streamed",
    }


def test_nothing_is_exported_without_an_endpoint() -> None:
    assert not telemetry_from_env({}).enabled
    assert not telemetry_from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_SDK_DISABLED": "true"}
    ).enabled


def test_traces_say_whether_spans_go_anywhere() -> None:
    # `serve` installs the gRPC tracing interceptor only when this is true.
    assert not telemetry_from_env({}).traces
    assert not telemetry_from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_TRACES_EXPORTER": "none"}
    ).traces
    assert telemetry_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}).traces


async def test_an_untraced_replica_still_records_the_callers_span_for_resume_links(
    server, stub
) -> None:
    # No exporter here, so no interceptor and no spans; a replica that exports spans and
    # resumes this run links to the gateway's span through the record.
    request = start_request("大家报数！", run_id="untraced-1")
    events = await collect(stub.StartRun(request, metadata=traceparent()))
    assert events[-1].WhichOneof("payload") == "run_completed"
    record = await server.store.get_run("tenant-1", "untraced-1")
    assert record is not None and record.trace_context == f"{CLIENT_TRACE}-{CLIENT_SPAN}"
    await collect(stub.StartRun(start_request("大家报数！", run_id="untraced-2")))
    record = await server.store.get_run("tenant-1", "untraced-2")
    assert record is not None and record.trace_context == ""
