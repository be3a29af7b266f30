"""Validates the tools of a snapshot and a ResolvePermission request.

Kept beside `validation` (same collector, same paths): a snapshot with no tools pays
nothing here, and the JSON Schema validator is imported only when a tool is declared.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from roundtable.api.limits import RequestLimits
from roundtable.domain.errors import FieldViolation
from roundtable.domain.snapshot import http_url_problem
from roundtable.domain.tools import json_value
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb

if TYPE_CHECKING:
    from roundtable.api.validation import _Collector

_TOOL_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")
"""What OpenAI-compatible servers accept as a function name."""
_APPROVAL = frozenset(spb.ApprovalPolicy.values())
_DECISIONS = frozenset({pb.PERMISSION_DECISION_APPROVE, pb.PERMISSION_DECISION_DENY})
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def validate_tools(
    c: _Collector, session: spb.Session, members: Any, credentials: Mapping[str, str]
) -> None:
    """The session's tool servers and tools, and every member's tool names."""
    limits = c.limits
    servers: set[str] = set()
    c.count("snapshot.session.tool_servers", len(session.tool_servers), limits.max_tool_servers)
    for i, server in enumerate(session.tool_servers):
        path = f"snapshot.session.tool_servers[{i}]"
        c.identifier(f"{path}.server_id", server.server_id)
        if server.server_id in servers:
            c.add(f"{path}.server_id", f"duplicates server id {server.server_id!r}")
        servers.add(server.server_id)
        _url(c, f"{path}.url", server.url)
        c.credential(f"{path}.credential_ref", server.credential_ref, credentials)
    names: set[str] = set()
    c.count("snapshot.session.tools", len(session.tools), limits.max_tools)
    for i, tool in enumerate(session.tools):
        path = f"snapshot.session.tools[{i}]"
        if not _TOOL_NAME.fullmatch(tool.name):
            c.add(f"{path}.name", "must be 1 to 64 letters, digits, _ or -")
        elif tool.name in names:
            c.add(f"{path}.name", f"duplicates tool name {tool.name!r}")
        names.add(tool.name)
        c.text(f"{path}.description", tool.description, limits.max_tool_description_bytes)
        _schema(c, f"{path}.input_schema_json", tool.input_schema_json)
        if not tool.server_id:
            c.add(f"{path}.server_id", "is required")
        elif tool.server_id not in servers:
            c.add(f"{path}.server_id", "must name one of snapshot.session.tool_servers")
        if tool.approval not in _APPROVAL:
            c.add(f"{path}.approval", f"unknown ApprovalPolicy value {tool.approval}")
        if tool.timeout_ms > limits.max_tool_timeout_ms:
            c.add(f"{path}.timeout_ms", f"must be at most {limits.max_tool_timeout_ms}")
    for i, member in enumerate(members):
        path = f"snapshot.members[{i}].tool_names"
        c.count(path, len(member.tool_names), limits.max_member_tools)
        seen: set[str] = set()
        for j, name in enumerate(member.tool_names):
            if name not in names:
                c.add(f"{path}[{j}]", f"names no tool of snapshot.session.tools: {name[:64]!r}")
            elif name in seen:
                c.add(f"{path}[{j}]", f"names {name[:64]!r} a second time")
            seen.add(name)


def validate_tool_budgets(c: _Collector, path: str, budgets: spb.Budgets) -> None:
    """The two tool budgets of a Budgets message."""
    limits = c.limits
    c.bound(
        f"{path}.max_tool_calls_per_speaker",
        budgets.max_tool_calls_per_speaker,
        0,
        limits.max_tool_calls_per_speaker,
    )
    c.bound(
        f"{path}.approval_timeout_seconds",
        budgets.approval_timeout_seconds,
        0,
        limits.max_approval_timeout_s,
    )


def _url(c: _Collector, path: str, url: str) -> None:
    if not url:
        c.add(path, "is required")
    elif len(url) > c.limits.max_tool_url_chars:
        c.add(path, f"must be at most {c.limits.max_tool_url_chars} characters")
    else:
        # The model servers' check: the MCP client's HTTP library is theirs.
        problem = http_url_problem(url)
        if problem:
            c.add(path, problem)


def _schema(c: _Collector, path: str, text: str) -> None:
    if not text.strip():
        c.add(path, "is required")
        return
    if len(text.encode("utf-8")) > c.limits.max_tool_schema_bytes:
        c.add(path, f"must be at most {c.limits.max_tool_schema_bytes} bytes")
        return
    try:
        schema = json_value(text)
    except ValueError:
        c.add(path, "is not JSON")
        return
    if not isinstance(schema, dict) or schema.get("type") != "object":
        c.add(path, 'must be a JSON Schema object with "type": "object"')
        return
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        # The path inside the schema and the rule broken; never the whole schema back.
        where = "/".join(str(p) for p in exc.path) or "(root)"
        c.add(path, f"is not a valid JSON Schema at {where}: {exc.validator} {exc.message[:120]}")


def json_object_problem(text: str, limit: int) -> str:
    """Why `text` is not a JSON object of at most `limit` bytes ("" when it is one)."""
    if len(text.encode("utf-8")) > limit:
        return f"must be at most {limit} bytes"
    try:
        value = json_value(text)
    except ValueError:
        return "is not JSON"
    return "" if isinstance(value, dict) else "must be a JSON object"


def validate_resolve(
    request: pb.ResolvePermissionRequest, limits: RequestLimits
) -> list[FieldViolation]:
    """Every violation of a ResolvePermissionRequest."""
    from roundtable.api.validation import _Collector

    c = _Collector(limits)
    c.identifier("run_id", request.run_id)
    c.identifier("tenant", request.tenant)
    pid = request.permission_request_id
    if not pid:
        c.add("permission_request_id", "is required")
    elif len(pid) > limits.max_permission_id_chars or _CONTROL.search(pid):
        c.add(
            "permission_request_id",
            f"must be at most {limits.max_permission_id_chars} printable characters",
        )
    if request.decision not in _DECISIONS:
        c.add("decision", "must be APPROVE or DENY")
    if request.edited_arguments_json:
        if request.decision == pb.PERMISSION_DECISION_DENY:
            c.add("edited_arguments_json", "is allowed only with APPROVE")
        else:
            problem = json_object_problem(
                request.edited_arguments_json, limits.max_tool_arguments_bytes
            )
            if problem:
                c.add("edited_arguments_json", problem)
    if request.reason and request.decision == pb.PERMISSION_DECISION_APPROVE:
        # Outside testing: kept with the approval, so the same approval sent again without
        # it was refused as another decision (PERMISSION_DECIDED).
        c.add("reason", "is allowed only with DENY")
    elif len(request.reason) > limits.max_denial_reason_chars:
        c.add("reason", f"must be at most {limits.max_denial_reason_chars} characters")
    elif _CONTROL.search(request.reason):
        c.add("reason", "must not contain control characters")
    return c.violations
