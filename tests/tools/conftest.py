"""Fixtures of the tool tests: a pool (the MCP server fixtures, `mcp` and
`start_mcp_server`, are the root conftest's)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from roundtable.tools.mcp_pool import McpPool


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    """A pool, closed after the test."""
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()
