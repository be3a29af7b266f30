"""Server settings: defaults that run with nothing set, then ROUNDTABLE_* variables, then flags.

`Settings` holds the plain server knobs and the policy values the server is built from
(`harness`, `request_limits`, `run_limits`, `budgets`). A knob's default is written once,
in the class that owns it; the field's metadata (`roundtable.domain.flags.flag`) names its
flag and says what it means. `knobs()` walks them, and both the command line and
`Settings.with_values` (flat, flag-named values) go through that one list.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from roundtable.api.limits import RequestLimits
from roundtable.domain.flags import FLAG, HELP, MAXIMUM, MINIMUM, flag
from roundtable.domain.limits import RunLimits
from roundtable.domain.snapshot import Budgets, server_of
from roundtable.harness.policies import HarnessPolicy

ENV_PREFIX = "ROUNDTABLE_"


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything `roundtable serve` can be told: each knob is a `--flag` and `ROUNDTABLE_FLAG`.

    Build one from flat, flag-named values with `Settings().with_values(max_runs=1, ...)`.
    """

    listen: str = field(
        default="127.0.0.1:50051", metadata=flag("listen", "host:port to listen on.")
    )
    tls_cert_file: str = field(
        default="",
        metadata=flag(
            "tls-cert-file",
            "PEM certificate chain the server presents; with --tls-key-file, the server "
            "speaks TLS only.",
        ),
    )
    tls_key_file: str = field(
        default="", metadata=flag("tls-key-file", "PEM private key of --tls-cert-file.")
    )
    tls_client_ca_file: str = field(
        default="",
        metadata=flag(
            "tls-client-ca-file",
            "PEM CA certificate(s): when set, every client must present a certificate one of "
            "them signed (mutual TLS). Needs --tls-cert-file and --tls-key-file.",
        ),
    )
    auth_tokens: str = field(
        default="",
        repr=False,
        metadata=flag(
            "auth-tokens",
            "Bearer tokens and the tenants each may act for ('*': any): "
            "token1=tenant-a|tenant-b;token2=*. Callers send 'authorization: Bearer <token>'.",
        ),
    )
    auth_tokens_file: str = field(
        default="",
        metadata=flag(
            "auth-tokens-file",
            'JSON file of bearer tokens: {"<token>": ["tenant-a", "tenant-b"], "<token2>": ["*"]}.',
        ),
    )
    auth_certificate_tenants: str = field(
        default="",
        metadata=flag(
            "auth-certificate-tenants",
            "Under mutual TLS, client certificate common name -> tenants it may act for: "
            "gateway-1=tenant-a|tenant-b;gateway-2=*.",
        ),
    )
    allow_unauthenticated: bool = field(
        default=False,
        metadata=flag(
            "allow-unauthenticated",
            "Listen on a non-loopback address with no caller auth (no tokens, no mutual TLS).",
        ),
    )
    store: str = field(
        default="sqlite:///var/roundtable.db",
        repr=False,
        metadata=flag(
            "store",
            "sqlite:///relative/file.db (from the working directory), "
            "sqlite:////absolute/file.db (four slashes), or postgresql://user@host:port/db",
        ),
    )
    """Where runs, events and checkpoints live: sqlite:///relative/file.db (relative to the
    working directory), sqlite:////absolute/file.db (four slashes: the URL's path after its
    empty host is `/absolute/...`), or postgresql://user@host:port/db for several replicas."""
    checkpoint_durability: str = field(
        default="exit",
        metadata=flag(
            "checkpoint-durability",
            "LangGraph checkpoint durability: exit (one checkpoint when a run stops before "
            "its end), or async / sync (also one after each plan and each round of speakers).",
        ),
    )
    """A run completing writes no checkpoint under `exit`. The event log, not the checkpoint,
    says which speakers are finished, so resume is exact with any of the three; `exit` costs
    the least (a completed turn reads and writes no checkpoint at all, see bench/)."""
    replica_id: str = field(
        default="",
        metadata=flag("replica-id", "This replica's id in run leases (default: host-pid-random)."),
    )
    lease_seconds: float = field(
        default=10.0,
        metadata=flag(
            "lease-seconds",
            "How long a replica's claim on a live run lasts without renewal (renewed every third).",
            minimum=0.1,
        ),
    )
    grace_seconds: float = field(
        default=10.0,
        metadata=flag(
            "grace-seconds",
            "On SIGTERM/SIGINT: seconds live runs get to reach a speaker boundary.",
            minimum=0,
        ),
    )
    log_level: str = field(
        default="INFO", metadata=flag("log-level", "Level of the application and audit logs.")
    )
    offline_token_delay_ms: float = field(
        default=0.0,
        metadata=flag(
            "offline-token-delay-ms",
            "Pause between the offline model's streamed tokens (0: as fast as possible).",
            minimum=0,
        ),
    )
    max_calls_per_caller: int = field(
        default=4_096,
        metadata=flag(
            "max-calls-per-caller",
            "Calls (streams included) one caller holds open at once; more get "
            "RESOURCE_EXHAUSTED with a retry hint. A caller is a bearer token or client "
            "certificate (all callers are one when caller authentication is off).",
            minimum=1,
        ),
    )
    harness: HarnessPolicy = field(default_factory=HarnessPolicy)
    """Model timeouts, retries and circuit breakers (--model-*, --breaker-*)."""
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    """How large a StartRun may be (--max-request-bytes, --max-members, ...)."""
    run_limits: RunLimits = field(default_factory=RunLimits)
    """Runs and streams this process takes on (--max-runs, --stream-buffer-events, ...)."""
    budgets: Budgets = field(default_factory=Budgets)
    """Budgets of a session that sets none (--default-max-speakers, ...)."""

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

    def with_values(self, **values: Any) -> Settings:
        """A copy with flat, flag-named values set wherever each knob lives.

        `with_values(max_runs=1, model_retry_backoff_seconds=0.01)` sets
        `run_limits.max_runs` and `harness.retry.initial_backoff_s`: the names are the flags'
        (`--max-runs`) with underscores.

        Raises:
            TypeError: a name that is no knob's.
        """
        index = {knob.name: knob for knob in knobs()}
        unknown = sorted(values.keys() - index.keys())
        if unknown:
            raise TypeError(f"no such setting: {', '.join(unknown)}")
        settings = self
        for name, value in values.items():
            settings = _replaced(settings, index[name].path, value)
        return settings


