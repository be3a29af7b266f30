"""Validates requests at the edge and names every bad field, not just the first.

Field paths follow the proto field names (`snapshot.members[2].member_id`), the way
`google.rpc.BadRequest` expects them. Nothing is stored before validation passes.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence

from google.protobuf.message import DecodeError

from roundtable.api.limits import RequestLimits
from roundtable.api.validate_tools import validate_tool_budgets, validate_tools
from roundtable.domain.errors import FieldViolation
from roundtable.domain.events import SHUTDOWN_REASON
from roundtable.domain.snapshot import BaseUrlRule
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb

_ID = re.compile(r"[A-Za-z0-9._:\-]+")
_CONCURRENCY = frozenset(
    {
        spb.SPEAKER_CONCURRENCY_UNSPECIFIED,
        spb.SPEAKER_CONCURRENCY_SEQUENTIAL,
        spb.SPEAKER_CONCURRENCY_PARALLEL,
    }
)


def _too_big(text: str, limit: int) -> bool:
    # A character is at most 4 UTF-8 bytes: skip the encode for the common short string.
    return len(text) * 4 > limit and len(text.encode("utf-8")) > limit


def _header_safe(value: str) -> bool:
    """Whether `value` can go in an HTTP header as it is: visible ASCII, inner spaces."""
    return value.isascii() and value.isprintable() and value == value.strip()


def _visible(text: str) -> bool:
    """Whether `text` shows anything: more than white space and invisible format
    characters (a text of zero-width spaces alone is no message: outside testing)."""
    return any(not (ch.isspace() or unicodedata.category(ch) == "Cf") for ch in text)


class _Collector:
    """Accumulates violations with the path they were found at."""

    def __init__(
        self, limits: RequestLimits, base_url_rules: Mapping[str, BaseUrlRule] | None = None
    ) -> None:
        self.limits = limits
        # Each provider's rule for its base URLs; a provider without one takes any.
        self.base_url_rules = base_url_rules or {}
        self.violations: list[FieldViolation] = []

    def add(self, path: str, description: str) -> None:
        # One entry per field: a second problem with the same field joins the first.
        for i, seen in enumerate(self.violations):
            if seen.field == path:
                self.violations[i] = FieldViolation(path, f"{seen.description}; {description}")
                return
        self.violations.append(FieldViolation(path, description))

    def credential(self, path: str, ref: str, credentials: Mapping[str, str]) -> None:
        """A credential ref (none, or an entry whose value an HTTP header can carry)."""
        if not ref:
            return
        value = credentials.get(ref)
        if value is None:
            self.add(path, "names no entry of credentials")
        elif not value:
            # Outside testing: an empty key went out as the provider's placeholder, and the
            # run failed late with the server's 401.
            self.add(path, "names an empty credential")
        elif not _header_safe(value):
            # Never what it holds. Outside testing: a key with a newline failed at the
            # model server's door as if the server were down, which opened its breaker
            # for every tenant.
            self.add(
                path,
                "names a credential an HTTP header cannot carry (control or non-ASCII "
                "characters, or spaces around it)",
            )

    def identifier(self, path: str, value: str, *, required: bool = True) -> None:
        if not value:
            if required:
                self.add(path, "is required")
            return
        if len(value) > self.limits.max_id_chars:
            self.add(path, f"must be at most {self.limits.max_id_chars} characters")
        elif not _ID.fullmatch(value):
            self.add(path, "may contain only letters, digits and . _ : -")

    def text(self, path: str, value: str, limit: int, *, required: bool = False) -> None:
        if required and not value.strip():
            self.add(path, "is required")
        elif _too_big(value, limit):
            self.add(path, f"must be at most {limit} bytes")

    def count(self, path: str, size: int, limit: int) -> None:
        if size > limit:
            self.add(path, f"must have at most {limit} entries, got {size}")

    def bound(self, path: str, value: float, low: float, high: float) -> None:
        if not low <= value <= high:
            self.add(path, f"must be between {_number(low)} and {_number(high)}")


def _number(value: float) -> str:
    """A bound as people write it: 2592000, not 2.592e+06; 0.5 as 0.5."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def validate_run_ids(run_id: str, tenant: str, limits: RequestLimits) -> list[FieldViolation]:
    """Validates the (run_id, tenant) pair of StreamRun, CancelRun and GetRun."""
    c = _Collector(limits)
    c.identifier("run_id", run_id)
    c.identifier("tenant", tenant)
    return c.violations


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
"""Control characters (tab and newline allowed): a NUL cannot even be stored in Postgres."""
MAX_CANCEL_REASON_CHARS = 256


