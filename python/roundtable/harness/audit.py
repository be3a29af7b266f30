"""Audit records: one JSON line per model or tool attempt, whitelisted fields only.

Never prompts, replies, personas, memories, keys, tool arguments or tool results: the
record types have no field that could hold them, so nothing can leak by accident.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass, fields

from roundtable.domain.events import TokenUsage
from roundtable.harness.request import ModelRequest, ToolRequest
from roundtable.telemetry.logs import Deferred, direct_handler

AUDIT_LOGGER = "roundtable.audit"


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRecord:
    """What one model attempt did."""

    thread_id: str
    run_id: str
    request_id: str
    tenant: str
    caller_node: str
    target: str
    provider: str
    attempt: int
    status: str
    """success, error, timeout, breaker_open or cancelled (the run stopped mid-attempt)."""
    latency_ms: float
    input_tokens: int = 0
    output_tokens: int = 0
    usage_source: str = ""
    """How the tokens are known, on a success: `reported` by the server, or `counted` by
    Roundtable from the streamed chunks (one chunk as one token) when it reported none."""
    error_code: str = ""
    error: str = ""
    """Why the attempt failed, in Roundtable's own words ("HTTP 503 Service Unavailable",
    "connection refused (ECONNREFUSED)"): never the provider's message or body."""

    @classmethod
    def of(
        cls,
        request: ModelRequest,
        status: str,
        started: float,
        *,
        usage: TokenUsage | None = None,
        error_code: str = "",
        error: str = "",
    ) -> AuditRecord:
        """Builds the record of an attempt that started at `started` (perf_counter)."""
        target = request.resolved_target
        meta = request.meta
        source = usage.source if usage is not None else ""
        usage = usage or TokenUsage()
        return cls(
            thread_id=meta.thread_id,
            run_id=meta.run_id,
            request_id=meta.request_id,
            tenant=meta.tenant,
            caller_node=meta.caller_node,
            target=target.name,
            provider=target.provider,
            attempt=request.attempt,
            status=status,
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            usage_source=source,
            error_code=error_code,
            error=error,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolAuditRecord:
    """What one tool attempt did: which tool on which server, how it ended, how long.

    No field holds free text: neither the arguments, nor the result, nor an error's
    message (a tool server's words may echo the arguments); `error_code` says why.
    """

    operation: str = "execute_tool"
    """Tells a tool attempt's line from a model attempt's (the GenAI operation name)."""
    thread_id: str
    run_id: str
    request_id: str
    tenant: str
    caller_node: str
    tool: str
    server_id: str
    call_key: str
    """The call's idempotency key as the tool server got it (`ToolCallRecord.key_to_send`,
    the span's gen_ai.tool.call.id): one key to find the call in both servers' logs."""
    attempt: int
    status: str
    """success, error, timeout, breaker_open or cancelled (the run stopped mid-attempt)."""
    latency_ms: float
    is_error: bool = False
    """On a success: the tool ran and reported an error (MCP `isError`)."""
    error_code: str = ""

    @classmethod
    def of(
        cls,
        request: ToolRequest,
        status: str,
        started: float,
        *,
        is_error: bool = False,
        error_code: str = "",
    ) -> ToolAuditRecord:
        """Builds the record of an attempt that started at `started` (perf_counter)."""
        meta = request.meta
        ref = request.ref
        return cls(
            thread_id=meta.thread_id,
            run_id=meta.run_id,
            request_id=meta.request_id,
            tenant=meta.tenant,
            caller_node=meta.caller_node,
            tool=ref.tool.name,
            server_id=ref.server.server_id,
            call_key=ref.key,
            attempt=request.attempt,
            status=status,
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            is_error=is_error,
            error_code=error_code,
        )


_FIELDS: dict[type, tuple[str, ...]] = {
    kind: tuple(f.name for f in fields(kind)) for kind in (AuditRecord, ToolAuditRecord)
}


def _json_line(record: AuditRecord | ToolAuditRecord) -> str:
    """The record as one JSON object (the audit line's message)."""
    # A flat dict by hand: dataclasses.asdict deep-copies and costs several times more.
    values = {name: getattr(record, name) for name in _FIELDS[type(record)]}
    return json.dumps(values, separators=(",", ":"))


class Auditor:
    """Writes audit records to the `roundtable.audit` logger as JSON lines."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger(AUDIT_LOGGER)

    def record(self, record: AuditRecord | ToolAuditRecord) -> None:
        """Writes one record (cheaply skipped when the logger is off).

        Where the serve process's batch writer is the only consumer of the logger, the
        record itself is handed to it and the JSON is made on its thread: in a served
        count-off the four lines cost the event loop ≈0.4 ms a turn logged in place
        (≈50 µs a line amid the turn's other work, and what it evicts from the caches),
        next to nothing handed over. Anywhere else (a test's caplog, a user's handler) the
        line is logged here, the same text.
        """
        if not self.logger.isEnabledFor(logging.INFO):
            return
        handler = direct_handler(self.logger, logging.INFO)
        if handler is not None:
            line = functools.partial(_json_line, record)
            handler.defer(Deferred(self.logger.name, logging.INFO, time.time(), line))
        else:
            self.logger.info(_json_line(record))
