"""`roundtable chat`: send one turn to a running sidecar and render the stream as a chat."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import grpc
from google.protobuf import json_format

from roundtable.chat_render import ChatRenderer
from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb

DEMO_MEMBERS = (
    ("lin", "Lin", ("林", "tea"), "A calm tea master who answers in gentle proverbs.", ("tea",)),
    (
        "bo",
        "Bo",
        ("波",),
        "An impatient engineer who wants numbers and facts first.",
        ("engineering",),
    ),
    ("mei", "Mei", ("梅",), "A cheerful storyteller who loves a good anecdote.", ("stories",)),
    ("kai", "Kai", ("凯",), "A sceptic who always asks what could go wrong.", ("risk",)),
)


KINDS = {"group": spb.SESSION_KIND_GROUP, "single": spb.SESSION_KIND_SINGLE}
"""`--kind`'s choices, as the session kinds they are."""


def demo_snapshot(text: str, *, kind: str = "group") -> spb.Snapshot:
    """A four-member demo roster (distinct personas) around the user's text."""
    snapshot = spb.Snapshot(
        session=spb.Session(
            session_id="demo",
            kind=KINDS[kind],
            primary_member_id="lin",
        ),
        user_turn=spb.UserTurn(text=text),
    )
    for member_id, name, aliases, persona, skills in DEMO_MEMBERS:
        snapshot.members.add(
            member_id=member_id,
            display_name=name,
            aliases=aliases,
            persona=persona,
            skills=[spb.Skill(skill_id=s, name=s) for s in skills],
        )
    return snapshot


CLI_CREDENTIAL = "cli"
"""The credentials entry (and `credential_ref`) holding the key `--api-key-file` or the
environment gave: the key travels in StartRunRequest.credentials, never in the snapshot."""

API_KEY_VARIABLES = ("ROUNDTABLE_API_KEY", "OPENAI_API_KEY")
"""Where the key is read from when no `--api-key-file` is given, first found wins."""


@dataclass(frozen=True)
class ModelChoice:
    """The model `--model`, `--base-url` and the API key name for the turn."""

    provider: str
    model: str
    base_url: str = ""
    api_key: str = field(default="", repr=False)
    timeout_ms: int = 0

    def apply(self, request: pb.StartRunRequest) -> None:
        """Makes this the session's default model: the supervisor's, the memory proposals'
        and that of every member that names no model of its own."""
        ref = request.snapshot.session.default_model
        # The snapshot's temperature and timeout stay; its fallbacks were for another model.
        ref.target.CopyFrom(
            spb.ModelTarget(provider=self.provider, model=self.model, base_url=self.base_url)
        )
        del ref.fallbacks[:]
        if self.timeout_ms:
            ref.timeout_ms = self.timeout_ms
        if self.api_key:
            ref.target.credential_ref = CLI_CREDENTIAL
            request.credentials[CLI_CREDENTIAL] = self.api_key


def parse_model(spec: str) -> tuple[str, str]:
    """Splits `provider:model` at its first colon (model names may hold more: `qwen3:8b`).

    Raises:
        ValueError: when either part is empty.
    """
    provider, _, model = spec.partition(":")
    if not provider or not model:
        raise ValueError(
            f"--model takes provider:model, for example openai:gpt-4o-mini, not {spec!r}"
        )
    return provider, model


def read_api_key(key_file: str | None, environ: Mapping[str, str]) -> str:
    """The API key: the file's first line when a file is named, else the first of
    `API_KEY_VARIABLES` that is set, else "" (local servers need none)."""
    if key_file:
        lines = Path(key_file).read_text("utf-8").splitlines()
        return lines[0].strip() if lines else ""
    return next((environ[v].strip() for v in API_KEY_VARIABLES if environ.get(v)), "")


def model_choice(args: argparse.Namespace, environ: Mapping[str, str]) -> ModelChoice | None:
    """The model the command line asks for, or None to keep the snapshot's (or the demo's
    offline model)."""
    if not args.model:
        if args.base_url or args.api_key_file:
            raise ValueError("--base-url and --api-key-file need --model provider:model")
        return None
    provider, model = parse_model(args.model)
    return ModelChoice(
        provider=provider,
        model=model,
        base_url=args.base_url or "",
        api_key=read_api_key(args.api_key_file, environ),
        timeout_ms=args.timeout_ms,
    )


