"""What the conformance tests (clients/conformance.md) run against: a real `roundtable serve`
process (from $ROUNDTABLE_BIN, default the venv's), the demo roster, a loopback TCP proxy that
cuts connections, a self-signed certificate, the repository's test MCP tool server, and a
collector of what a turn yielded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from roundtable.v1 import events_pb2, orchestrator_service_pb2, snapshot_pb2
from roundtable_client import Client, Retry, RoundtableError, TurnOptions

ROSTER = ["lin", "bo", "mei", "kai"]
_SERVING = re.compile(r"roundtable serving on [\d.]+:(\d+)")


def roundtable_bin() -> str:
    """The sidecar to test against: $ROUNDTABLE_BIN, else `roundtable` beside this Python."""
    configured = os.environ.get("ROUNDTABLE_BIN")
    if configured:
        return configured
    beside = Path(sys.executable).parent / "roundtable"
    if beside.exists():
        return str(beside)
    found = shutil.which("roundtable")
    if found is None:
        raise RuntimeError("no roundtable binary: make venv, or set ROUNDTABLE_BIN")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sidecar:
    """`roundtable serve` on a fixed port and SQLite file; can be stopped and started again."""

    def __init__(self, directory: Path, *args: str) -> None:
        self.directory = directory
        self.db = directory / "rt.db"
        self.port = free_port()
        self.args = args
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, wait_s: float = 60.0) -> Sidecar:
        """Starts the process and waits until it says where it listens."""
        self.starts += 1
        log = self.directory / f"rt-{self.starts}.log"
        with log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                roundtable_bin(),
                "serve",
                "--listen",
                self.address,
                "--store",
                f"sqlite:///{self.db}",
                *self.args,
                stdout=out,
                stderr=out,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        async with asyncio.timeout(wait_s):
            while not _SERVING.search(log.read_text("utf-8", "replace")):
                if self.proc.returncode is not None:
                    raise RuntimeError(f"sidecar exited: {log.read_text()}")
                await asyncio.sleep(0.05)
        return self

    async def stop(self, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` and waits for the exit."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
        try:
            async with asyncio.timeout(30):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def demo_request(run_id: str, text: str) -> orchestrator_service_pb2.StartRunRequest:
    """A turn for the demo roster (four members, group chat, offline model)."""
    personas = {
        "lin": ("Lin", "A calm tea master who answers in gentle proverbs."),
        "bo": ("Bo", "An impatient engineer who wants numbers and facts first."),
        "mei": ("Mei", "A cheerful storyteller who loves a good anecdote."),
        "kai": ("Kai", "A sceptic who always asks what could go wrong."),
    }
    return orchestrator_service_pb2.StartRunRequest(
        context=snapshot_pb2.RunContext(
            run_id=run_id, thread_id=f"t-{run_id}", request_id=f"req-{run_id}", tenant="demo"
        ),
        snapshot=snapshot_pb2.Snapshot(
            session=snapshot_pb2.Session(
                session_id="demo",
                kind=snapshot_pb2.SESSION_KIND_GROUP,
                primary_member_id="lin",
            ),
            members=[
                snapshot_pb2.Member(
                    member_id=member_id,
                    display_name=name,
                    persona=persona,
                    style_rules=["Keep it short."],
                )
                for member_id, (name, persona) in personas.items()
            ],
            user_turn=snapshot_pb2.UserTurn(message_id=f"u-{run_id}", text=text),
        ),
    )


REPOSITORY = Path(__file__).resolve().parents[3]
"""The repository holding this distribution (clients/python), with tests/support/mcp_server.py."""
_TOOLS_LISTENING = re.compile(rb"mcp test server listening on port (\d+)")


class ToolServer:
    """The repository's test MCP server (`python -m tests.support.mcp_server`), run by this
    Python: tools `weather` (read-only) and `note` (a write that counts its executions per
    idempotency key), `GET /counts`."""

    def __init__(self, directory: Path) -> None:
        self.log = directory / "mcp.log"
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        """The MCP endpoint (ToolServer.url in a snapshot)."""
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self, wait_s: float = 30.0) -> ToolServer:
        with self.log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.support.mcp_server",
                "--port",
                "0",
                stdout=out,
                stderr=out,
                cwd=REPOSITORY,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        async with asyncio.timeout(wait_s):
            while not (said := _TOOLS_LISTENING.search(self.log.read_bytes())):
                if self.proc.returncode is not None:
                    raise RuntimeError(f"the test MCP server exited: {self.log.read_text()}")
                await asyncio.sleep(0.05)
        self.port = int(said.group(1))
        return self

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    def counts(self, tool: str) -> dict[str, int]:
        """How often `tool` ran, per idempotency key."""
        url = f"http://127.0.0.1:{self.port}/counts"
        with urllib.request.urlopen(url, timeout=5) as response:
            every: dict[str, dict[str, int]] = json.loads(response.read())
        return every.get(tool, {})


def tool_request(
    run_id: str, text: str, tools_url: str
) -> orchestrator_service_pb2.StartRunRequest:
    """demo_request whose members may call the test server's `weather` (read-only, runs as
    called) and `note` (a write: each call waits for a person's approval)."""
    request = demo_request(run_id, text)
    session = request.snapshot.session
    session.tool_servers.add(server_id="tools", url=tools_url)
    session.tools.add(
        name="weather",
        description="The weather in a city.",
        input_schema_json=json.dumps(
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        ),
        server_id="tools",
        read_only=True,
        approval=snapshot_pb2.APPROVAL_POLICY_NEVER,
    )
    session.tools.add(
        name="note",
        description="Writes a note.",
        input_schema_json=json.dumps(
            {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        ),
        server_id="tools",
        approval=snapshot_pb2.APPROVAL_POLICY_ALWAYS,
    )
    for member in request.snapshot.members:
        member.tool_names.extend(["weather", "note"])
    return request


class CutProxy:
    """Forwards loopback TCP to the sidecar. Cuts every open connection (both sides at once,
    like a network failure) after the k-th gRPC message the server sent over the first
    connection, or when cut() is called."""

    def __init__(self, upstream: str, after: int = 0) -> None:
        self.upstream = upstream
        self.after = after
        self.cuts = 0
        self.connections = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.upstream.rsplit(":", 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        self.connections += 1
        counting = self.connections == 1 and self.after > 0
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        downstream = self._count_and_cut(up_reader, writer) if counting else pipe(up_reader, writer)
        await asyncio.gather(pipe(reader, up_writer), downstream)

    async def _count_and_cut(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Server -> client HTTP/2, frame by frame: counts the gRPC messages (a 5-byte prefix,
        then the message) in DATA frames, and cuts after the frame that completes the k-th."""
        need: dict[int, int] = {}  # stream -> bytes left of the message in progress
        prefix: dict[int, bytes] = {}
        messages = 0
        with contextlib.suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
            while True:
                header = await src.readexactly(9)
                payload = await src.readexactly(int.from_bytes(header[:3], "big"))
                if header[3] == 0:  # DATA
                    stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
                    data = payload
                    if header[4] & 0x8 and data:  # PADDED
                        data = data[1 : len(data) - payload[0]]
                    while data:
                        if need.get(stream, 0) == 0:
                            take = 5 - len(prefix.get(stream, b""))
                            prefix[stream] = prefix.get(stream, b"") + data[:take]
                            data = data[take:]
                            if len(prefix[stream]) == 5:
                                need[stream] = int.from_bytes(prefix[stream][1:5], "big")
                                prefix[stream] = b""
                                messages += need[stream] == 0
                            continue
                        take = min(need[stream], len(data))
                        need[stream] -= take
                        data = data[take:]
                        messages += need[stream] == 0
                dst.write(header + payload)
                await dst.drain()
                if messages >= self.after:
                    self.cut()
                    return

    def cut(self) -> None:
        """Closes every open connection, both sides."""
        self.cuts += 1
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def self_signed(directory: Path) -> tuple[Path, Path, bytes]:
    """A certificate for 127.0.0.1 and its key (cryptography if installed, else openssl)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
                "-subj", "/CN=roundtable-test",
                "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        return cert, key, cert.read_bytes()
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "roundtable-test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key, cert.read_bytes()


@dataclass
class RetrySeen:
    retry: Retry
    last_seen: int
    """The last durable seq the caller had when the retry was announced."""


@dataclass
class Collected:
    """What a turn yielded."""

    events: list[events_pb2.RunEvent] = field(default_factory=list)
    deltas: int = 0
    retries: list[RetrySeen] = field(default_factory=list)
    error: RoundtableError | None = None

    def kinds(self) -> list[str]:
        return [str(e.WhichOneof("payload")) for e in self.events]

    def finals(self) -> list[events_pb2.AssistantFinal]:
        return [e.assistant_final for e in self.events if e.HasField("assistant_final")]

    def assert_completed_once(self) -> None:
        """Durable seqs run 1, 2, 3... with no repeat; the last event is run_completed; each
        reply's final came once, from the four members in roster order."""
        assert self.error is None, f"turn failed: {self.error!r}"
        assert [e.seq for e in self.events] == list(range(1, len(self.events) + 1)), self.kinds()
        assert self.events and self.events[-1].HasField("run_completed"), self.kinds()
        reply_ids = [f.reply_id for f in self.finals()]
        assert len(reply_ids) == len(set(reply_ids)), f"a final yielded twice: {reply_ids}"
        assert [f.member_id for f in self.finals()] == ROSTER


async def collect(
    client: Client,
    request: orchestrator_service_pb2.StartRunRequest,
    options: TurnOptions | None = None,
    on_event: Callable[[events_pb2.RunEvent], object] | None = None,
) -> Collected:
    """Runs one turn through the library; `on_event` sees each durable event as it is yielded
    (awaited if it returns an awaitable)."""
    seen = Collected()
    base = options or TurnOptions()

    def on_retry(retry: Retry) -> None:
        last = seen.events[-1].seq if seen.events else 0
        seen.retries.append(RetrySeen(retry, last))

    opts = TurnOptions(
        max_attempts=base.max_attempts,
        initial_backoff=base.initial_backoff,
        max_backoff=base.max_backoff,
        resend_start_run=base.resend_start_run,
        terminal_grace=base.terminal_grace,
        on_retry=on_retry,
    )
    try:
        async with contextlib.aclosing(client.run_turn(request, opts)) as events:
            async for event in events:
                if event.HasField("assistant_delta"):
                    seen.deltas += 1
                    continue
                seen.events.append(event)
                if on_event is not None:
                    result = on_event(event)
                    if asyncio.iscoroutine(result):
                        await result
    except RoundtableError as error:
        seen.error = error
    return seen


PATIENT = TurnOptions(max_attempts=30, max_backoff=1.0)
"""Retries long enough to outlast a sidecar restart."""
