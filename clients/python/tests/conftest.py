"""Fixtures of the conformance tests: sidecars started per test and stopped after it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support import Sidecar, ToolServer


@pytest.fixture
async def sidecar(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Sidecar]]]:
    """Starts `roundtable serve` processes with the given flags, each on its own database."""
    started: list[Sidecar] = []

    async def start(*args: str) -> Sidecar:
        directory = tmp_path / f"rt{len(started)}"
        directory.mkdir()
        server = Sidecar(directory, *args)
        started.append(server)
        return await server.start()

    yield start
    for server in started:
        await server.stop()


@pytest.fixture
async def tool_server(tmp_path: Path) -> AsyncIterator[ToolServer]:
    """The repository's test MCP server, stopped after the test."""
    server = await ToolServer(tmp_path).start()
    yield server
    await server.stop()
