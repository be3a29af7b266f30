"""Audit lines come out the same whether the batch writer renders them or logging does."""

from __future__ import annotations

import io
import json
import logging

from roundtable.harness.audit import Auditor, AuditRecord, ToolAuditRecord
from roundtable.telemetry.logs import BatchWriter, Deferred

CORRELATION = {
    "thread_id": "t-1",
    "run_id": "r-1",
    "request_id": "q-1",
    "tenant": "acme",
    "caller_node": "dispatch",
}
"""What every audit line of a call carries, model or tool."""

RECORDS = [
    AuditRecord(
        **CORRELATION,
        target="llm:offline:m",
        provider="offline",
        attempt=1,
        status="success",
        latency_ms=0.25,
        input_tokens=10,
        output_tokens=2,
        usage_source="reported",
    ),
    ToolAuditRecord(
        **CORRELATION,
        tool="weather",
        server_id="s1",
        call_key="reply/0",
        attempt=1,
        status="error",
        latency_ms=3.5,
        error_code="TIMEOUT",
    ),
]


def _audit(name: str, *, extra: logging.Handler | None = None) -> tuple[list[str], int]:
    """Audits RECORDS on logger `name`, whose consumer is a BatchWriter (and `extra`): the
    lines written, and how many records were handed to the writer unrendered."""
    stream = io.StringIO()
    writer = BatchWriter(stream, logging.Formatter("%(levelname)s %(name)s %(message)s"))
    writer.start()
    handler = writer.handler()
    handed = 0
    defer = handler.defer

    def counted(item: Deferred) -> None:
        nonlocal handed
        handed += 1
        defer(item)

    handler.defer = counted  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.handlers[:] = [handler, *([extra] if extra else [])]
    logger.setLevel(logging.INFO)
    auditor = Auditor(logger)
    for record in RECORDS:
        auditor.record(record)
    writer.stop()
    return stream.getvalue().splitlines(), handed


def test_the_writer_renders_the_line_logging_would_and_another_handler_sees_it_too() -> None:
    alone, handed = _audit("rt.test.audit.alone")
    assert handed == len(RECORDS), "handed to the writer: JSON made on its thread"
    seen = io.StringIO()
    shared, handed = _audit("rt.test.audit.shared", extra=logging.StreamHandler(seen))
    assert handed == 0, "another handler listens: logged as usual"
    strip = [line.split(" ", 2)[2] for line in alone]
    assert strip == [line.split(" ", 2)[2] for line in shared]
    assert [json.loads(text) for text in strip] == [
        {name: getattr(r, name) for name in r.__dataclass_fields__} for r in RECORDS
    ]
    assert seen.getvalue().splitlines() == strip, "the other handler got every record"
    assert alone[0].startswith("INFO rt.test.audit.alone {")
