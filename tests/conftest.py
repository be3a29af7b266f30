"""Shared fixtures: a real Roundtable server on a real port, and a client stub for it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from roundtable.models.base import ChatProvider
from roundtable.server import RunningServer, running_server
from roundtable.settings import Settings
from roundtable.telemetry.setup import Telemetry, disabled
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from support.mcp_server import McpServerProcess, StartMcpServer
from support.stores import drop_schema, new_schema, postgres_dsn

ServerFactory = Callable[..., contextlib.AbstractAsyncContextManager[RunningServer]]


def make_settings(store_url: str, **overrides: Any) -> Settings:
    """Settings for a test server: port 0, a fresh database, fast retries."""
    base = Settings().with_values(
        listen="127.0.0.1:0",
        store=store_url,
        model_retry_backoff_seconds=0.01,
        grace_seconds=2.0,
    )
    return base.with_values(**overrides)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store for one test: every server test runs on SQLite and on Postgres."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'roundtable.db'}"
        return
    dsn = postgres_dsn()
    url = new_schema(dsn)
    try:
        yield url
    finally:
        drop_schema(dsn, url)


@pytest.fixture
def start_server(store_url: str) -> ServerFactory:
    """Starts a server: `async with start_server(providers=..., telemetry=..., **settings)`."""

    @contextlib.asynccontextmanager
    async def start(
        *,
        providers: Mapping[str, ChatProvider] | None = None,
        telemetry: Telemetry | None = None,
        **overrides: Any,
    ) -> AsyncIterator[RunningServer]:
        settings = make_settings(store_url, **overrides)
        # Tests export nothing unless they ask to: a developer's OTEL_* variables stay out.
        async with running_server(
            settings, extra_providers=providers, telemetry=telemetry or disabled()
        ) as s:
            yield s

    return start


@pytest.fixture
async def server(start_server: ServerFactory) -> AsyncIterator[RunningServer]:
    """A server with the built-in providers only."""
    async with start_server() as s:
        yield s


@pytest.fixture
async def stub(server: RunningServer) -> AsyncIterator[pb_grpc.OrchestratorServiceStub]:
    """A client of `server`, through the generated stub."""
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield pb_grpc.OrchestratorServiceStub(channel)


@pytest.fixture
def start_mcp_server(tmp_path: Path) -> StartMcpServer:
    """Starts a test MCP server (tests/support/mcp_server.py) on a free port:
    `async with start_mcp_server(token=...) as server`."""

    @contextlib.asynccontextmanager
    async def start(*, token: str | None = None) -> AsyncIterator[McpServerProcess]:
        process = McpServerProcess(tmp_path / "mcp.log", token=token)
        await process.start()
        try:
            yield process
        finally:
            await process.stop()

    return start


@pytest.fixture
async def mcp(start_mcp_server: StartMcpServer) -> AsyncIterator[McpServerProcess]:
    """The test MCP server without a credential, for one test: `.url`, `.counts(tool)`,
    `.fault(status)`."""
    async with start_mcp_server() as server:
        yield server
