"""The immutable input of one run: who, what and how, as frozen dataclasses.

These mirror the contract's messages but never carry protobuf classes: the edge
(`roundtable.api.convert`) builds them once per request, and the graph reads them
through the runtime context without copying.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit, urlunsplit

from roundtable.domain.flags import flag
from roundtable.domain.tools import Tool, ToolServer


class SessionKind(StrEnum):
    """How a turn is routed."""

    SINGLE = "single"
    GROUP = "group"


class MessageRole(StrEnum):
    """Who wrote a history message."""

    USER = "user"
    ASSISTANT = "assistant"


class DisconnectPolicy(StrEnum):
    """What a run does when its StartRun stream drops."""

    CONTINUE = "continue"
    CANCEL = "cancel"


class SpeakerConcurrency(StrEnum):
    """Whether a round's independent speakers answer one after another or at once."""

    SEQUENTIAL = "sequential"
    PARALLEL = "parallel"


class BusyThreadPolicy(StrEnum):
    """What a StartRun does when its thread already has a live run."""

    REJECT = "reject"
    INTERRUPT = "interrupt"
    ENQUEUE = "enqueue"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """Ids and correlation fields of one run, chosen by the gateway."""

    run_id: str
    thread_id: str
    request_id: str
    tenant: str


def server_of(url: str) -> str:
    """`url` without user info, query or fragment: what may be logged or put on a metric.

    Never raises: a URL too malformed to split ("http://[::1") keeps what precedes any
    "?" and follows the last "@".
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("?", 1)[0].split("#", 1)[0].rpartition("@")[2]
    if not parts.netloc:
        return url.split("?", 1)[0].split("#", 1)[0]
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


BaseUrlRule = Callable[[str], str]
"""Why a provider can never use a (non-empty) base_url, in a phrase that follows the field's
name ("must be an http:// or https:// URL"); "" when it may. Each provider that reads
base_url has one (`base_url_problem`): the edge refuses what it says, before anything is
stored, instead of every speaker failing at run time."""


def http_url_problem(url: str) -> str:
    """Why `url` can never reach an HTTP server ("" when it may): not http or https, no
    host, a port that is no number up to 65535, a control character, or a space before,
    after or in its host.

    Only what is certainly wrong: a host that does not resolve, or a path that is not the
    server's, is for the call to find out (and say).
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or too big
    except ValueError:
        return "must be an http:// or https:// URL: its host or port does not parse"
    # urlsplit drops leading and trailing spaces, and a tab or newline anywhere: the HTTP
    # client does not, and takes them for part of the scheme or the host.
    spaced = url != url.strip() or any(ch.isspace() for ch in parts.netloc)
    if spaced or any(ch < " " or ch == "\x7f" for ch in url):
        return "must be an http:// or https:// URL without spaces or control characters"
    if parts.scheme.lower() not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelTarget:
    """One concrete model at one provider."""

    provider: str
    model: str
    base_url: str = ""
    credential_ref: str = ""

    @property
    def name(self) -> str:
        """The target's audit and span name, `llm:<provider>:<model>`."""
        return f"llm:{self.provider}:{self.model}"

    @property
    def breaker_key(self) -> str:
        """Whose health a circuit breaker tracks: the target's name, and its server when
        the target names one (two tenants' vLLM servers serving the same model are two
        targets: one being down must not refuse calls to the other)."""
        if not self.base_url:
            return self.name
        # The server only: a URL's user info or query may hold a key, and the key is
        # also reported on metrics.
        return f"{self.name}@{server_of(self.base_url)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRef:
    """A model with its failover chain and call parameters."""

    target: ModelTarget
    fallbacks: tuple[ModelTarget, ...] = ()
    temperature: float | None = None
    timeout_s: float | None = None
    """Per-attempt timeout in seconds; None means the server default."""


OFFLINE_MODEL = ModelRef(target=ModelTarget(provider="offline", model="roundtable-offline"))
"""The built-in model used when a snapshot names none."""