def validate_cancel(request: pb.CancelRunRequest, limits: RequestLimits) -> list[FieldViolation]:
    """Validates a CancelRunRequest the same way whichever store or replica serves it."""
    c = _Collector(limits)
    c.identifier("run_id", request.run_id)
    c.identifier("tenant", request.tenant)
    if request.mode not in pb.CancelMode.values():
        c.add("mode", f"unknown CancelMode value {request.mode}")
    if len(request.reason) > MAX_CANCEL_REASON_CHARS:
        c.add("reason", f"must be at most {MAX_CANCEL_REASON_CHARS} characters")
    if _CONTROL.search(request.reason):
        c.add("reason", "must not contain control characters")
    if request.reason == SHUTDOWN_REASON:
        # Review: it made a person's cancel a shutdown's (interrupted, its calls left waiting).
        c.add("reason", f"{SHUTDOWN_REASON!r} is the server's own stop, reserved")
    return c.violations


def validate_start_run(
    request: pb.StartRunRequest,
    *,
    limits: RequestLimits,
    providers: Collection[str],
    base_url_rules: Mapping[str, BaseUrlRule] | None = None,
    wire_size: int | None = None,
    history: Sequence[spb.HistoryMessage] | None = None,
) -> list[FieldViolation]:
    """Returns every violation of a StartRunRequest (empty when it is valid).

    `base_url_rules` says, per provider, which base URLs it can never use
    (`server.base_url_rules`); a provider without one takes any.

    `wire_size` is the request's size as received; without it the message is measured
    (which walks all of it: ≈0.45 ms for a 10,000-message history). `history` is the
    snapshot's history as received (`api.wire.ReceivedStartRun.history`); without it,
    `request.snapshot.history`.
    """
    c = _Collector(limits, base_url_rules)
    size = request.ByteSize() if wire_size is None else wire_size
    if size > limits.max_request_bytes:
        c.add("", f"request must be at most {limits.max_request_bytes} bytes, got {size}")
    if not request.HasField("context"):
        c.add("context", "is required")
    else:
        for name in ("run_id", "thread_id", "request_id", "tenant"):
            c.identifier(f"context.{name}", getattr(request.context, name))
    credentials = request.credentials
    for key, value in credentials.items():
        # Say which ref is too big, never what it holds.
        if _too_big(key, limits.max_credential_bytes) or _too_big(
            value, limits.max_credential_bytes
        ):
            c.add(f"credentials[{key[:64]}]", "key or value too large")
    if not request.HasField("snapshot"):
        c.add("snapshot", "is required")
    else:
        snapshot = request.snapshot
        _snapshot(
            c,
            snapshot,
            snapshot.history if history is None else history,
            credentials,
            providers,
        )
    if request.HasField("options"):
        _options(c, request.options)
    return c.violations


