"""Fixtures of the tool tests: a real MCP tool server process on a free port, and a pool."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from roundtable.tools.mcp_pool import McpPool
from support.mcp_server import McpServerProcess, StartMcpServer


@pytest.fixture
def start_mcp_server(tmp_path: Path) -> StartMcpServer:
    """Starts a test MCP server: `async with start_mcp_server(token=...) as server`."""

    @contextlib.asynccontextmanager
    async def start(*, token: str | None = None) -> AsyncIterator[McpServerProcess]:
        process = McpServerProcess(tmp_path / "mcp-server.log", token=token)
        await process.start()
        try:
            yield process
        finally:
            await process.stop()

    return start


@pytest.fixture
async def mcp_server(start_mcp_server: StartMcpServer) -> AsyncIterator[McpServerProcess]:
    """A test MCP server without a credential: `.url`, `.counts(tool)`, `.fault(status)`."""
    async with start_mcp_server() as server:
        yield server


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    """A pool, closed after the test."""
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()
