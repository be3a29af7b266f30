"""Server settings: defaults that run with nothing set, then ROUNDTABLE_* variables, then flags."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from roundtable.domain.snapshot import Budgets, server_of

_BUDGETS = Budgets()
"""The domain's budget defaults: the settings' defaults are these, written once."""

ENV_PREFIX = "ROUNDTABLE_"


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything `roundtable serve` can be told. Each field is also `--flag` and `ROUNDTABLE_FLAG`."""

    listen: str = "127.0.0.1:50051"
    """host:port to listen on."""
    tls_cert_file: str = ""
    """PEM certificate chain the server presents; with tls_key_file, the server speaks TLS only."""
    tls_key_file: str = ""
    """PEM private key of tls_cert_file."""
    tls_client_ca_file: str = ""
    """PEM CA certificate(s): when set, every client must present a certificate one of them
    signed (mutual TLS). Needs tls_cert_file and tls_key_file."""
    auth_tokens: str = dataclasses.field(default="", repr=False)
    """Bearer tokens and the tenants each may act for ("*": any):
    `token1=tenant-a|tenant-b;token2=*`. Callers send `authorization: Bearer <token>`."""
    auth_tokens_file: str = ""
    """JSON file of bearer tokens: {"<token>": ["tenant-a", "tenant-b"], "<token2>": ["*"]}."""
    auth_certificate_tenants: str = ""
    """Under mutual TLS, client certificate common name -> tenants it may act for:
    `gateway-1=tenant-a|tenant-b;gateway-2=*`."""
    allow_unauthenticated: bool = False
    """Listen on a non-loopback address with no caller auth (no tokens, no mutual TLS)."""
    store: str = field(
        default="sqlite:///var/roundtable.db",
        repr=False,
        metadata={
            "help": "sqlite:///relative/file.db (from the working directory), "
            "sqlite:////absolute/file.db (four slashes), or postgresql://user@host:port/db"
        },
    )
    """Where runs, events and checkpoints live: sqlite:///relative/file.db (relative to the
    working directory), sqlite:////absolute/file.db (four slashes: the URL's path after its
    empty host is `/absolute/...`), or postgresql://user@host:port/db for several replicas."""
    checkpoint_durability: str = "exit"
    """LangGraph checkpoint durability: exit (one checkpoint when a run stops before its end;
    a run completing writes none), or async / sync (also one after each plan and each round of
    speakers). The event log, not the checkpoint, says which speakers are finished, so resume
    is exact with any of them; `exit` costs the least (a completed turn reads and writes no
    checkpoint at all, see bench/)."""
    replica_id: str = ""
    """This replica's id in run leases (default: host-pid-random)."""
    lease_seconds: float = 10.0
    """How long a replica's claim on a live run lasts without renewal (renewed every third)."""
    grace_seconds: float = 10.0
    """On SIGTERM/SIGINT: seconds live runs get to reach a speaker boundary."""
    log_level: str = "INFO"
    """Level of the application and audit logs."""
    offline_token_delay_ms: float = 0.0
    """Pause between the offline model's streamed tokens (0: as fast as possible)."""
    model_timeout_seconds: float = 60.0
    """Per-attempt model timeout when a model ref sets none."""
    model_max_retries: int = 2
    """Retries of transient model errors on one target."""
    model_retry_backoff_seconds: float = 0.2
    """First retry backoff; doubles per retry, with jitter."""
    breaker_failure_threshold: int = 5
    """Consecutive system failures that open a target's circuit breaker."""
    breaker_cooldown_seconds: float = 30.0
    """Seconds before an open breaker lets one probe through."""
    max_runs: int = 2_000
    """Runs executing at once in this process; more get RESOURCE_EXHAUSTED with a retry hint."""
    max_runs_per_tenant: int = 500
    """Runs of one tenant executing at once in this process."""
    stream_buffer_events: int = 1_024
    """Events buffered per stream for a slow reader. When full, deltas are dropped; a durable
    event that does not fit ends the stream with RESOURCE_EXHAUSTED, and the reader
    re-attaches with StreamRun(after_seq) without losing anything."""
    max_calls_per_caller: int = 4_096
    """Calls (streams included) one caller holds open at once; more get RESOURCE_EXHAUSTED
    with a retry hint. A caller is a bearer token or client certificate (all callers are one
    when caller authentication is off)."""
    max_streams_per_run: int = 64
    """Streams attached to one live run at once (StartRun attaches and StreamRun followers)."""
    max_request_bytes: int = 16 * 1024 * 1024
    """Largest StartRunRequest accepted."""
    max_members: int = 32
    """Most members a snapshot may have."""
    max_history: int = 10_000
    """Most history messages a snapshot may have."""
    max_message_bytes: int = 32 * 1024
    """Largest user turn or history message."""
    default_max_speakers: int = _BUDGETS.max_speakers
    """Speakers per turn when the session sets no budget."""
    default_max_rounds: int = _BUDGETS.max_rounds
    """Supervisor rounds per turn when the session sets no budget."""
    default_max_output_tokens: int = _BUDGETS.max_output_tokens
    """Output tokens per speaker when the session sets no budget."""
    default_run_timeout_seconds: float = _BUDGETS.run_timeout_s
    """Wall-clock limit of a run when the session sets none."""

    @property
    def host_port(self) -> tuple[str, int]:
        """The listen address split into host and port."""
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)

    @property
    def bind_address(self) -> str:
        """The listen address as gRPC binds it (an IPv6 host in brackets)."""
        host, port = self.host_port
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def store_for_logs(self) -> str:
        """The store URL without a password or query (which may hold credentials too)."""
        return server_of(self.store)


def _convert(field: dataclasses.Field[object], raw: str) -> object:
    kind = type(field.default)
    if kind is bool:
        word = raw.strip().lower()
        if word in {"1", "true", "yes", "on"}:
            return True
        if word in {"0", "false", "no", "off", ""}:
            return False
        raise ValueError(raw)  # "ture" is a typo, not false
    if kind is int:
        return int(raw)
    if kind is float:
        return float(raw)
    return raw


def load_settings(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Settings:
    """Builds settings from defaults, the environment and command-line flags (in that order)."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="roundtable serve", description="Run the sidecar.")
    for f in fields(Settings):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            default=None,
            help=" ".join(
                part
                for part in (
                    f.metadata.get("help", ""),
                    f"(env {ENV_PREFIX}{f.name.upper()}; default {f.default!r})",
                )
                if part
            ),
        )
    args = parser.parse_args(list(argv))
    values: dict[str, object] = {}
    for f in fields(Settings):
        raw = getattr(args, f.name)
        if raw is None:
            raw = env.get(f"{ENV_PREFIX}{f.name.upper()}")
        if raw is not None:
            try:
                values[f.name] = _convert(f, raw)
            except ValueError:
                parser.error(
                    f"--{f.name.replace('_', '-')}: not a valid {type(f.default).__name__}: {raw!r}"
                )
    settings = Settings(**values)  # type: ignore[arg-type]
    if settings.checkpoint_durability not in {"async", "sync", "exit"}:
        parser.error("--checkpoint-durability: expected async, sync or exit")
    try:
        settings.host_port  # noqa: B018 (validates the address early)
    except ValueError:
        parser.error(f"--listen: expected host:port, got {settings.listen!r}")
    return settings
