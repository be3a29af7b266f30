"""What counts as progress: a sidecar whose every execution fails the same way after
beginning a speaker makes none, so run_turn stops resending after max_attempts (before,
each execution's speaker_started counted, and it resent without end)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from roundtable.v1 import events_pb2, orchestrator_service_pb2
from roundtable_client import Client, TurnOptions
from support import demo_request

SERVICE = "roundtable.v1.OrchestratorService"


class FailingSidecar:
    """StartRun answers the run's log from seq 1; each call adds an execution that begins a
    speaker and fails retryably (as a run whose tool result the store cannot take did)."""

    def __init__(self) -> None:
        self.calls = 0
        self.log: list[events_pb2.RunEvent] = []

    def _append(self, **payload: object) -> None:
        self.log.append(events_pb2.RunEvent(run_id="p1", seq=len(self.log) + 1, **payload))

    async def start_run(
        self, request: orchestrator_service_pb2.StartRunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[orchestrator_service_pb2.StartRunResponse]:
        self.calls += 1
        if self.calls > 5:  # the bug: resent without end; end it so the test fails, not hangs
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "resent without end")
        self._append(run_started=events_pb2.RunStarted(resumed=self.calls > 1))
        self._append(speaker_started=events_pb2.SpeakerStarted(step=0, member_id="a", attempt=1))
        self._append(run_failed=events_pb2.RunFailed(code="INTERNAL", retryable=True))
        for event in self.log:
            yield orchestrator_service_pb2.StartRunResponse(event=event)


async def test_executions_that_fail_after_beginning_a_speaker_are_no_progress() -> None:
    fake = FailingSidecar()
    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        fake.start_run,
        request_deserializer=orchestrator_service_pb2.StartRunRequest.FromString,
        response_serializer=orchestrator_service_pb2.StartRunResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"StartRun": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        options = TurnOptions(max_attempts=3, initial_backoff=0.001, max_backoff=0.001)
        async with Client.connect(f"127.0.0.1:{port}") as client:
            events = [e async for e in client.run_turn(demo_request("p1", "hi"), options)]
    finally:
        await server.stop(None)
    assert fake.calls == 3
    assert events[-1].HasField("run_failed") and events[-1].run_failed.retryable
    assert [e.seq for e in events] == list(range(1, 10)), "every durable event once, in order"