@dataclass(frozen=True, slots=True)
class Knob:
    """One thing an operator can set: its flag, its variable, and where it lives in Settings."""

    flag: str
    """The flag without its dashes, e.g. "max-runs"."""
    path: tuple[str, ...]
    """Attribute names from a Settings down to the field, e.g. ("run_limits", "max_runs")."""
    default: object
    meaning: str
    minimum: float | None = None
    """A number's least accepted value (None: any)."""
    maximum: float | None = None
    """A number's greatest accepted value (None: any)."""

    @property
    def name(self) -> str:
        """The flat name `with_values` takes, e.g. "max_runs"."""
        return self.flag.replace("-", "_")

    @property
    def env(self) -> str:
        """The environment variable, e.g. ROUNDTABLE_MAX_RUNS."""
        return f"{ENV_PREFIX}{self.name.upper()}"

    @property
    def help(self) -> str:
        """What `--help` shows: the meaning, the variable, the default, the least value and
        (for a default budget) the most."""
        least = "" if self.minimum is None else f"; at least {_number(self.minimum)}"
        most = "" if self.maximum is None else f"; at most {_number(self.maximum)}"
        return f"{self.meaning} (env {self.env}; default {self.default!r}{least}{most})".strip()

    def parse(self, raw: str) -> object:
        """The value of a flag's or variable's text, of the default's type.

        Raises:
            ValueError: not a value of that type (a misspelt boolean included).
        """
        kind = type(self.default)
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
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError(raw)  # nan passes every bound, inf means never
            return value
        return raw


def _number(value: float) -> str:
    """A bound as --help and errors say it: 2592000, not 2.592e+06."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def knobs() -> tuple[Knob, ...]:
    """Every knob, in Settings' field order (a policy's fields in the policy's order)."""
    return tuple(_walk(Settings(), ()))


def _walk(value: Any, path: tuple[str, ...]) -> Iterator[Knob]:
    """The knobs of a dataclass value: fields that name a flag, and those of nested policies."""
    for f in fields(value):
        default = getattr(value, f.name)
        if FLAG in f.metadata:
            yield Knob(
                f.metadata[FLAG],
                (*path, f.name),
                default,
                f.metadata.get(HELP, ""),
                f.metadata.get(MINIMUM),
                f.metadata.get(MAXIMUM),
            )
        elif dataclasses.is_dataclass(default):
            yield from _walk(default, (*path, f.name))


def _replaced(value: Any, path: tuple[str, ...], new: object) -> Any:
    """`value` with the field at `path` (one or more attribute names) set to `new`."""
    head, rest = path[0], path[1:]
    inner = _replaced(getattr(value, head), rest, new) if rest else new
    return dataclasses.replace(value, **{head: inner})


def load_settings(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Settings:
    """Builds settings from defaults, the environment and command-line flags (in that order)."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="roundtable serve", description="Run the sidecar.")
    every = knobs()
    for knob in every:
        parser.add_argument(f"--{knob.flag}", dest=knob.name, default=None, help=knob.help)
    args = parser.parse_args(list(argv))
    values: dict[str, object] = {}
    for knob in every:
        raw = getattr(args, knob.name)
        if raw is None:
            raw = env.get(knob.env)
        if raw is not None:
            try:
                value = knob.parse(raw)
            except ValueError:
                parser.error(f"--{knob.flag}: not a valid {type(knob.default).__name__}: {raw!r}")
            if knob.minimum is not None and value < knob.minimum:  # type: ignore[operator]
                parser.error(
                    f"--{knob.flag}: must be at least {_number(knob.minimum)}, got {raw!r}"
                )
            if knob.maximum is not None and value > knob.maximum:  # type: ignore[operator]
                parser.error(f"--{knob.flag}: must be at most {_number(knob.maximum)}, got {raw!r}")
            values[knob.name] = value
    settings = Settings().with_values(**values)
    if settings.log_level.upper() not in logging.getLevelNamesMapping():
        levels = "DEBUG, INFO, WARNING, ERROR or CRITICAL"
        parser.error(f"--log-level: expected {levels}, got {settings.log_level!r}")
    if settings.checkpoint_durability not in {"async", "sync", "exit"}:
        parser.error("--checkpoint-durability: expected async, sync or exit")
    try:
        settings.host_port  # noqa: B018 (validates the address early)
    except ValueError:
        parser.error(f"--listen: expected host:port, got {settings.listen!r}")
    return settings