def chat_snapshot(path: str | None, text: str, kind: str | None) -> spb.Snapshot:
    """The turn's snapshot: the JSON file at `path` (its session's kind replaced by `kind`
    when one is given, its user turn by `text` when there is one), else the demo roster.

    Raises:
        ValueError: the file cannot be read or is no Snapshot in JSON (the message says).
    """
    if not path:
        return demo_snapshot(text or "count off", kind=kind or "group")
    try:
        snapshot = json_format.Parse(Path(path).read_text("utf-8"), spb.Snapshot())
    except (OSError, UnicodeDecodeError, json_format.ParseError) as exc:
        raise ValueError(f"--snapshot {path}: {exc}") from None
    if text:
        snapshot.user_turn.text = text
    if kind:
        snapshot.session.kind = KINDS[kind]
    return snapshot


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roundtable chat")
    parser.add_argument(
        "text",
        nargs="*",
        help='what the user says (default: the --snapshot\'s own text, else "count off")',
    )
    parser.add_argument("--target", default="127.0.0.1:50051", help="the sidecar's host:port")
    parser.add_argument("--snapshot", help="a JSON Snapshot file instead of the demo roster")
    parser.add_argument(
        "--kind",
        choices=tuple(KINDS),
        help="group chat (the default) or single chat; with --snapshot, instead of its own",
    )
    parser.add_argument("--thread", default="demo-thread", help="thread id")
    parser.add_argument("--run-id", default="", help="run id (default: a new one)")
    parser.add_argument("--tenant", default="demo")
    parser.add_argument(
        "--token-file",
        help="a file holding the bearer token to send (or set ROUNDTABLE_CHAT_TOKEN)",
    )
    parser.add_argument(
        "--model",
        help="provider:model for the supervisor, the memory proposals and every member without "
        "a model of its own, for example openai:gpt-4o-mini or openai:smollm2 "
        "(default: the snapshot's, else the built-in offline model)",
    )
    parser.add_argument(
        "--base-url", help="the model server's base URL, for example http://127.0.0.1:8080/v1"
    )
    parser.add_argument(
        "--api-key-file",
        help="a file holding the model server's API key (else ROUNDTABLE_API_KEY, else "
        "OPENAI_API_KEY; none for a local server); sent as a credential, never printed",
    )
    parser.add_argument(
        "--timeout-ms",
        type=int,
        default=0,
        help="per-attempt model timeout with --model (default: the server's, 60 s)",
    )
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="a group's independent speakers answer at once (SPEAKER_CONCURRENCY_PARALLEL)",
    )
    parser.add_argument(
        "--tools",
        metavar="URL",
        help="an MCP server (streamable HTTP) whose tools weather (read-only) and note (needs "
        'approval) every demo member may call; say e.g. "use weather for Paris"',
    )
    parser.add_argument(
        "--approve",
        choices=("ask", "always", "never"),
        default="ask",
        help="what to answer a permission request: ask at the terminal (y/n), or always "
        "approve, or always deny (for scripts)",
    )
    parser.add_argument("--tls-ca-file", help="PEM roots to trust: connect with TLS")
    parser.add_argument("--tls-cert-file", help="PEM client certificate (mutual TLS)")
    parser.add_argument("--tls-key-file", help="PEM key of the client certificate")
    return parser


