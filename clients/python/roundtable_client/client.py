"""The one call that runs a turn, plus cancel and get_run, over the generated roundtable.v1 stub."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import grpc
from roundtable.v1 import events_pb2, orchestrator_service_pb2, orchestrator_service_pb2_grpc

from roundtable_client.errors import Action, AttemptsExhausted, RoundtableError, action_of, error_of

CONTRACT_VERSION = "roundtable.v1"
"""The contract this library speaks: the proto package roundtable.v1."""

SHUTDOWN_REASON = "server_shutdown"
"""run_cancelled's reason when the sidecar stopped the run to shut down: the same StartRun
resumes it."""

Op = Literal["StartRun", "StreamRun"]
_TERMINAL = frozenset({"run_completed", "run_cancelled", "run_failed"})


@dataclass(frozen=True, slots=True)
class Retry:
    """One retry, told to TurnOptions.on_retry before its wait."""

    op: Op
    """The call about to be sent."""
    after_seq: int
    """StreamRun's after_seq: the last seq yielded."""
    attempt: int
    """This call's number in the run of calls without progress (2 = the first retry)."""
    delay: float
    """Seconds to wait first."""
    error: RoundtableError | None
    """Why: the failed call's error; None when `ended` is set."""
    ended: events_pb2.RunEvent | None
    """The resumable terminal event (run_cancelled server_shutdown, a retryable run_failed)
    that the resent StartRun resumes."""


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """The knobs of run_turn; the defaults are clients/conformance.md's."""

    max_attempts: int = 5
    """Calls in a row that yield no new durable event, the first included (one that yields
    one resets the count); also the most resends after resumable ends per turn."""
    initial_backoff: float = 0.2
    """Seconds before the first retry since the last progress; doubles per failure."""
    max_backoff: float = 5.0
    resend_start_run: bool = True
    """Send the same StartRun again after a resumable end, DRAINING, RUN_ORPHANED, STREAM_GAP
    or a failure before the first event. False: StartRun is sent once and those are raised."""
    terminal_grace: float = 2.0
    """Seconds a stream may stay open after a terminal event before the turn treats it as ended."""
    on_retry: Callable[[Retry], None] | None = None
    on_skip: Callable[[events_pb2.RunEvent], None] | None = None
    """Told of every durable event delivered again and not yielded."""


