"""The process's open MCP sessions: one per tool server and credential, opened on first
use, reopened when broken, closed when idle (a sweep while any is open) or when the pool is
full (the least recently used), and at shutdown. A session holds its credential, so no
credential outlives its last call by more than `idle_s` and a sweep.

Importing this module is cheap: the `mcp` SDK (≈290 ms of imports on top of the rest of
the server) is loaded by the first call, in a worker thread so the event loop keeps
serving other runs meanwhile. The composition root can build a pool at start-up, and a
server whose runs use no tools never loads the SDK.

A session is never opened per call: that costs about ten calls on an open one
(docs/research/issue-20-tools-and-approval.md, section 3).
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

import xxhash

from roundtable.domain.tools import ToolCallRef, ToolResult, ToolServer

if TYPE_CHECKING:  # at run time, imported by the first call (see the module's docstring)
    from roundtable.tools.mcp_connection import McpConnection

_CONNECTION_MODULE = "roundtable.tools.mcp_connection"

PoolKey = tuple[str, str, str]
"""(server_id, url, hash of the credential): never the credential itself."""


def pool_key(server: ToolServer, token: str | None) -> PoolKey:
    """The connection a call goes on. Credentials arrive with each run, so two runs with
    different tokens for one server get a session each."""
    digest = xxhash.xxh3_64_hexdigest(token.encode()) if token else ""
    return (server.server_id, server.url, digest)


class McpPool:
    """Open MCP sessions by (server, url, credential); any task may call through it.

    `call` is what the tool harness's chain ends in (`ToolCaller`).
    """

    def __init__(
        self,
        *,
        idle_s: float = 600.0,
        max_connections: int = 256,
        connect_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_s = idle_s
        """A connection unused this long is closed by the next sweep (every `idle_s / 4`
        while any is open) or when another one opens; the server forgets an idle session
        after 30 minutes anyway."""
        self.max_connections = max_connections
        """Open connections at most: one more closes the least recently used of those no
        call uses (while every one is in use, the pool grows past it for the moment)."""
        self.connect_timeout_s = connect_timeout_s
        self._clock = clock
        self._connections: dict[PoolKey, McpConnection] = {}
        self._sweep: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._sdk_loaded = False
        self._sdk_loading: asyncio.Task[ModuleType] | None = None

    def __repr__(self) -> str:
        return f"McpPool({len(self._connections)} connections)"

    async def call(self, ref: ToolCallRef, *, token: str | None, timeout_s: float) -> ToolResult:
        """Calls `ref`'s tool on its server with `ref.key` as the idempotency key
        (`_meta[IDEMPOTENCY_META_KEY]`); the server deduplicates on it, this does not.

        A call the server answered with 404 on the session (it expired, or the server
        restarted) did not run, so it is sent once more on a new session, whatever the
        tool. A broken connection is dropped, and the next call opens a new one.

        Raises:
            ToolUnavailable: the server could not be reached, failed (5xx), or the
                connection closed during the call (it may have run).
            ToolRejected: the server refused the call (401/403/4xx, a JSON-RPC error).
            ToolTimeout: no answer within `timeout_s` (the harness's own timeout usually
                comes first).
            ToolError: anything else the client raised (named by type only).
        """
        await self._load_sdk()
        # Loaded by now: these imports are dictionary look-ups.
        from roundtable.tools.mcp_connection import SessionExpired

        try:
            return await self._connection(ref.server, token).call(ref, timeout_s=timeout_s)
        except SessionExpired:
            return await self._connection(ref.server, token).call(ref, timeout_s=timeout_s)

    def _connection(self, server: ToolServer, token: str | None) -> McpConnection:
        """The connection for this server and credential: the open one, or a new one in
        place of a broken one. No await between lookup and insert: one connection per key
        even when many calls arrive at once."""
        from roundtable.tools.mcp_connection import McpConnection

        key = pool_key(server, token)
        connection = self._connections.get(key)
        if connection is not None and not connection.broken:
            return connection
        if connection is not None:
            del self._connections[key]
            self._close_later(connection)
        self._close_idle()
        unused = [k for k, c in self._connections.items() if not c.in_use]
        if len(self._connections) >= self.max_connections and unused:
            oldest = min(unused, key=lambda k: self._connections[k].last_used)
            self._close_later(self._connections.pop(oldest))
        connection = McpConnection(server, token, connect_timeout_s=self.connect_timeout_s)
        self._connections[key] = connection
        if self._sweep is None or self._sweep.done():
            self._sweep = asyncio.get_running_loop().create_task(self._sweeping(), name="mcp:sweep")
        return connection

    def _close_idle(self) -> None:
        now = self._clock()
        for key, connection in list(self._connections.items()):
            if not connection.in_use and now - connection.last_used > self.idle_s:
                del self._connections[key]
                self._close_later(connection)

    async def _sweeping(self) -> None:
        """Closes idle connections while any is open; ends when none is left (the next
        connection starts it again)."""
        while self._connections:
            await asyncio.sleep(self.idle_s / 4)
            self._close_idle()

    def _close_later(self, connection: McpConnection) -> None:
        # Closing waits for the server's answer to DELETE: not on the caller's time.
        task = asyncio.get_running_loop().create_task(connection.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _load_sdk(self) -> None:
        if self._sdk_loaded:
            return
        if self._sdk_loading is None:
            # In a thread: the import holds the GIL most of the time, but lets the loop
            # run between bytecodes instead of stopping it for ≈290 ms.
            self._sdk_loading = asyncio.get_running_loop().create_task(
                asyncio.to_thread(importlib.import_module, _CONNECTION_MODULE)
            )
        # Shielded: a caller's timeout must not cancel the import other callers wait for.
        await asyncio.shield(self._sdk_loading)
        self._sdk_loaded = True

    async def aclose(self) -> None:
        """Closes every connection (each owner task exits its contexts) and waits."""
        connections, self._connections = list(self._connections.values()), {}
        if self._sweep is not None:
            self._sweep.cancel()
        for connection in connections:
            self._close_later(connection)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
