"""Tools a member may call, and what a call came to: frozen types shared by every layer.

The snapshot declares tool servers and tools (the gateway is the source of truth, nothing
is listed from a server); the member pipeline asks the model, the harness calls the tool
over MCP, the store records each call so it runs at most once per idempotency key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

IDEMPOTENCY_META_KEY = "dev.roundtable/idempotency-key"
"""The key of the MCP request `_meta` entry that carries a call's idempotency key
(`idempotency_key`): a tool server that deduplicates on it runs a write once."""


def idempotency_key(tenant: str, run_id: str, call_key: str) -> str:
    """What a tool server sees of a call: `<tenant>/<run_id>/<reply_id>/<n>`.

    The same for every attempt of the call in its run, whichever replica sends it and
    however often the run resumes; unique among all calls, since run ids are unique
    within a tenant only, and a continue turn speaks an earlier run's step (its reply id)
    anew, with calls of its own. ("/" is in no id: validation.)"""
    return f"{tenant}/{run_id}/{call_key}"


class ApprovalPolicy(StrEnum):
    """Whether a person must approve a tool's calls before they run."""

    NEVER = "never"
    ALWAYS = "always"


class ToolOutcome(StrEnum):
    """How one tool call ended (what `assistant_final` lists)."""

    OK = "ok"
    DENIED = "denied"
    EXPIRED = "expired"
    FAILED = "failed"


def json_value(text: str) -> Any:
    """`text` read as JSON as RFC 8259 has it: NaN and Infinity, which Python's `json`
    takes, are not JSON (outside testing: a model's `{"n": NaN}` became a Struct holding
    NaN, which no gateway can print as JSON, and went to the tool server as it was).

    Raises:
        ValueError: `text` is not JSON.
    """
    return json.loads(text, parse_constant=_not_json, parse_float=_finite)


