"""Calling tools on MCP servers: a pool of open sessions (`mcp_pool`); the `mcp` SDK is
loaded on the first call (`mcp_connection`), never by importing this package."""
