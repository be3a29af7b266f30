"""The one call that runs a turn, plus cancel, get_run and resolve_permission, over the generated
roundtable.v1 stub."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import grpc
from roundtable.v1 import events_pb2, orchestrator_service_pb2, orchestrator_service_pb2_grpc

from roundtable_client.errors import AttemptsExhausted, Reason, RoundtableError, error_of

CONTRACT_VERSION = "roundtable.v1"
"""The contract this library speaks: the proto package roundtable.v1."""

SHUTDOWN_REASON = "server_shutdown"
"""run_cancelled's reason when the sidecar stopped the run to shut down: the same StartRun
resumes it."""

Op = Literal["StartRun", "StreamRun"]
_TERMINAL = frozenset({"run_completed", "run_cancelled", "run_failed"})
_STARTS = frozenset({"run_started", "speaker_started"})
"""Durable events that are no progress: every execution writes them again."""


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
    """The failed call's error; None when its stream ended after `ended`."""
    ended: events_pb2.RunEvent | None
    """Set when the latest durable event is a resumable terminal one (run_cancelled
    server_shutdown, a retryable run_failed) that the StartRun resumes."""


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """The knobs of run_turn; the defaults are clients/conformance.md's."""

    max_attempts: int = 8
    """Calls (StartRun or StreamRun) in a row that bring no progress, the first included:
    progress is a new durable event other than run_started, speaker_started or a terminal
    one (an execution that fails the same way each time, after beginning a speaker, is
    no progress)."""
    initial_backoff: float = 0.2
    """Seconds to wait after a call the sidecar never answered (refused, cut before any
    message); doubles per such call in a row up to max_backoff, jittered into its upper half.
    No wait after a call that got an answer; a RetryInfo's delay replaces the backoff."""
    max_backoff: float = 5.0
    resend_start_run: bool = True
    """Send the same StartRun again to resume a run whose execution stopped before its end:
    run_cancelled server_shutdown, a retryable run_failed, DRAINING, RUN_ORPHANED. False:
    such a run ends the turn, with its terminal event or by raising the error."""
    terminal_grace: float = 2.0
    """Seconds a stream may stay open after a terminal event that is the latest before the
    turn treats it as ended."""
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

    async def resolve_permission(
        self,
        run_id: str,
        tenant: str,
        permission_request_id: str,
        decision: orchestrator_service_pb2.PermissionDecision,
        reason: str = "",
        edited_arguments_json: str = "",
    ) -> orchestrator_service_pb2.ResolvePermissionResponse:
        """Answers a permission_required event (its permission_request_id): APPROVE runs the tool
        call, with `edited_arguments_json` (a JSON object) instead of the model's arguments when
        given; DENY tells the member `reason` instead (optional). The run waits meanwhile with
        its stream open, and goes on once the decision is recorded: keep iterating run_turn.

        The same decision again answers the same. Never retried here. Raises RoundtableError;
        tell refusals apart by `reason`: Reason.PERMISSION_DECIDED (another decision, an expiry
        or a cancel was recorded first; the message names it), Reason.PERMISSION_NOT_FOUND,
        Reason.RUN_NOT_FOUND, Reason.INVALID_REQUEST.
        """
        request = orchestrator_service_pb2.ResolvePermissionRequest(
            run_id=run_id,
            tenant=tenant,
            permission_request_id=permission_request_id,
            decision=decision,
            reason=reason,
            edited_arguments_json=edited_arguments_json,
        )
        try:
            response: orchestrator_service_pb2.ResolvePermissionResponse = (
                await self.stub.ResolvePermission(request, metadata=self._metadata)
            )
        except grpc.aio.AioRpcError as error:
            raise error_of(error) from error
        return response

    async def run_turn(
        self, request: orchestrator_service_pb2.StartRunRequest, options: TurnOptions | None = None
    ) -> AsyncIterator[events_pb2.RunEvent]:
        """Sends StartRun and yields the run's events: every durable event exactly once, in seq
        order, and the live deltas as they come, through dropped streams (re-attached with
        StreamRun(after_seq)), sidecar restarts and retryable failures (the same StartRun
        again), until the stream ends after the run's last terminal event (or, with
        resend_start_run, a resumable one that max_attempts resends did not get past).

        Raises RoundtableError (typed by the contract's reason), AttemptsExhausted when retries
        ran out, or the caller's own cancellation. Close it early with `contextlib.aclosing`.
        """
        o = options or TurnOptions()
        turn = _Turn(self, request, o)
        failures = unanswered = 0
        op: Op = "StartRun"
        while True:
            async with contextlib.aclosing(turn.call(op)) as events:
                async for event in events:
                    yield event
            failures = 0 if turn.progressed else failures + 1
            unanswered = 0 if turn.received else unanswered + 1
            must_start = op == "StartRun" and not turn.received
            error = turn.error
            if error is not None:
                error.attempts = failures
            ended = turn.ended
            if ended is not None:
                # The run's latest execution ended; an error after it is the stream closing,
                # or the resent StartRun not getting through.
                if not _resumable(ended) or not o.resend_start_run:
                    return
                if error is not None and not error.retryable:
                    raise error  # the resume was refused (RUN_CONTINUED, say)
                if failures >= o.max_attempts:
                    return  # ends with the resumable event: the same StartRun goes on later
                op = "StartRun"
                delay = _backoff(o, max(unanswered, 1))
            else:
                if error is None:
                    error = RoundtableError(
                        grpc.StatusCode.UNAVAILABLE,
                        "the stream ended before a terminal event",
                        attempts=failures,
                        retryable=True,
                    )
                if not error.retryable:
                    raise error
                restart = error.reason in (Reason.DRAINING, Reason.RUN_ORPHANED)
                if restart and not o.resend_start_run:
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
                start = restart or must_start or turn.last_seq == 0
                op = "StartRun" if start else "StreamRun"
                delay = _backoff(o, unanswered)
            if error is not None and error.retry_delay is not None:
                delay = error.retry_delay
            retry = Retry(op, turn.last_seq, failures + 1, delay, error, ended)
            if o.on_retry is not None:
                o.on_retry(retry)
            if delay > 0:
                await asyncio.sleep(delay)