# What a request may ask of a turn's budgets (the proto's "at most" of each Budgets field);
# a server's defaults stay within them too.
MAX_SPEAKERS = 64
MAX_ROUNDS = 8
MAX_OUTPUT_TOKENS = 32_768
MAX_RUN_TIMEOUT_S = 3_600
MAX_PARALLEL_SPEAKERS = 16
MAX_TOOL_CALLS_PER_SPEAKER = 32
MAX_APPROVAL_TIMEOUT_S = 2_592_000
"""30 days."""
MAX_MEMORY_BYTES = 4 * 1024
"""A memory's content in UTF-8; what Roundtable proposes fits it, so a gateway can send a
kept proposal back in the next snapshot."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Budgets:
    """Limits on one turn (already merged with the server defaults).

    The defaults are the server's own (`--default-max-speakers` ...), for a session that
    sets no budget.
    """

    max_speakers: int = field(
        default=8,
        metadata=flag(
            "default-max-speakers",
            "Speakers per turn when the session sets no budget.",
            minimum=1,
            maximum=MAX_SPEAKERS,
        ),
    )
    max_rounds: int = field(
        default=2,
        metadata=flag(
            "default-max-rounds",
            "Supervisor rounds per turn when the session sets no budget.",
            minimum=1,
            maximum=MAX_ROUNDS,
        ),
    )
    max_output_tokens: int = field(
        default=512,
        metadata=flag(
            "default-max-output-tokens",
            "Output tokens per speaker when the session sets no budget.",
            minimum=1,
            maximum=MAX_OUTPUT_TOKENS,
        ),
    )
    run_timeout_s: float = field(
        default=600.0,
        metadata=flag(
            "default-run-timeout-seconds",
            "Wall-clock limit of a run when the session sets none.",
            minimum=1,
            maximum=MAX_RUN_TIMEOUT_S,
        ),
    )
    max_parallel_speakers: int = field(
        default=4,
        metadata=flag(
            "default-max-parallel-speakers",
            "Speakers answering at once in a PARALLEL session when the session sets no budget.",
            minimum=1,
            maximum=MAX_PARALLEL_SPEAKERS,
        ),
    )
    """Speakers answering at once in a PARALLEL session."""
    max_tool_calls_per_speaker: int = field(
        default=4,
        metadata=flag(
            "default-max-tool-calls-per-speaker",
            "Tool calls one speaker may make in a reply when the session sets no budget.",
            minimum=0,
            maximum=MAX_TOOL_CALLS_PER_SPEAKER,
        ),
    )
    approval_timeout_s: float = field(
        default=86_400.0,
        metadata=flag(
            "default-approval-timeout-seconds",
            "How long a permission request waits for a decision when the session sets none.",
            minimum=1,
            maximum=MAX_APPROVAL_TIMEOUT_S,
        ),
    )
    """Past it, a waiting tool call counts as denied with the reason `expired`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Skill:
    """A capability compiled into a member's prompt."""

    skill_id: str
    name: str
    instructions: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """One thing a member remembers (owned by the gateway)."""

    memory_id: str
    content: str
    importance: float = 0.0
    updated_at: float = 0.0
    """Seconds since the epoch; 0 when unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """An agent persona that can speak."""

    member_id: str
    display_name: str
    aliases: tuple[str, ...] = ()
    persona: str = ""
    style_rules: tuple[str, ...] = ()
    model: ModelRef | None = None
    skills: tuple[Skill, ...] = ()
    memories: tuple[Memory, ...] = ()
    tool_names: tuple[str, ...] = ()
    """The tools (`Tool.name`) this member may call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryMessage:
    """One earlier message of the conversation."""

    role: MessageRole
    content: str
    member_id: str = ""
    message_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class UserTurn:
    """The new user message the run answers."""

    text: str
    mentions: tuple[str, ...] = ()
    mention_all: bool = False
    message_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """The chat the turn belongs to."""

    kind: SessionKind
    primary_member_id: str
    default_model: ModelRef = OFFLINE_MODEL
    budgets: Budgets = field(default_factory=Budgets)
    session_id: str = ""
    speaker_concurrency: SpeakerConcurrency = SpeakerConcurrency.SEQUENTIAL
    tool_servers: tuple[ToolServer, ...] = ()
    tools: tuple[Tool, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Everything a run may know about the conversation.

    `history` holds only the most recent messages a prompt can use (the edge cuts it);
    `history_total` says how many the gateway sent.
    """

    session: Session
    members: tuple[Member, ...]
    history: tuple[HistoryMessage, ...]
    user_turn: UserTurn
    history_total: int = 0

    def member(self, member_id: str) -> Member:
        """Returns the member with this id; raises KeyError when there is none."""
        for member in self.members:
            if member.member_id == member_id:
                return member
        raise KeyError(member_id)

    def tools_of(self, member: Member) -> tuple[Tool, ...]:
        """The tools the member may call, in the member's order."""
        if not member.tool_names:
            return ()
        by_name = {tool.name: tool for tool in self.session.tools}
        return tuple(by_name[name] for name in member.tool_names if name in by_name)

    def tool_server(self, server_id: str) -> ToolServer:
        """The tool server with this id; raises KeyError when there is none."""
        for server in self.session.tool_servers:
            if server.server_id == server_id:
                return server
        raise KeyError(server_id)

    def model_for(self, member: Member) -> ModelRef:
        """The member's own model, else the session's default."""
        return member.model or self.session.default_model


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """How one run streams and behaves (defaults applied)."""

    stream_deltas: bool = True
    delta_window_s: float = 0.02
    delta_max_bytes: int = 1024
    disconnect_policy: DisconnectPolicy = DisconnectPolicy.CONTINUE
    busy_thread_policy: BusyThreadPolicy = BusyThreadPolicy.REJECT


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRequest:
    """A validated StartRun without its credentials.

    Credentials travel beside it, never inside: this object may be logged or kept.
    """

    context: RunContext
    snapshot: Snapshot
    options: RunOptions
    fingerprint: str
    """Hash of the snapshot as sent; the same run_id must always come with the same one."""