class Client:
    """Calls one sidecar over a grpc.aio channel. Use `Client.connect(...)` or pass a channel."""

    def __init__(self, channel: grpc.aio.Channel, *, token: str | None = None) -> None:
        self.channel = channel
        self.stub = orchestrator_service_pb2_grpc.OrchestratorServiceStub(channel)
        """The generated stub, for calls this library does not wrap."""
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )

    @classmethod
    def connect(
        cls,
        target: str,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        token: str | None = None,
        allow_insecure_token: bool = False,
        options: Sequence[tuple[str, str | int]] = (),
    ) -> Client:
        """A client on a new channel: TLS when `tls` or `root_certificates` (PEM) is given, and
        `authorization: Bearer <token>` on every call. A token over plaintext is refused unless
        `allow_insecure_token` (loopback tests)."""
        if tls or root_certificates is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            channel = grpc.aio.secure_channel(target, credentials, options=list(options))
        else:
            if token and not allow_insecure_token:
                raise ValueError(f"refusing to send a token in cleartext to {target}: use TLS")
            channel = grpc.aio.insecure_channel(target, options=list(options))
        return cls(channel, token=token)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def cancel(
        self,
        run_id: str,
        tenant: str,
        mode: orchestrator_service_pb2.CancelMode = orchestrator_service_pb2.CANCEL_MODE_GRACEFUL,
        reason: str = "",
    ) -> orchestrator_service_pb2.CancelRunResponse:
        """Asks a run to stop (gracefully at the next speaker boundary, or immediately)."""
        request = orchestrator_service_pb2.CancelRunRequest(
            run_id=run_id, tenant=tenant, mode=mode, reason=reason
        )
        try:
            response: orchestrator_service_pb2.CancelRunResponse = await self.stub.CancelRun(
                request, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as error:
            raise error_of(error) from error
        return response

    async def get_run(self, run_id: str, tenant: str) -> orchestrator_service_pb2.Run:
        """A run's status, plan, finished replies and last seq."""
        request = orchestrator_service_pb2.GetRunRequest(run_id=run_id, tenant=tenant)
        try:
            response: orchestrator_service_pb2.GetRunResponse = await self.stub.GetRun(
                request, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as error:
            raise error_of(error) from error
        return response.run

    async def run_turn(
        self, request: orchestrator_service_pb2.StartRunRequest, options: TurnOptions | None = None
    ) -> AsyncIterator[events_pb2.RunEvent]:
        """Sends StartRun and yields the run's events: every durable event exactly once, in seq
        order, and the live deltas as they come, through dropped streams (re-attached with
        StreamRun(after_seq)), sidecar restarts and retryable failures (the same StartRun
        again), until the stream ends after the run's last terminal event.

        Raises RoundtableError (typed by the contract's reason), AttemptsExhausted when retries
        ran out, or the caller's own cancellation. Close it early with `contextlib.aclosing`.
        """
        o = options or TurnOptions()
        turn = _Turn(self, request, o)
        failures = resumes = 0
        while True:
            op: Op = "StartRun" if turn.last_seq == 0 or turn.need_start else "StreamRun"
            before = turn.last_seq
            async with contextlib.aclosing(turn.call(op)) as events:
                async for event in events:
                    yield event
            error = turn.error
            if turn.last_seq > before:
                failures = 0
            if error is None:  # the stream ended after a terminal event
                ended = turn.ended
                if ended is None or not _resumable(ended) or not o.resend_start_run:
                    return
                resumes += 1
                if resumes > o.max_attempts:
                    raise AttemptsExhausted(
                        None,
                        f"the run ended resumably ({_describe(ended)}) {resumes - 1} times",
                        attempts=resumes - 1,
                    )
                failures += 1
                retry = Retry(
                    "StartRun", turn.last_seq, failures + 1, _backoff(o, failures), None, ended
                )
            else:
                action = action_of(error)
                failures += 1
                error.attempts = failures
                if action is Action.STOP:
                    raise error
                next_op: Op = "StreamRun"
                if action is Action.RESEND or turn.last_seq == 0 or turn.need_start:
                    next_op = "StartRun"
                if next_op == "StartRun" and not o.resend_start_run:
                    raise error
                if failures >= o.max_attempts:
                    raise AttemptsExhausted(
                        error.code,
                        error.message,
                        reason=error.reason,
                        retry_delay=error.retry_delay,
                        violations=error.violations,
                        attempts=failures,
                    ) from error
                delay = (
                    error.retry_delay if error.retry_delay is not None else _backoff(o, failures)
                )
                retry = Retry(next_op, turn.last_seq, failures + 1, delay, error, None)
            turn.need_start = retry.op == "StartRun"
            if o.on_retry is not None:
                o.on_retry(retry)
            if retry.delay > 0:
                await asyncio.sleep(retry.delay)


class _Turn:
    """The state of one run_turn across its calls."""

    def __init__(
        self, client: Client, request: orchestrator_service_pb2.StartRunRequest, o: TurnOptions
    ) -> None:
        self.client, self.request, self.o = client, request, o
        self.last_seq = 0
        """The last durable event yielded."""
        self.ended: events_pb2.RunEvent | None = None
        """The last terminal event, while no run_started followed it."""
        self.need_start = False
        self.error: RoundtableError | None = None
        """Why the last call stopped; None when its stream ended after a terminal event."""

    async def call(self, op: Op) -> AsyncGenerator[events_pb2.RunEvent]:
        """One StartRun or StreamRun: yields its new events, sets `error`."""
        self.error = None
        stub, metadata = self.client.stub, self.client._metadata
        call: grpc.aio.UnaryStreamCall
        if op == "StartRun":
            call = stub.StartRun(self.request, metadata=metadata)
        else:
            context = self.request.context
            call = stub.StreamRun(
                orchestrator_service_pb2.StreamRunRequest(
                    run_id=context.run_id, tenant=context.tenant, after_seq=self.last_seq
                ),
                metadata=metadata,
            )
        at_end = False  # the last durable event this stream delivered is the latest, and terminal
        try:
            while True:
                try:
                    if at_end:
                        # A terminal event ends the turn unless a later execution follows it;
                        # the server ends the stream after the last: read on, bounded.
                        response = await asyncio.wait_for(call.read(), self.o.terminal_grace)
                    else:
                        response = await call.read()
                except TimeoutError:
                    return
                except grpc.aio.AioRpcError as error:
                    if not at_end:
                        self.error = error_of(error)
                    return
                if response is grpc.aio.EOF:
                    if not at_end:
                        self.error = RoundtableError(
                            grpc.StatusCode.UNKNOWN, "stream ended before a terminal event"
                        )
                    return
                event: events_pb2.RunEvent = response.event
                if op == "StartRun":
                    self.need_start = False
                if event.HasField("assistant_delta"):  # live only, no seq of its own
                    yield event
                    continue
                seq = event.seq
                if seq <= self.last_seq:
                    if self.o.on_skip is not None:
                        self.o.on_skip(event)
                    at_end = seq == self.last_seq and self.ended is not None
                    continue
                if seq != self.last_seq + 1:
                    self.error = RoundtableError(
                        grpc.StatusCode.UNKNOWN, f"gap in event seq: {seq} after {self.last_seq}"
                    )
                    return
                self.last_seq = seq
                kind = event.WhichOneof("payload")
                if kind == "run_started":
                    self.ended = None
                elif kind in _TERMINAL:
                    self.ended = event
                at_end = self.ended is not None
                yield event
        finally:
            call.cancel()


def _backoff(o: TurnOptions, failures: int) -> float:
    return float(min(o.initial_backoff * 2 ** (failures - 1), o.max_backoff))


def _resumable(event: events_pb2.RunEvent) -> bool:
    """Whether the same StartRun would go on with a run that ended so."""
    if event.HasField("run_cancelled"):
        return event.run_cancelled.reason == SHUTDOWN_REASON
    return event.HasField("run_failed") and event.run_failed.retryable


def _describe(event: events_pb2.RunEvent) -> str:
    if event.HasField("run_cancelled"):
        return f"run_cancelled {event.run_cancelled.reason}"
    if event.HasField("run_failed"):
        return f"run_failed {event.run_failed.code}"
    return str(event.WhichOneof("payload"))