class _Turn:
    """The state of one run_turn across its calls."""

    def __init__(
        self, client: Client, request: orchestrator_service_pb2.StartRunRequest, o: TurnOptions
    ) -> None:
        self.client, self.request, self.o = client, request, o
        self.last_seq = 0
        """The last durable event yielded."""
        self.ended: events_pb2.RunEvent | None = None
        """The last durable event yielded, when it is a terminal one."""
        self.error: RoundtableError | None = None
        """Why the last call stopped; None when its stream ended OK."""
        self.progressed = False
        """The last call yielded a durable event other than a start or a terminal one."""
        self.received = False
        """The sidecar answered the last call: at least one message."""

    async def call(self, op: Op) -> AsyncGenerator[events_pb2.RunEvent]:
        """One StartRun or StreamRun: yields its new events; sets error, progressed, received."""
        self.error, self.progressed, self.received = None, False, False
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
        caught_up = False  # this stream reached the latest event, and it is terminal
        try:
            while True:
                try:
                    if caught_up:
                        # A terminal event ends the turn unless a later execution follows it;
                        # the server ends the stream after the last: read on, bounded.
                        response = await asyncio.wait_for(call.read(), self.o.terminal_grace)
                    else:
                        response = await call.read()
                except TimeoutError:
                    return
                except grpc.aio.AioRpcError as error:
                    self.error = error_of(error)
                    return
                if response is grpc.aio.EOF:
                    return
                self.received = True
                event: events_pb2.RunEvent = response.event
                if event.HasField("assistant_delta"):  # live only, no seq of its own
                    yield event
                    continue
                seq = event.seq
                if seq <= self.last_seq:  # handled: a StartRun streams the log from seq 1
                    if self.o.on_skip is not None:
                        self.o.on_skip(event)
                elif seq != self.last_seq + 1:
                    self.error = RoundtableError(
                        grpc.StatusCode.DATA_LOSS,
                        f"event seq {seq} after {self.last_seq}: re-attaching from {self.last_seq}",
                        retryable=True,
                    )
                    return
                else:
                    self.last_seq = seq
                    kind = event.WhichOneof("payload")
                    self.ended = event if kind in _TERMINAL else None
                    self.progressed |= self.ended is None and kind not in _STARTS
                    yield event
                caught_up = self.ended is not None and seq >= self.last_seq
        finally:
            call.cancel()


def _backoff(o: TurnOptions, unanswered: int) -> float:
    """The wait after `unanswered` calls in a row the sidecar never answered: initial_backoff
    doubled per call past the first, capped at max_backoff, jittered into its upper half (so
    gateways restarted together do not call together); none for 0."""
    if unanswered <= 0:
        return 0.0
    full: float = min(o.initial_backoff * float(2 ** min(unanswered - 1, 30)), o.max_backoff)
    return full / 2 + random.random() * full / 2


def _resumable(event: events_pb2.RunEvent) -> bool:
    """Whether the same StartRun would go on with a run that ended so."""
    if event.HasField("run_cancelled"):
        return event.run_cancelled.reason == SHUTDOWN_REASON
    return event.HasField("run_failed") and event.run_failed.retryable
