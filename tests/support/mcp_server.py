"""A real MCP tool server for tests: the `mcp` SDK's `MCPServer` over streamable HTTP
(JSON responses), run as a process of its own.

    python -m tests.support.mcp_server --port N [--token T]

Tools:

- `weather(city)`, read-only: `Sunny, 21°C in <city>`, always the same.
- `note(text)`, a write tool: counts its executions per idempotency key (the request's
  `_meta["dev.roundtable/idempotency-key"]`); it never deduplicates, so a test sees every
  time a key arrived.
- `fail()`: raises, which the SDK answers as a result with `isError` (not a JSON-RPC error).
- `slow(seconds)`: sleeps, then answers `slept <seconds>`.

Every tool call is counted per tool and key; `GET /counts` answers them as JSON,
`{"note": {"<key>": n}, ...}`. `POST /fault?status=503&times=2` makes the next two MCP
requests answer with that HTTP status and no body (a failing proxy or server).

With `--token`, an MCP request without `Authorization: Bearer <token>` gets 401 (before
the SDK sees it, as an authenticating proxy would answer); /counts and /fault are open.

The test process imports this module for `McpServerProcess` (the fixture is in
tests/tools/conftest.py); the server itself runs in the child.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import socket
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

REPO = Path(__file__).resolve().parents[2]
IDEMPOTENCY_META_KEY = "dev.roundtable/idempotency-key"
"""As roundtable.domain.tools.IDEMPOTENCY_META_KEY; spelled out so the child imports none
of Roundtable."""
_LISTENING = "mcp test server listening on port"


def build_app(token: str | None) -> Any:
    """The server's ASGI app: the MCP endpoint at /mcp, /counts, /fault, and the bearer
    check when `token` is set."""
    server = MCPServer("roundtable-test-tools")
    counts: collections.defaultdict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    faults: list[int] = []  # HTTP statuses the next MCP requests get, in order

    def count(tool: str, ctx: Context) -> int:
        meta = ctx.request_context.meta or {}
        key = str(meta.get(IDEMPOTENCY_META_KEY, ""))
        counts[tool][key] += 1
        return counts[tool][key]

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def weather(city: str, ctx: Context) -> str:
        """The weather in a city (read-only, safe to run again)."""
        count("weather", ctx)
        return f"Sunny, 21°C in {city}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=False))
    def note(text: str, ctx: Context) -> str:
        """Writes a note; counts its executions per idempotency key."""
        n = count("note", ctx)
        return f"noted {text!r} ({n})"

    @server.tool()
    def fail(ctx: Context) -> str:
        """Always raises: the caller gets a result with isError."""
        count("fail", ctx)
        raise RuntimeError("the fail tool failed, as asked")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def slow(seconds: float, ctx: Context) -> str:
        """Answers after `seconds`."""
        count("slow", ctx)
        await anyio.sleep(seconds)
        return f"slept {seconds:g}"

    @server.custom_route("/counts", methods=["GET"])
    async def read_counts(request: Request) -> Response:
        return JSONResponse({tool: dict(keys) for tool, keys in counts.items()})

    @server.custom_route("/fault", methods=["POST"])
    async def add_fault(request: Request) -> Response:
        status = int(request.query_params.get("status", "503"))
        faults.extend([status] * int(request.query_params.get("times", "1")))
        return JSONResponse({"queued": len(faults)})

    app = server.streamable_http_app(json_response=True)
    expected = f"Bearer {token}".encode() if token else None

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        # A plain ASGI wrapper: only the MCP endpoint is guarded and faulted.
        if scope["type"] == "http" and scope["path"].startswith("/mcp"):
            status = faults.pop(0) if faults else 0
            if not status and expected is not None:
                headers = dict(scope["headers"])
                status = 0 if headers.get(b"authorization") == expected else 401
            if status:
                await Response(status_code=status)(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


def main(argv: list[str] | None = None) -> None:
    """Serves on 127.0.0.1:--port until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="0: any free port")
    parser.add_argument("--token", default=None)
    args = parser.parse_args(argv)
    # Bound here, before saying where: a port already taken fails the process at once,
    # instead of a parent finding some other server there.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Inherited by the accepted connections. Without it a JSON answer (headers, then body,
    # two writes) waits for the client's delayed ACK: ≈44 ms a call instead of ≈1.5 ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", args.port))
    # Listening before saying so: a connection made the moment the parent reads the line
    # waits in the backlog until uvicorn has started, instead of being refused.
    sock.listen(128)
    config = uvicorn.Config(
        build_app(args.token),
        log_level="warning",
        # The MCP session manager's task group runs in the app's lifespan, which the
        # bearer-check wrapper passes through.
        lifespan="on",
    )
    server = uvicorn.Server(config)
    print(f"{_LISTENING} {sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


class McpServerProcess:
    """`python -m tests.support.mcp_server` on a port (0: a free one, kept from the first
    start on); stop it and start it again on the same port: a restarted tool server."""

    def __init__(self, log: Path, *, port: int = 0, token: str | None = None) -> None:
        self.port = port
        self.token = token
        self.log_path = log
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        """The MCP endpoint."""
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def base_url(self) -> str:
        """Where /counts and /fault live."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self, wait_s: float = 30.0) -> McpServerProcess:
        """Starts the process and waits until it listens (and says on which port)."""
        token = ["--token", self.token] if self.token else []
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.support.mcp_server",
                "--port",
                str(self.port),
                *token,
                stdout=log,
                stderr=log,
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        async with asyncio.timeout(wait_s):
            while True:
                said = re.search(
                    rf"{_LISTENING} (\d+)".encode(), self.log_path.read_bytes()[start:]
                )
                if said:
                    self.port = int(said.group(1))
                    return self
                if self.proc.returncode is not None:
                    raise RuntimeError(f"MCP test server exited:\n{self.log()}")
                await asyncio.sleep(0.05)

    async def stop(self, wait_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `wait_s`."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(wait_s):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    def counts(self, tool: str | None = None) -> Any:
        """Executions per tool and key (`counts()["note"]["r1/1"]`), or of one tool."""
        with urllib.request.urlopen(f"{self.base_url}/counts", timeout=5) as response:
            every: dict[str, dict[str, int]] = json.loads(response.read())
        return every if tool is None else every.get(tool, {})

    def fault(self, status: int, times: int = 1) -> None:
        """Makes the next `times` MCP requests answer HTTP `status`."""
        request = urllib.request.Request(
            f"{self.base_url}/fault?status={status}&times={times}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=5):
            pass

    def log(self) -> str:
        """What the server printed (every start's, one after the other)."""
        return self.log_path.read_text("utf-8", "replace") if self.log_path.exists() else ""


StartMcpServer = Callable[..., contextlib.AbstractAsyncContextManager[McpServerProcess]]
"""The `start_mcp_server` fixture: `async with start_mcp_server(token=...) as server`."""


if __name__ == "__main__":
    main()
