"""One open MCP session with a tool server, owned by a task of its own, and what its
failures mean in Roundtable's error family.

This is the only module that imports the `mcp` SDK (≈290 ms); `mcp_pool` loads it on
the first tool call, so a server whose runs use no tools never pays for it.

Why an owner task: `streamable_http_client` and `ClientSession` are anyio task groups
(cancel scopes), which must be exited by the task that entered them. A session opened by
whichever run first calls the tool, and closed at shutdown by another task, fails with
"Attempted to exit cancel scope in a different task". So a task of the connection's own
enters both, initializes the session and waits until it is told to close; callers in any
task only send requests on the session (each request is its own POST, answered on its
own stream, so concurrent calls do not mix).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from typing import cast

import httpx2
import mcp_types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from roundtable.domain.errors import (
    ToolError,
    ToolRateLimited,
    ToolRejected,
    ToolTimeout,
    ToolUnavailable,
)
from roundtable.domain.tools import IDEMPOTENCY_META_KEY, ToolCallRef, ToolResult, ToolServer

logger = logging.getLogger(__name__)

HTTP_STATUS_KEY = "roundtable.http_status"
"""Where `_KeepHttpStatus` puts an error answer's HTTP status, in the JSON-RPC error's data."""
_HTTP_ERROR = -32099
"""The JSON-RPC code of an error `_KeepHttpStatus` made up (the implementation-defined
server error range ends there)."""


class SessionExpired(ToolUnavailable):
    """The server no longer knows the session (HTTP 404 on it): it did not run the call,
    so the call may be sent again on a new session, whatever the tool."""


class ConnectionLost(ToolUnavailable):
    """The connection closed while the call was out: it may or may not have run, and the
    session is gone."""


class _KeepHttpStatus(httpx2.AsyncBaseTransport):
    """Turns an HTTP error answer to a POST into a JSON-RPC error that names its status.

    The SDK answers every HTTP error status but 404 with one INTERNAL_ERROR ("Server
    returned an error response"), so a 401 (our credential), a 403 and a 503 (the server's
    health) would look alike; the harness must tell them apart. The body is dropped unread:
    a server's error text may echo the arguments, and nothing here needs it.
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.status_code < 400 or request.method != "POST":
            return response  # the SSE GET and the closing DELETE are the SDK's business
        status = response.status_code
        await response.aclose()
        error = {
            "jsonrpc": "2.0",
            "id": None,  # the SDK puts the request's own id back
            "error": {
                "code": _HTTP_ERROR,
                "message": f"HTTP {status}",
                "data": {HTTP_STATUS_KEY: status},
            },
        }
        return httpx2.Response(
            status,
            headers={"content-type": "application/json"},
            content=json.dumps(error).encode(),
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def tool_error(exc: BaseException) -> ToolError:
    """What an exception from the SDK or its HTTP client means, in our own words only (a
    server's message may echo the arguments): never its text, at most its type or code."""
    if isinstance(exc, MCPError):
        data = exc.data
        status = data.get(HTTP_STATUS_KEY) if isinstance(data, dict) else None
        if isinstance(status, int):
            return _http_error(status)
        code = exc.code
        if code == mcp_types.CONNECTION_CLOSED:
            return ConnectionLost("connection closed")
        if code == mcp_types.REQUEST_TIMEOUT:
            return ToolTimeout("no answer within the tool's timeout")
        if code == mcp_types.INVALID_REQUEST and exc.message == "Session terminated":
            return SessionExpired("session terminated (HTTP 404)")
        if code in (mcp_types.INTERNAL_ERROR, mcp_types.PARSE_ERROR):
            return ToolUnavailable(f"JSON-RPC error {code}")
        if code in (
            mcp_types.METHOD_NOT_FOUND,
            mcp_types.INVALID_PARAMS,
            mcp_types.INVALID_REQUEST,
        ):
            return ToolRejected(f"JSON-RPC error {code}")
        return ToolError(f"JSON-RPC error {code}")
    if isinstance(exc, httpx2.LocalProtocolError):
        # Our own request could not be sent (a token a header cannot carry): not the
        # server's health, which the breaker shared by every tenant counts.
        return ToolRejected("the request could not be sent")
    if isinstance(exc, httpx2.TransportError):  # could not connect, reset, timed out
        return ToolUnavailable(f"HTTP {type(exc).__name__}")
    if isinstance(exc, BaseExceptionGroup):
        # The transport's task group failed (a POST could not connect): the first cause
        # says why better than the group.
        return tool_error(exc.exceptions[0])
    return ToolError(f"MCP client raised {type(exc).__name__}")


def _http_error(status: int) -> ToolError:
    """An HTTP error status: the server's health (5xx, 408, 429, 404 on the session) or
    our request's fault (any other 4xx: no or a wrong credential, a bad request)."""
    if status == 404:
        return SessionExpired("HTTP 404")
    if status == 429:
        return ToolRateLimited("HTTP 429")
    if status >= 500 or status == 408:
        return ToolUnavailable(f"HTTP {status}")
    return ToolRejected(f"HTTP {status}")


def _breaks_session(error: ToolError) -> bool:
    """Whether a failed call leaves the session unusable: the connection closed, or the
    server dropped the session. A timeout, a 5xx or a rejection leave it as it was."""
    return isinstance(error, ConnectionLost | SessionExpired)


def _meta(key: str) -> mcp_types.RequestParamsMeta:
    """The request's `_meta`: the idempotency key. RequestParamsMeta is an open TypedDict
    (PEP 728 `extra_items`), which mypy does not know yet: a key of our own needs a cast."""
    return cast(mcp_types.RequestParamsMeta, {IDEMPOTENCY_META_KEY: key})


def result_of(result: mcp_types.CallToolResult) -> ToolResult:
    """What the model sees of a tool's answer: its text blocks joined, or its structured
    content as JSON when it has no text; other blocks (images, resources) are not passed on."""
    texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
    if not texts and result.structured_content is not None:
        texts = [json.dumps(result.structured_content, ensure_ascii=False)]
    return ToolResult(text="\n".join(texts), is_error=bool(result.is_error))


class McpConnection:
    """One session with one tool server under one credential; opened at construction by
    its owner task, usable from any task once ready, closed by `aclose`.

    Neither the token nor a call's arguments or result is kept beyond the call, put in a
    repr, logged, or put in an exception.
    """

    def __init__(
        self,
        server: ToolServer,
        token: str | None,
        *,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.server_id = server.server_id
        self.last_used = time.monotonic()
        """When a call last used it (monotonic), for closing idle connections."""
        self.in_use = 0
        """Calls on it now (opening it included): the pool closes only unused ones."""
        self.broken = False
        """A call found the session unusable (or it never opened): the pool opens another."""
        self._session: ClientSession | None = None
        self._failure: ToolError | None = None
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        # An empty context: the owner task outlives the call that opened the connection,
        # and must not carry its span (or anything else of it) into every later request.
        self._task = asyncio.get_running_loop().create_task(
            self._own(server.url, token, connect_timeout_s),
            name=f"mcp:{server.server_id}",
            context=contextvars.Context(),
        )

    def __repr__(self) -> str:
        state = "broken" if self.broken else "ready" if self._session is not None else "opening"
        return f"McpConnection({self.server_id!r}, {state})"

    async def _own(self, url: str, token: str | None, connect_timeout_s: float) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with (
                httpx2.AsyncClient(
                    headers=headers,
                    # The SDK's own defaults: 30 s to connect or write, 300 s to read (an
                    # SSE stream may stay open); a call's own timeout bounds it sooner.
                    timeout=httpx2.Timeout(30.0, read=300.0),
                    transport=_KeepHttpStatus(httpx2.AsyncHTTPTransport()),
                ) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                async with asyncio.timeout(connect_timeout_s):
                    await session.initialize()
                self._session = session
                self._ready.set()
                # Until aclose; or until the transport's task group fails (a POST could
                # not connect), which cancels this wait and raises its error group here.
                await self._closing.wait()
        except TimeoutError:
            self._fail(ToolUnavailable(f"no session within {connect_timeout_s:g}s"))
        except Exception as exc:
            error = tool_error(exc)
            if isinstance(error, SessionExpired) and not self._ready.is_set():
                # A 404 before any session: the URL names no MCP endpoint. Sending the
                # call again (as after an expired session) would meet the same 404.
                error = ToolUnavailable(error.detail)
            self._fail(error)
        finally:
            self._session = None
            self.broken = True
            self._ready.set()

    def _fail(self, error: ToolError) -> None:
        self._failure = error
        if self._ready.is_set() and not self._closing.is_set():
            logger.warning("tool server %s: session lost (%s)", self.server_id, error.detail)

    async def session(self) -> ClientSession:
        """The open session, once initialized.

        Raises:
            ToolError: the session could not be opened (or is gone); each caller gets an
                error of its own.
        """
        await self._ready.wait()
        session = self._session
        if session is None or self.broken:
            failure = self._failure or ConnectionLost("connection closed")
            raise type(failure)(failure.detail)
        return session

    async def call(self, ref: ToolCallRef, *, timeout_s: float) -> ToolResult:
        """Sends one `tools/call` with the call's idempotency key in `_meta`.

        Raises:
            ToolError: the call failed before the tool could answer; a tool that ran and
                failed answers a `ToolResult` with `is_error` instead.
        """
        self.in_use += 1
        try:
            session = await self.session()
            self.last_used = time.monotonic()
            try:
                result = await session.call_tool(
                    ref.tool.name,
                    ref.arguments,
                    read_timeout_seconds=timeout_s,
                    meta=_meta(ref.key),
                )
            except Exception as exc:
                error = tool_error(exc)
                if _breaks_session(error):
                    self.broken = True
            else:
                return result_of(result)
        finally:
            self.in_use -= 1
            self.last_used = time.monotonic()
        raise error  # outside the handler: the SDK's exception (and its text) is not its context

    async def aclose(self, wait_s: float = 5.0) -> None:
        """Closes the session (the owner task exits both contexts); after `wait_s`, cancels
        the owner task instead."""
        self.broken = True
        self._closing.set()
        try:
            async with asyncio.timeout(wait_s):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
            # asyncio.wait: the owner task's cancellation is not raised here, while one
            # aimed at this caller still is (suppressing CancelledError swallowed both).
            await asyncio.wait({self._task})
            if not self._task.cancelled():
                self._task.exception()  # retrieved: no "exception was never retrieved"
