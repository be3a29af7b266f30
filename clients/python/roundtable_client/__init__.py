"""Roundtable's client library: one call that runs a turn and yields its events exactly once,
in seq order, through dropped streams, sidecar restarts and retryable failures; cancel, get_run
and resolve_permission; errors typed by the contract's reasons. The policy is
clients/conformance.md's, shared with the Go and TypeScript libraries. The generated code is
`roundtable.v1`."""

from roundtable_client.client import (
    CONTRACT_VERSION,
    SHUTDOWN_REASON,
    Client,
    Retry,
    TurnOptions,
)
from roundtable_client.errors import (
    ERROR_DOMAIN,
    AttemptsExhausted,
    FieldViolation,
    Reason,
    RoundtableError,
    error_of,
)

__all__ = [
    "CONTRACT_VERSION",
    "ERROR_DOMAIN",
    "SHUTDOWN_REASON",
    "AttemptsExhausted",
    "Client",
    "FieldViolation",
    "Reason",
    "Retry",
    "RoundtableError",
    "TurnOptions",
    "error_of",
]
