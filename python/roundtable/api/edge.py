"""The gRPC edge every call passes first: who calls, how much it holds, whether its bytes parse.

grpc.aio reads and deserializes a unary request before the handler (and so any check in
it) runs: a server that checked the bearer token there held every token-less 16 MB
request in memory, twice (bytes, then the parsed message), before turning it away.
`EdgeInterceptor` re-registers each method as request-streaming, so nothing is read until
the behaviour asks for it, and asks only after:

1. the caller is identified from the metadata and the transport (`Authenticator.caller`);
   a call without accepted credentials is answered UNAUTHENTICATED with its message
   unread, so HTTP/2 flow control keeps what the transport buffers to a window;
2. the caller is within `max_calls_per_caller` calls in flight (RESOURCE_EXHAUSTED with a
   RetryInfo past it), so one gateway's token cannot hold the whole server.

Then it reads the one request message through the method's own deserializer, wrapped so
that bytes which do not parse (invalid UTF-8 in a string, a truncated message, an
overlong varint) are INVALID_ARGUMENT with a plain message on every RPC, health and
reflection included, instead of gRPC's UNKNOWN naming a Python class.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc._cython import cygrpc

from roundtable.api.auth import HEALTH_METHODS, Authenticator, Caller, acting_as
from roundtable.api.errors import to_grpc_status
from roundtable.domain.errors import (
    InternalError,
    RoundtableError,
    TooManyCalls,
    Unauthenticated,
    UndecodableRequest,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Undecodable:
    """What the wrapped deserializer returns for bytes that do not parse as the message."""

    reason: str


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    """The method's deserializer, returning `_Undecodable` instead of raising."""

    def decode(data: bytes) -> Any:
        if deserializer is None:
            return data
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, or IndexError from a truncated field
            return _Undecodable(type(exc).__name__)

    return decode


class CallLimiter:
    """Calls in flight per caller, bounded."""

    def __init__(self, max_per_caller: int) -> None:
        """`max_per_caller` calls of one caller at once (0: unbounded)."""
        self._max = max_per_caller
        self._held: dict[str, int] = {}

    def acquire(self, caller: Caller) -> None:
        """Counts one more call of `caller` in flight; `release` takes it back.

        Raises:
            TooManyCalls: the caller already has `max_per_caller` calls in flight.
        """
        held = self._held.get(caller.name, 0)
        if self._max and held >= self._max:
            raise TooManyCalls(f"{caller.name} has {held} calls in flight, the most allowed")
        self._held[caller.name] = held + 1

    def release(self, caller: Caller) -> None:
        """Ends one call of `caller` that `acquire` counted."""
        left = self._held[caller.name] - 1
        if left:
            self._held[caller.name] = left
        else:
            del self._held[caller.name]


_STATUS_NOT_SENT: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(cygrpc, "ExecuteBatchError", None),) if isinstance(t, type)
)
"""What grpc.aio raises when a status cannot go out any more: the call ended meanwhile
(its client left as the handler aborted it). Not public API, hence looked up."""


async def _abort(context: Any, error: RoundtableError) -> None:
    await context.abort_with_status(to_grpc_status(error))


async def _read_one(context: Any, method: str) -> Any:
    """The call's one request message, decoded; aborts with INVALID_ARGUMENT if it is not."""
    request = await context.read()
    if request is grpc.aio.EOF:
        try:
            await _abort(context, UndecodableRequest(method, "no request message was sent"))
        except grpc.aio.AbortError:
            raise
        except Exception:
            # The transport ended the call before its message arrived, and answered it
            # (a message larger than it takes: RESOURCE_EXHAUSTED), so no status can be
            # sent: a client's mistake, not a bug of ours. The call just ends here.
            log.info("%s: the transport ended the call before its request arrived", method)
            raise asyncio.CancelledError from None
    if isinstance(request, _Undecodable):
        await _abort(
            context, UndecodableRequest(method, "the request's bytes do not parse as its message")
        )
    return request


class EdgeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates and bounds each call before its request is read (see the module doc)."""

    def __init__(self, auth: Authenticator, limiter: CallLimiter) -> None:
        """Guards every method but grpc.health.v1.Health's with `auth` and `limiter`."""
        self._auth = auth
        self._limiter = limiter

    async def intercept_service(
        self, continuation: Any, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        """The method's handler, re-registered to read its request only once admitted."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        admit = None if method.startswith(HEALTH_METHODS) else self._admit
        return _edge_handler(handler, method, admit)

    @contextlib.asynccontextmanager
    async def _admit(self, context: Any, method: str) -> AsyncIterator[None]:
        """Holds the caller's place while the call runs, or aborts it unread."""
        try:
            caller = self._auth.caller(context)
            self._limiter.acquire(caller)
        except (Unauthenticated, TooManyCalls) as exc:
            log.info("rejected a call to %s: %s", method, exc)
            await _abort(context, exc)
            raise AssertionError("abort_with_status returns only by raising") from None
        try:
            with acting_as(caller):
                yield
        finally:
            self._limiter.release(caller)


_Admit = Callable[[Any, str], contextlib.AbstractAsyncContextManager[None]]


def _edge_handler(handler: Any, method: str, admit: _Admit | None) -> Any:
    """`handler` as a request-streaming handler: admit, then read, then the method itself."""
    deserializer = _tolerant(handler.request_deserializer)
    serializer = handler.response_serializer

    @contextlib.asynccontextmanager
    async def admitted(context: Any) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if admit is not None:
                await stack.enter_async_context(admit(context, method))
            try:
                yield
            except grpc.aio.AbortError:
                raise  # a status the handler chose
            except _STATUS_NOT_SENT:
                # The handler's status found the call over (its client left meanwhile):
                # nobody is there to answer, and aborting again only fails again.
                log.debug("%s ended before its status could be sent", method)
            except Exception:
                # A bug: logged whole here, and INTERNAL with a plain message on the wire
                # (gRPC would send UNKNOWN naming the exception's Python class).
                log.exception("unexpected error in %s", method)
                await _abort(context, InternalError(method))

    async def requests(context: Any) -> AsyncIterator[Any]:
        while (request := await context.read()) is not grpc.aio.EOF:
            if isinstance(request, _Undecodable):
                await _abort(
                    context,
                    UndecodableRequest(method, "a request's bytes do not parse as its message"),
                )
            yield request

    if handler.request_streaming and handler.response_streaming:
        inner: Any = handler.stream_stream

        async def stream_stream(_: Any, context: Any) -> AsyncIterator[Any]:
            async with admitted(context):
                async for response in inner(requests(context), context):
                    yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, deserializer, serializer)
    if handler.request_streaming:
        inner = handler.stream_unary

        async def stream_unary(_: Any, context: Any) -> Any:
            async with admitted(context):
                return await inner(requests(context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, deserializer, serializer)
    if handler.response_streaming:
        inner = handler.unary_stream

        async def unary_stream(_: Any, context: Any) -> AsyncIterator[Any]:
            async with admitted(context):
                request = await _read_one(context, method)
                async for response in inner(request, context):
                    yield response

        return grpc.stream_stream_rpc_method_handler(unary_stream, deserializer, serializer)
    inner = handler.unary_unary

    async def unary_unary(_: Any, context: Any) -> Any:
        async with admitted(context):
            return await inner(await _read_one(context, method), context)

    return grpc.stream_unary_rpc_method_handler(unary_unary, deserializer, serializer)