def _snapshot(
    c: _Collector,
    snapshot: spb.Snapshot,
    history: Sequence[spb.HistoryMessage],
    credentials: Mapping[str, str],
    providers: Collection[str],
) -> None:
    limits = c.limits
    members = snapshot.members
    member_ids: set[str] = set()
    if not members:
        c.add("snapshot.members", "must have at least one member")
    c.count("snapshot.members", len(members), limits.max_members)
    for i, member in enumerate(members):
        path = f"snapshot.members[{i}]"
        c.identifier(f"{path}.member_id", member.member_id)
        if member.member_id in member_ids:
            c.add(f"{path}.member_id", f"duplicates member id {member.member_id!r}")
        member_ids.add(member.member_id)
        _member(c, path, member, credentials, providers)

    if not snapshot.HasField("session"):
        c.add("snapshot.session", "is required")
    else:
        session = snapshot.session
        c.identifier("snapshot.session.session_id", session.session_id, required=False)
        if session.kind not in (spb.SESSION_KIND_SINGLE, spb.SESSION_KIND_GROUP):
            c.add("snapshot.session.kind", "must be SINGLE or GROUP")
        if not session.primary_member_id:
            c.add("snapshot.session.primary_member_id", "is required")
        elif session.primary_member_id not in member_ids:
            c.add("snapshot.session.primary_member_id", "must name one of snapshot.members")
        if session.HasField("default_model"):
            _model_ref(
                c, "snapshot.session.default_model", session.default_model, credentials, providers
            )
        if session.HasField("budgets"):
            _budgets(c, "snapshot.session.budgets", session.budgets)
        if session.speaker_concurrency not in _CONCURRENCY:
            c.add(
                "snapshot.session.speaker_concurrency",
                "must be SEQUENTIAL or PARALLEL (or unset)",
            )
        if session.tools or session.tool_servers or any(m.tool_names for m in members):
            validate_tools(c, session, members, credentials)

    c.count("snapshot.history", len(history), limits.max_history)
    # Only the window Roundtable reads is validated message by message; the rest is only
    # counted (and bounded by the request size), so a long history costs next to nothing.
    start = max(0, len(history) - limits.history_window)
    for i in range(start, len(history)):
        path = f"snapshot.history[{i}]"
        try:
            message = history[i]
        except DecodeError:
            c.add(path, "is not a valid HistoryMessage")
            continue
        if message.role not in (spb.MESSAGE_ROLE_USER, spb.MESSAGE_ROLE_ASSISTANT):
            c.add(f"{path}.role", "must be USER or ASSISTANT")
        c.text(f"{path}.content", message.content, limits.max_message_bytes)

    if not snapshot.HasField("user_turn"):
        c.add("snapshot.user_turn", "is required")
    else:
        turn = snapshot.user_turn
        if not (_visible(turn.text) or turn.mentions or turn.mention_all):
            c.add("snapshot.user_turn.text", "is required unless mentions or mention_all is set")
        c.text("snapshot.user_turn.text", turn.text, limits.max_message_bytes)
        c.count("snapshot.user_turn.mentions", len(turn.mentions), limits.max_mentions)
        for i, mention in enumerate(turn.mentions):
            if mention not in member_ids:
                c.add(f"snapshot.user_turn.mentions[{i}]", f"names no member: {mention[:64]!r}")


def _member(
    c: _Collector,
    path: str,
    member: spb.Member,
    credentials: Mapping[str, str],
    providers: Collection[str],
) -> None:
    limits = c.limits
    if not member.display_name.strip():
        c.add(f"{path}.display_name", "is required")
    elif len(member.display_name) > limits.max_name_chars:
        c.add(f"{path}.display_name", f"must be at most {limits.max_name_chars} characters")
    c.count(f"{path}.aliases", len(member.aliases), limits.max_aliases)
    for j, alias in enumerate(member.aliases):
        if not alias.strip() or len(alias) > limits.max_alias_chars:
            c.add(f"{path}.aliases[{j}]", f"must be 1 to {limits.max_alias_chars} characters")
    c.text(f"{path}.persona", member.persona, limits.max_persona_bytes)
    c.count(f"{path}.style_rules", len(member.style_rules), limits.max_style_rules)
    for j, rule in enumerate(member.style_rules):
        c.text(f"{path}.style_rules[{j}]", rule, limits.max_style_rule_bytes)
    c.count(f"{path}.skills", len(member.skills), limits.max_skills)
    for j, skill in enumerate(member.skills):
        c.identifier(f"{path}.skills[{j}].skill_id", skill.skill_id)
        c.text(f"{path}.skills[{j}].name", skill.name, limits.max_skill_name_bytes, required=True)
        c.text(f"{path}.skills[{j}].instructions", skill.instructions, limits.max_skill_bytes)
    c.count(f"{path}.memories", len(member.memories), limits.max_memories)
    for j, memory in enumerate(member.memories):
        c.identifier(f"{path}.memories[{j}].memory_id", memory.memory_id)
        c.text(f"{path}.memories[{j}].content", memory.content, limits.max_memory_bytes)
        c.bound(f"{path}.memories[{j}].importance", memory.importance, 0.0, 1.0)
    if member.HasField("model"):
        _model_ref(c, f"{path}.model", member.model, credentials, providers)


