"""Builds the tool harness: the one way any tool is called."""

from __future__ import annotations

from typing import Protocol

from opentelemetry import trace

from roundtable.domain.errors import ToolError
from roundtable.domain.tools import ToolCallRef, ToolResult
from roundtable.harness.audit import Auditor
from roundtable.harness.breaker import BreakerBoard
from roundtable.harness.policies import ToolPolicy, ToolTimeoutPolicy
from roundtable.harness.request import ToolHandler, ToolRequest
from roundtable.harness.tool_layers import (
    ToolAuditLayer,
    ToolBreakerLayer,
    ToolRetryLayer,
    ToolTelemetryLayer,
    ToolTimeoutLayer,
)


class ToolCaller(Protocol):
    """What sends one call to its tool server: `roundtable.tools.mcp_pool.McpPool`."""

    async def call(
        self, ref: ToolCallRef, *, token: str | None, timeout_s: float
    ) -> ToolResult: ...


class ServerCall:
    """The end of the chain: hands one attempt to the tool caller."""

    def __init__(self, caller: ToolCaller, timeout: ToolTimeoutPolicy) -> None:
        self.caller = caller
        self.timeout = timeout

    async def __call__(self, request: ToolRequest) -> ToolResult:
        # The caller gets the attempt's bound too, so the server is told to stop waiting
        # (the timeout layer's own bound fires first or at the same moment).
        timeout_s = self.timeout.seconds_for(request.ref.tool.timeout_s)
        try:
            return await self.caller.call(request.ref, token=request.token, timeout_s=timeout_s)
        except ToolError:
            raise
        except Exception as exc:
            # A caller bug fails this call, not the run; the type says enough, and its
            # message could echo the arguments.
            failure = ToolError(f"tool caller raised {type(exc).__name__}")
        raise failure  # outside the handler: the caller's exception is not its context


class ToolHarness:
    """Every tool call goes through here: breaker, retry (read-only tools), audit, span,
    timeout."""

    def __init__(
        self,
        caller: ToolCaller,
        *,
        policy: ToolPolicy | None = None,
        auditor: Auditor | None = None,
        breakers: BreakerBoard | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        """`breakers` may be the model harness's board (tool servers' keys are `mcp:<url>`,
        so they never meet a model target's), to share its state listener."""
        self.policy = policy or ToolPolicy()
        self.caller = caller
        self.auditor = auditor or Auditor()
        self.breakers = breakers or BreakerBoard(self.policy.breaker)
        handler: ToolHandler = ServerCall(caller, self.policy.timeout)
        handler = ToolTimeoutLayer(handler, self.policy.timeout)
        handler = ToolTelemetryLayer(handler, tracer)
        handler = ToolAuditLayer(handler, self.auditor)
        handler = ToolRetryLayer(handler, self.policy.retry)
        self._chain: ToolHandler = ToolBreakerLayer(handler, self.breakers, self.auditor)

    async def call(self, request: ToolRequest) -> ToolResult:
        """Runs one tool call through the whole chain.

        Returns the tool's answer; one with `is_error` is the tool's own failure (the
        outcome `failed`), which the model sees.

        Raises:
            ToolCircuitOpen: the server's breaker is open; nothing was sent.
            ToolTimeout, ToolUnavailable: the last attempt's error, after the retries a
                read-only tool gets.
            ToolRejected: the server refused the call.
            ToolError: anything else that failed the call.
        """
        return await self._chain(request)
