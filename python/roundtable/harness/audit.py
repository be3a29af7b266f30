"""Audit records: one JSON line per model attempt, whitelisted fields only.

Never prompts, replies, personas, memories or keys: the record type has no field that
could hold them, so nothing can leak by accident.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, fields

from roundtable.domain.events import TokenUsage
from roundtable.harness.request import ModelRequest

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


_FIELDS = tuple(f.name for f in fields(AuditRecord))


class Auditor:
    """Writes audit records to the `roundtable.audit` logger as JSON lines."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger(AUDIT_LOGGER)

    def record(self, record: AuditRecord) -> None:
        """Writes one record (cheaply skipped when the logger is off)."""
        if self.logger.isEnabledFor(logging.INFO):
            # A flat dict by hand: dataclasses.asdict deep-copies and costs several times more.
            fields = {name: getattr(record, name) for name in _FIELDS}
            self.logger.info(json.dumps(fields, separators=(",", ":")))