def _model_ref(
    c: _Collector,
    path: str,
    ref: spb.ModelRef,
    credentials: Mapping[str, str],
    providers: Collection[str],
) -> None:
    if not ref.HasField("target"):
        c.add(f"{path}.target", "is required")
    else:
        _target(c, f"{path}.target", ref.target, credentials, providers)
    c.count(f"{path}.fallbacks", len(ref.fallbacks), c.limits.max_fallbacks)
    for i, target in enumerate(ref.fallbacks):
        _target(c, f"{path}.fallbacks[{i}]", target, credentials, providers)
    if ref.HasField("temperature"):
        c.bound(f"{path}.temperature", ref.temperature, 0.0, 2.0)
    if ref.timeout_ms > c.limits.max_model_timeout_ms:
        c.add(f"{path}.timeout_ms", f"must be at most {c.limits.max_model_timeout_ms}")


def _target(
    c: _Collector,
    path: str,
    target: spb.ModelTarget,
    credentials: Mapping[str, str],
    providers: Collection[str],
) -> None:
    if not target.provider:
        c.add(f"{path}.provider", "is required")
    elif target.provider not in providers:
        known = ", ".join(sorted(providers))
        c.add(f"{path}.provider", f"unknown provider {target.provider[:64]!r} (known: {known})")
    if not target.model.strip():
        c.add(f"{path}.model", "is required")
    elif len(target.model) > 256:
        c.add(f"{path}.model", "must be at most 256 characters")
    if len(target.base_url) > 2048:
        c.add(f"{path}.base_url", "must be at most 2048 characters")
    elif target.base_url:  # empty: the provider's default
        rule = c.base_url_rules.get(target.provider)
        problem = rule(target.base_url) if rule is not None else ""
        if problem:
            c.add(f"{path}.base_url", problem)
    c.credential(f"{path}.credential_ref", target.credential_ref, credentials)


def _budgets(c: _Collector, path: str, budgets: spb.Budgets) -> None:
    limits = c.limits
    c.bound(f"{path}.max_speakers", budgets.max_speakers, 0, limits.max_speakers)
    c.bound(f"{path}.max_rounds", budgets.max_rounds, 0, limits.max_rounds)
    c.bound(f"{path}.max_output_tokens", budgets.max_output_tokens, 0, limits.max_output_tokens)
    c.bound(f"{path}.run_timeout_seconds", budgets.run_timeout_seconds, 0, limits.max_run_timeout_s)
    c.bound(
        f"{path}.max_parallel_speakers",
        budgets.max_parallel_speakers,
        0,
        limits.max_parallel_speakers,
    )
    validate_tool_budgets(c, path, budgets)


def _options(c: _Collector, options: pb.RunOptions) -> None:
    limits = c.limits
    if options.disconnect_policy not in pb.DisconnectPolicy.values():
        c.add("options.disconnect_policy", "is not a known DisconnectPolicy")
    if options.busy_thread_policy not in pb.BusyThreadPolicy.values():
        c.add("options.busy_thread_policy", "is not a known BusyThreadPolicy")
    c.bound("options.delta_window_ms", options.delta_window_ms, 0, limits.max_delta_window_ms)
    c.bound("options.delta_max_bytes", options.delta_max_bytes, 0, limits.max_delta_bytes)
    if options.HasField("budget_overrides"):
        _budgets(c, "options.budget_overrides", options.budget_overrides)
