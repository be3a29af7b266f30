"""The test MCP server's tools as the gateway would declare them, and calls of them."""

from __future__ import annotations

from roundtable.domain.tools import Tool, ToolCallRef, ToolServer

from support.mcp_server import McpServerProcess

TOOLS = {
    "weather": Tool(
        name="weather",
        description="The weather in a city.",
        input_schema_json='{"type":"object","properties":{"city":{"type":"string"}}}',
        server_id="tools",
        read_only=True,
    ),
    "note": Tool(
        name="note",
        description="Writes a note.",
        input_schema_json='{"type":"object","properties":{"text":{"type":"string"}}}',
        server_id="tools",
    ),
    "fail": Tool(name="fail", description="Fails.", input_schema_json="{}", server_id="tools"),
    "slow": Tool(
        name="slow",
        description="Answers late.",
        input_schema_json='{"type":"object","properties":{"seconds":{"type":"number"}}}',
        server_id="tools",
        read_only=True,
    ),
}


def call_ref(
    server: McpServerProcess,
    tool: str | Tool,
    key: str,
    credential_ref: str = "",
    **arguments: object,
) -> ToolCallRef:
    """A call of one of `TOOLS` (or of `tool` itself) on `server` with idempotency key `key`."""
    return ToolCallRef(
        tool=TOOLS[tool] if isinstance(tool, str) else tool,
        server=ToolServer(server_id="tools", url=server.url, credential_ref=credential_ref),
        arguments=dict(arguments),
        key=key,
    )