def run_chat(argv: Sequence[str]) -> int:
    """Sends one turn and renders its stream; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(list(argv))
    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        parser.error("--tls-cert-file and --tls-key-file go together")
    if args.tls_cert_file and not args.tls_ca_file:
        parser.error("--tls-cert-file needs --tls-ca-file")
    # Everything read from files or flags: a missing file or a bad value is a usage error
    # naming it, not a traceback.
    try:
        token = os.environ.get("ROUNDTABLE_CHAT_TOKEN", "")
        if args.token_file:
            token = Path(args.token_file).read_text("utf-8").strip()
        choice = model_choice(args, os.environ)
        security = ClientSecurity(
            token=token,
            ca=Path(args.tls_ca_file).read_bytes() if args.tls_ca_file else None,
            cert=Path(args.tls_cert_file).read_bytes() if args.tls_cert_file else None,
            key=Path(args.tls_key_file).read_bytes() if args.tls_key_file else None,
        )
        snapshot = chat_snapshot(args.snapshot, " ".join(args.text), args.kind)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    names = {m.member_id: m.display_name for m in snapshot.members}
    run_id = args.run_id or f"chat-{uuid.uuid4().hex[:12]}"
    request = pb.StartRunRequest(
        context=spb.RunContext(
            run_id=run_id, thread_id=args.thread, request_id=uuid.uuid4().hex, tenant=args.tenant
        ),
        snapshot=snapshot,
    )
    if choice is not None:
        choice.apply(request)
    if args.parallel:
        request.snapshot.session.speaker_concurrency = spb.SPEAKER_CONCURRENCY_PARALLEL
    if args.tools:
        add_demo_tools(request.snapshot, args.tools)
    print(f"you: {snapshot.user_turn.text}")
    approver = Approver(args.approve, names)
    return asyncio.run(
        send_turn(args.target, request, names, sys.stdout, security=security, approver=approver)
    )


DEMO_TOOLS = (
    ("weather", "The weather in a city now.", "city", True, spb.APPROVAL_POLICY_NEVER),
    ("note", "Writes a note for the user to keep.", "text", False, spb.APPROVAL_POLICY_ALWAYS),
)


def add_demo_tools(snapshot: spb.Snapshot, url: str) -> None:
    """Declares the demo tools on an MCP server and lets every member call them."""
    snapshot.session.tool_servers.add(server_id="tools", url=url)
    for name, description, argument, read_only, approval in DEMO_TOOLS:
        schema = {
            "type": "object",
            "properties": {argument: {"type": "string"}},
            "required": [argument],
        }
        snapshot.session.tools.add(
            name=name,
            description=description,
            input_schema_json=json.dumps(schema),
            server_id="tools",
            read_only=read_only,
            approval=approval,
        )
    for member in snapshot.members:
        member.tool_names.extend(name for name, *_ in DEMO_TOOLS)


class Approver:
    """Answers permission requests: asks the person at the terminal, or a fixed answer."""

    def __init__(self, mode: str, names: dict[str, str]) -> None:
        self.mode = mode
        self.names = names

    async def decide(self, asked: epb.PermissionRequired) -> tuple[int, str]:
        """The decision and, for a denial, its reason."""
        if self.mode == "always":
            return pb.PERMISSION_DECISION_APPROVE, ""
        if self.mode == "never":
            return pb.PERMISSION_DECISION_DENY, "denied by --approve never"
        who = self.names.get(asked.member_id, asked.member_id)
        prompt = f"   allow {who} to run {asked.tool_name}? [y/n] "
        try:
            answer = await asyncio.to_thread(input, prompt)
        except EOFError:
            # No terminal to ask (input from a file or /dev/null): a no, said out loud,
            # rather than a traceback that leaves the run waiting for a day.
            print("(no answer: end of input, so no)")
            return pb.PERMISSION_DECISION_DENY, "nobody answered"
        if answer.strip().lower() in ("y", "yes", "是", "好"):
            return pb.PERMISSION_DECISION_APPROVE, ""
        return pb.PERMISSION_DECISION_DENY, "the user said no"


@dataclass(frozen=True)
class ClientSecurity:
    """How `roundtable chat` proves who it is: a bearer token, TLS, a client certificate."""

    token: str = ""
    ca: bytes | None = None
    """PEM roots to trust; None for a plaintext channel."""
    cert: bytes | None = None
    key: bytes | None = None

    def channel(self, target: str) -> grpc.aio.Channel:
        """A channel to `target`: TLS when roots are given, with the token as call credentials."""
        if self.ca is None:
            return grpc.aio.insecure_channel(target)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )
        if self.token:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(self.token)
            )
        return grpc.aio.secure_channel(target, credentials)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Per-call metadata: the token, on a plaintext channel (TLS carries it itself)."""
        if self.token and self.ca is None:
            return (("authorization", f"Bearer {self.token}"),)
        return ()


async def send_turn(
    target: str,
    request: pb.StartRunRequest,
    names: dict[str, str],
    out: TextIO,
    *,
    security: ClientSecurity | None = None,
    approver: Approver | None = None,
) -> int:
    """Streams one StartRun and renders it, answering permission requests with `approver`;
    returns the exit code: 1 when the call or the run failed, else 0."""
    security = security or ClientSecurity()
    render = ChatRenderer(names, out)
    context = request.context
    failed = False
    async with security.channel(target) as channel:
        stub = pb_grpc.OrchestratorServiceStub(channel)
        try:
            async for response in stub.StartRun(request, metadata=security.metadata()):
                render(response.event)
                failed = response.event.HasField("run_failed")
                if response.event.HasField("permission_required") and approver is not None:
                    # The stream stays open while the run waits; the decision goes on the
                    # side, and the run's next events come down this same stream.
                    asked = response.event.permission_required
                    decision, reason = await approver.decide(asked)
                    await stub.ResolvePermission(
                        pb.ResolvePermissionRequest(
                            run_id=context.run_id,
                            tenant=context.tenant,
                            permission_request_id=asked.permission_request_id,
                            decision=decision,  # type: ignore[arg-type]
                            reason=reason,
                        ),
                        metadata=security.metadata(),
                    )
        except grpc.aio.AioRpcError as exc:
            print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    # A failed run is a failed command (a script must not take the turn for done); a
    # cancelled one ended as someone asked, and a speaker that failed alone is in its run.
    return 1 if failed else 0