def json_object(text: str) -> dict[str, Any] | None:
    """`text` as a JSON object (`json_value`), or None when it is not one (tool arguments
    are one)."""
    try:
        value = json_value(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _finite(number: str) -> float:
    """A JSON number as a float; one too large for a float (1e999, which Python reads as
    infinity) is refused like Infinity itself (review)."""
    value = float(number)
    if value in (math.inf, -math.inf):
        raise ValueError("a number too large for a float")
    return value


def storable(text: str) -> str:
    """Text a model or a tool server wrote, as it is recorded and then shown to the model:
    NUL characters become U+FFFD. Postgres cannot store a NUL in text (the tool call's row
    failed to write, so the run failed the same way at every resume), and both stores,
    and every execution of a run, must see the same text."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolServer:
    """An MCP server reached over streamable HTTP."""

    server_id: str
    url: str
    credential_ref: str = ""
    """Names a bearer token in the run's credentials; empty: no Authorization header."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """A tool as the gateway declares it."""

    name: str
    description: str
    input_schema_json: str
    """The JSON Schema of the tool's arguments (an object schema), as sent."""
    server_id: str
    approval: ApprovalPolicy = ApprovalPolicy.NEVER
    read_only: bool = False
    """Safe to run more than once: a failed attempt is retried, and the call is not marked
    started before it is sent."""
    timeout_s: float | None = None
    """Per-attempt timeout; None: the server's default tool timeout."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """What a tool answered, as the model will see it."""

    text: str
    """The text content blocks of the result, joined."""
    is_error: bool = False
    """The tool ran and reported an error (MCP `isError`): the outcome is `failed`, and
    the model sees the text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRef:
    """One call as the harness sends it: which tool, where, with which key."""

    tool: Tool
    server: ToolServer
    arguments: dict[str, object] = field(hash=False, repr=False)
    """Gateway content (the model wrote them from the conversation): never in a repr."""
    key: str
    """The idempotency key (`idempotency_key`)."""


@dataclass(frozen=True, slots=True)
class ToolCallSummary:
    """A tool call a reply used, as `assistant_final` lists it: never arguments or results."""

    call_id: str
    tool_name: str
    outcome: ToolOutcome


class CallStatus(StrEnum):
    """Where a recorded tool call is: asked for, sent to its server, or answered."""

    REQUESTED = "requested"
    STARTED = "started"
    FINISHED = "finished"


class Verdict(StrEnum):
    """What stands for a person's decision on a call that needs one."""

    PENDING = ""
    APPROVE = "approve"
    DENY = "deny"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclass(slots=True, kw_only=True)
class ToolCallRecord:
    """One tool call of a reply as the store keeps it: what the model asked, what was
    decided, what the tool answered. Arguments and results are gateway content (like a
    reply): they live here and in events, never in logs or spans."""

    tenant: str
    run_id: str
    call_key: str
    """`<reply_id>/<n>`: the call within its run (the permission request id); its
    idempotency key adds the tenant and the run (`idempotency_key`)."""
    reply_id: str
    n: int
    """The call's number in its reply, from 1."""
    turn: int
    """The model turn (from 1) that asked for it: a replayed turn is not asked again."""
    tool: str
    model_call_id: str
    arguments_json: str
    needs_approval: bool = False
    status: CallStatus = CallStatus.REQUESTED
    verdict: Verdict = Verdict.PENDING
    reason: str = ""
    """Why it was denied (the person's words, or `expired` / `cancelled`)."""
    edited_arguments_json: str = ""
    expires_at: float = 0.0
    decided_at: float = 0.0
    result_text: str = ""
    outcome: str = ""
    """A `ToolOutcome` value once finished."""
    attempts: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    sent_key: str = ""
    """The idempotency key it was sent with, kept when it is marked started ("": never
    sent, or sent by a version that kept none)."""
    turn_input_tokens: int = 0
    turn_output_tokens: int = 0
    turn_counted: bool = False
    turn_model_calls: int = 0
    """What the model turn that asked for the call cost (tokens as `TokenUsage` has them,
    model calls with retries), kept on the turn's first call only, 0 on the others: a
    replayed turn is not asked again, and its cost still counts in the reply's."""

    @property
    def key_to_send(self) -> str:
        """The idempotency key to send it with: the one it went with before (a call sent but
        never answered goes again under the same key, so a deduplicating server runs it
        once), else `idempotency_key`'s. A call an earlier version sent without keeping its
        key went under its row key (`call_key`): it goes again under that one."""
        if self.sent_key:
            return self.sent_key
        if self.status is CallStatus.STARTED:
            return self.call_key
        return idempotency_key(self.tenant, self.run_id, self.call_key)

    @property
    def arguments_to_run(self) -> str:
        """The arguments the call runs with: a person's edit, else the model's."""
        return self.edited_arguments_json or self.arguments_json

    @property
    def waiting(self) -> bool:
        """Whether the call waits for a person's decision."""
        return self.needs_approval and self.verdict is Verdict.PENDING


class ToolCallStore(Protocol):
    """The tool calls of runs (`roundtable.store.tool_calls`). Every call commits."""

    async def record_tool_calls(self, records: Sequence[ToolCallRecord]) -> None:
        """Records the calls a model turn asked for (a call already recorded stays as it is)."""
        ...

    async def tool_calls(self, tenant: str, run_id: str) -> list[ToolCallRecord]:
        """The run's calls, by reply and number."""
        ...

    async def tool_call(self, tenant: str, run_id: str, call_key: str) -> ToolCallRecord | None:
        """One call, or None when the run has no such call."""
        ...

    async def decide_tool_call(
        self,
        tenant: str,
        run_id: str,
        call_key: str,
        verdict: Verdict,
        *,
        reason: str = "",
        edited_arguments_json: str = "",
    ) -> bool:
        """Records the decision on a call that waits for one; False when one is recorded
        already (or the call needs none): the first decision wins."""
        ...

    async def start_tool_call(
        self, tenant: str, run_id: str, call_key: str, *, sent_key: str
    ) -> None:
        """Marks the call sent under the idempotency key `sent_key` (one more attempt),
        before it is sent."""
        ...

    async def finish_tool_call(
        self, tenant: str, run_id: str, call_key: str, *, result_text: str, outcome: str
    ) -> None:
        """Records what the call came to, before the model sees it."""
        ...
