"""Who a run and a replica are: a run's fingerprint check, a replica's owner id, and the
trace context a run's first execution records (its resumes link to it)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable

from opentelemetry import trace

from roundtable.codec.fingerprint import is_current
from roundtable.domain.errors import RunAlreadyExists
from roundtable.domain.snapshot import RunRequest
from roundtable.store.base import RunRecord

LegacyFingerprint = Callable[[], str]
"""Computes a request's fingerprint as older versions did (only on a mismatch)."""


def default_owner() -> str:
    """A replica id unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def trace_context() -> str:
    """The current span as `<trace_id>-<span_id>`, or "" when nothing is traced."""
    span = trace.get_current_span().get_span_context()
    return f"{span.trace_id:032x}-{span.span_id:016x}" if span.is_valid else ""


def span_context(value: str) -> trace.SpanContext | None:
    """The span context `trace_context` stored (`RunRecord.trace_context`)."""
    if not value:
        return None
    trace_id, _, span_id = value.partition("-")
    return trace.SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=trace.TraceFlags(1)
    )


def check_fingerprint(
    record: RunRecord, request: RunRequest, legacy: LegacyFingerprint | None
) -> None:
    """Raises RunAlreadyExists unless the request's snapshot is the one the run was
    started with (as this version, or an older one, fingerprinted it)."""
    if record.fingerprint == request.fingerprint:
        return
    # A run recorded by an older version: compare with the fingerprint it computed (only
    # here, on a mismatch, so the common path never pays for a second hash).
    if legacy is not None and not is_current(record.fingerprint) and record.fingerprint == legacy():
        return
    raise RunAlreadyExists(f"run {record.run_id!r}")
