"""The Go gateway example (examples/gateway-go) against a real `roundtable serve` process.

The gateway is built once with `go build`; every test starts a sidecar, runs the binary as
a user would, and reads its `SUMMARY {...}` line and its JSON store (`-db`): replies are
persisted once per (run_id, reply_id) however often they arrive, memory proposals are
validated by the gateway's own rules, and a stream dropped mid-run (by the gateway's
-drop-after hook, or by a TCP proxy cutting the connection) is re-attached with
StreamRun(after_seq) without losing or repeating anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from roundtable.v1 import orchestrator_service_pb2 as pb
from support.process import ServerProcess

pytestmark = [pytest.mark.go, pytest.mark.e2e]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway-go"
ROSTER = ["lin", "bo", "mei", "kai"]


@pytest.fixture
async def sidecars(
    tmp_path: Path,
) -> AsyncIterator[Callable[[str], Coroutine[Any, Any, ServerProcess]]]:
    """Starts `roundtable serve` processes (slow offline tokens), each on its own database."""
    started: list[ServerProcess] = []

    async def start(name: str = "rt") -> ServerProcess:
        server = ServerProcess(
            tmp_path / f"{name}.db", tmp_path / f"{name}.log", "--offline-token-delay-ms", "10"
        )
        started.append(server)
        return await server.start()

    yield start
    for server in started:
        await server.stop()


@dataclass
class GatewayRun:
    summary: dict[str, Any]
    stdout: str
    stderr: str


def _env() -> dict[str, str]:
    """The test environment without an OTLP endpoint: tests export no spans."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}


async def run_gateway(
    binary: Path,
    server: ServerProcess | str,
    db: Path,
    *args: str,
    wait_s: float = 60.0,
    on_line: Callable[[str], None] | None = None,
    stdin: bytes | None = None,
    exit_code: int = 0,
) -> GatewayRun:
    """Runs the gateway once against `server` (or a host:port); returns its SUMMARY line.

    `on_line` sees every stdout line as it is printed; `stdin`, when given, is what the
    person types (then the input ends); `exit_code` is the exit status expected.
    """
    target = server if isinstance(server, str) else server.address
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        "-target",
        target,
        "-db",
        str(db),
        "-timeout",
        f"{int(wait_s)}s",
        *args,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    if stdin is not None:
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        await proc.stdin.drain()
        proc.stdin.close()
    lines: list[str] = []

    async def read_stdout() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            lines.append(raw.decode())
            if on_line is not None:
                on_line(lines[-1])

    try:
        async with asyncio.timeout(wait_s + 10):
            _, err, _ = await asyncio.gather(read_stdout(), proc.stderr.read(), proc.wait())
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    stdout, stderr = "".join(lines), err.decode()
    summaries = [line for line in lines if line.startswith("SUMMARY ")]
    assert proc.returncode == exit_code and summaries, (
        f"gateway exit {proc.returncode}\n{stdout}\n{stderr}"
    )
    return GatewayRun(json.loads(summaries[-1].removeprefix("SUMMARY ")), stdout, stderr)


class CuttableProxy:
    """A TCP proxy in front of the sidecar whose open connections can be cut at once,
    like a network failure: the client's Recv fails with UNAVAILABLE, new connections work."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.cuts = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.upstream.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        """Closes every open connection (both sides)."""
        self.cuts += 1
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def stored_replies(db: Path, run_id: str) -> list[dict[str, Any]]:
    """The replies the gateway's store holds for a run."""
    data = json.loads(db.read_text("utf-8"))
    return [m for m in data["messages"] if m["role"] == "assistant" and m["run_id"] == run_id]


def stored_memories(db: Path) -> list[dict[str, Any]]:
    return json.loads(db.read_text("utf-8"))["memories"]


def assert_each_reply_stored_once(db: Path, run_id: str, replies: list[dict[str, Any]]) -> None:
    rows = stored_replies(db, run_id)
    assert Counter(r["reply_id"] for r in rows) == Counter(r["reply_id"] for r in replies)
    assert all(n == 1 for n in Counter(r["reply_id"] for r in rows).values())
    by_id = {r["reply_id"]: r for r in rows}
    for reply in replies:
        assert by_id[reply["reply_id"]]["content"] == reply["content"]
        assert by_id[reply["reply_id"]]["member_id"] == reply["member_id"]


async def test_count_off_persists_four_numbered_replies_in_roster_order(
    gateway_binary: Path, sidecars, tmp_path: Path
) -> None:
    server = await sidecars("rt")
    db = tmp_path / "gateway.json"
    run = await run_gateway(gateway_binary, server, db, "-run-id", "count-1", "-text", "大家报数！")
    s = run.summary
    assert s["status"] == "completed" and not s["reattached"]
    assert [r["member_id"] for r in s["replies"]] == ROSTER
    assert [r["reply_id"] for r in s["replies"]] == [f"count-1#{i}" for i in range(4)]
    for number, reply in enumerate(s["replies"], start=1):
        assert re.findall(r"\d+", reply["content"]) == [str(number)], reply
        assert reply["persisted"]
    assert s["accepted_memories"] == [] and s["rejected_memories"] == []
    assert_each_reply_stored_once(db, "count-1", s["replies"])
    for name in ("Lin", "Bo", "Mei", "Kai"):
        assert f"\n{name}: " in run.stdout, "the transcript names the speakers"


async def test_mention_gets_only_meis_reply(gateway_binary: Path, sidecars, tmp_path: Path) -> None:
    server = await sidecars("rt")
    db = tmp_path / "gateway.json"
    run = await run_gateway(
        gateway_binary, server, db, "-run-id", "mention-1", "-text", "@Mei what is your best story?"
    )
    s = run.summary
    assert s["status"] == "completed"
    assert [(r["reply_id"], r["member_id"]) for r in s["replies"]] == [("mention-1#0", "mei")]
    assert s["replies"][0]["content"]
    assert_each_reply_stored_once(db, "mention-1", s["replies"])
    assert "── plan [mention, deterministic] round 1: Mei\n" in run.stdout


async def test_memories_accepted_once_and_a_replay_persists_nothing_twice(
    gateway_binary: Path, sidecars, tmp_path: Path
) -> None:
    server = await sidecars("rt")
    db = tmp_path / "gateway.json"
    args = ("-run-id", "memo-1", "-thread-id", "memo-thread")
    text = "@Mei @Kai remember that I prefer green tea"

    first = (await run_gateway(gateway_binary, server, db, *args, "-text", text)).summary
    assert first["status"] == "completed" and not first["retried_run"]
    assert [r["member_id"] for r in first["replies"]] == ["mei", "kai"]
    assert all(r["persisted"] for r in first["replies"])
    assert sorted(m["member_id"] for m in first["accepted_memories"]) == ["kai", "mei"]
    assert all("green tea" in m["content"] for m in first["accepted_memories"])
    assert first["rejected_memories"] == []
    memories = stored_memories(db)
    assert sorted((m["member_id"], m["memory_id"]) for m in memories) == sorted(
        (m["member_id"], m["memory_id"]) for m in first["accepted_memories"]
    )

    replay = await run_gateway(gateway_binary, server, db, *args, "-text", text)
    second = replay.summary
    assert second["status"] == "completed" and second["retried_run"]
    assert not second["resumed"], "a finished run is replayed from the event log"
    assert [(r["reply_id"], r["content"]) for r in second["replies"]] == [
        (r["reply_id"], r["content"]) for r in first["replies"]
    ]
    assert not any(r["persisted"] for r in second["replies"])
    assert second["duplicate_finals"] == 2
    assert second["accepted_memories"] == []
    assert sorted(m["member_id"] for m in second["rejected_memories"]) == ["kai", "mei"]
    assert all(
        m["reason"].startswith("duplicate of memory mem-") for m in second["rejected_memories"]
    )
    assert second["last_seq"] == first["last_seq"]
    assert_each_reply_stored_once(db, "memo-1", first["replies"])
    assert stored_memories(db) == memories, "nothing stored twice"
    assert "already persisted" in replay.stdout and "rejected create" in replay.stdout


async def test_a_memory_the_member_already_has_is_rejected(
    gateway_binary: Path, sidecars, tmp_path: Path
) -> None:
    snapshot = {
        "session": {"sessionId": "s", "kind": "SESSION_KIND_GROUP", "primaryMemberId": "mei"},
        "members": [
            {"memberId": "mei", "displayName": "Mei", "persona": "A storyteller."},
            {
                "memberId": "kai",
                "displayName": "Kai",
                "persona": "A sceptic.",
                "memories": [
                    {"memoryId": "k-tea", "content": "I prefer green tea.", "importance": 0.6}
                ],
            },
        ],
        "userTurn": {"text": "@Mei @Kai remember that I prefer green tea"},
    }
    file = tmp_path / "snapshot.json"
    file.write_text(json.dumps(snapshot), "utf-8")
    server = await sidecars("rt")
    s = (
        await run_gateway(gateway_binary, server, tmp_path / "gateway.json", "-snapshot", str(file))
    ).summary
    assert [m["member_id"] for m in s["accepted_memories"]] == ["mei"]
    assert [(m["member_id"], m["reason"]) for m in s["rejected_memories"]] == [
        ("kai", "duplicate of memory k-tea")
    ]


@pytest.mark.parametrize("drop_after", [2, 5, 9])
async def test_dropped_stream_reattaches_and_loses_nothing(
    gateway_binary: Path, sidecars, tmp_path: Path, drop_after: int
) -> None:
    text = "@all tell me about your day"
    args = ("-run-id", "drop-1", "-thread-id", "drop-thread", "-text", text)
    calm_server, rough_server = await asyncio.gather(sidecars("calm"), sidecars("rough"))
    calm = (await run_gateway(gateway_binary, calm_server, tmp_path / "calm.json", *args)).summary

    rough_db = tmp_path / "rough.json"
    run = await run_gateway(
        gateway_binary, rough_server, rough_db, *args, "-drop-after", str(drop_after)
    )
    rough = run.summary
    assert rough["status"] == "completed"
    assert rough["reattached"] and rough["reattaches"] == 1
    assert f"re-attaching with StreamRun(after_seq={drop_after})" in run.stdout
    assert rough["replies"] == calm["replies"], "the same replies as an undisturbed run"
    assert [r["member_id"] for r in rough["replies"]] == ROSTER
    assert all(r["persisted"] for r in rough["replies"]) and rough["duplicate_finals"] == 0
    assert rough["last_seq"] == calm["last_seq"]
    assert rough["events_skipped"] == 0, "StreamRun starts right after the last seq handled"
    assert_each_reply_stored_once(rough_db, "drop-1", rough["replies"])


async def test_a_cut_connection_is_reattached_and_loses_nothing(
    gateway_binary: Path, sidecars, tmp_path: Path
) -> None:
    """A real network failure mid-run (not the -drop-after hook): Recv fails with an error
    that is not a terminal event, and the gateway re-attaches through a new connection."""
    text = "@all tell me about your day"
    args = ("-run-id", "cut-1", "-thread-id", "cut-thread", "-text", text)
    calm_server, rough_server = await asyncio.gather(sidecars("calm"), sidecars("rough"))
    calm = (await run_gateway(gateway_binary, calm_server, tmp_path / "calm.json", *args)).summary

    proxy = CuttableProxy(rough_server.address)
    address = await proxy.start()

    def cut_after_first_reply(line: str) -> None:
        if "✓ persisted cut-1#0" in line and proxy.cuts == 0:
            proxy.cut()

    try:
        run = await run_gateway(
            gateway_binary, address, tmp_path / "rough.json", *args, on_line=cut_after_first_reply
        )
    finally:
        await proxy.close()
    rough = run.summary
    assert proxy.cuts >= 1
    assert rough["status"] == "completed" and rough["reattached"], run.stdout
    assert "re-attaching with StreamRun(after_seq=" in run.stdout
    assert rough["replies"] == calm["replies"]
    assert all(r["persisted"] for r in rough["replies"]) and rough["duplicate_finals"] == 0
    assert_each_reply_stored_once(tmp_path / "rough.json", "cut-1", rough["replies"])


async def test_a_cancelled_run_retried_resumes_and_its_replay_ends_at_the_last_end(
    gateway_binary: Path, sidecars, tmp_path: Path
) -> None:
    """A run stopped after its first reply, retried by the gateway (the same run_id:
    Roundtable resumes it), then retried once more (a replay). Both streams carry the whole
    log: the first execution ending in run_cancelled, then the resumed one; the gateway
    reads on past the first terminal event and persists every reply once."""
    server = await sidecars("rt")
    db = tmp_path / "gateway.json"
    args = ("-run-id", "res-1", "-thread-id", "res-thread", "-text", "@all tell me about your day")
    cancels: list[asyncio.Task[Any]] = []

    async def cancel() -> None:
        async with server.channel() as channel:
            await server.stub(channel).CancelRun(pb.CancelRunRequest(run_id="res-1", tenant="demo"))

    def cancel_after_first_reply(line: str) -> None:
        if "✓ persisted res-1#0" in line and not cancels:
            cancels.append(asyncio.get_running_loop().create_task(cancel()))

    first = (
        await run_gateway(gateway_binary, server, db, *args, on_line=cancel_after_first_reply)
    ).summary
    await asyncio.gather(*cancels)
    assert first["status"] == "cancelled" and 1 <= len(first["replies"]) < 4

    retried = await run_gateway(gateway_binary, server, db, *args)
    second = retried.summary
    assert second["status"] == "completed", retried.stdout
    assert second["retried_run"] and second["resumed"] and not second["reattached"]
    assert [r["member_id"] for r in second["replies"]] == ROSTER
    assert second["duplicate_finals"] == len(first["replies"]), "the first execution's replies"
    assert "── cancelled" in retried.stdout and "── run started (resumed)" in retried.stdout
    assert_each_reply_stored_once(db, "res-1", second["replies"])

    replay = (await run_gateway(gateway_binary, server, db, *args)).summary
    assert replay["status"] == "completed" and replay["last_seq"] == second["last_seq"]
    assert [r["reply_id"] for r in replay["replies"]] == [r["reply_id"] for r in second["replies"]]
    assert not any(r["persisted"] for r in replay["replies"]) and replay["duplicate_finals"] == 4
    assert_each_reply_stored_once(db, "res-1", second["replies"])


async def test_a_run_stopped_by_a_sidecar_restart_is_resumed_by_the_gateway(
    gateway_binary: Path, tmp_path: Path
) -> None:
    """The sidecar shuts down mid-turn (SIGTERM: the run ends run_cancelled with reason
    server_shutdown) and comes back on the same database: the gateway sends the same
    StartRun again until it gets through, and the turn completes with every reply once."""
    servers = [
        await ServerProcess(
            tmp_path / "rt.db", tmp_path / "rt-1.log", "--offline-token-delay-ms", "10"
        ).start()
    ]
    proxy = CuttableProxy(servers[0].address)  # the sidecar's address, whichever process
    target = await proxy.start()
    db = tmp_path / "gateway.json"
    restarts: list[asyncio.Task[Any]] = []

    async def restart() -> None:
        await servers[0].stop()
        servers.append(
            await ServerProcess(
                tmp_path / "rt.db", tmp_path / "rt-2.log", "--offline-token-delay-ms", "10"
            ).start()
        )
        proxy.upstream = servers[-1].address

    def restart_after_first_reply(line: str) -> None:
        if "✓ persisted rs-1#0" in line and not restarts:
            restarts.append(asyncio.get_running_loop().create_task(restart()))

    try:
        run = await run_gateway(
            gateway_binary,
            target,
            db,
            "-run-id",
            "rs-1",
            "-text",
            "@all tell me about your day",
            on_line=restart_after_first_reply,
        )
        await asyncio.gather(*restarts)
    finally:
        await proxy.close()
        for server in servers:
            await server.stop()
    summary = run.summary
    assert "── cancelled (server_shutdown)" in run.stdout
    assert "sending the same StartRun to resume it" in run.stdout
    assert summary["status"] == "completed" and summary["resumed"], run.stdout
    assert [r["member_id"] for r in summary["replies"]] == ROSTER
    assert_each_reply_stored_once(db, "rs-1", summary["replies"])


async def test_a_token_is_not_sent_in_cleartext_beyond_this_machine(
    gateway_binary: Path, tmp_path: Path
) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(gateway_binary),
        "-target",
        "192.0.2.10:50051",  # TEST-NET-1: never reached, the gateway refuses before dialling
        "-db",
        str(tmp_path / "gateway.json"),
        "-text",
        "hi",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**_env(), "ROUNDTABLE_TOKEN": "tok-3f9a"},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode != 0
    assert b"refusing to send a token in cleartext" in err
    assert b"tok-3f9a" not in out + err


async def test_go_unit_tests_pass() -> None:
    """The gateway's own Go tests (memory rules, the store)."""
    go = shutil.which("go")
    if go is None:
        pytest.fail("the Go toolchain is required for tests/gateway (go not found on PATH)")
    proc = await asyncio.create_subprocess_exec(
        go,
        "test",
        "-buildvcs=false",
        "./...",
        cwd=EXAMPLE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(600):
        out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()


async def test_speakers_answering_at_once_are_printed_readably_and_stored_once(
    gateway_binary: Path, sidecars, tmp_path: Path
) -> None:
    server = await sidecars("rt")
    db = tmp_path / "gateway.json"
    run = await run_gateway(
        gateway_binary, server, db, "-run-id", "par-1", "-parallel", "-text", "@all what now?"
    )
    s = run.summary
    assert s["status"] == "completed"
    assert [r["member_id"] for r in s["replies"]] == ROSTER, "replies in plan order"
    lines = run.stdout.splitlines()
    assert "── answering at once: Lin, Bo, Mei, Kai" in lines
    names = dict(zip(("Lin", "Bo", "Mei", "Kai"), s["replies"], strict=True))
    for name, reply in names.items():
        # Each reply whole, on a line of its own (no interleaved half-lines of deltas).
        assert lines.count(f"{name}: {reply['content']}") == 1, run.stdout
    assert_each_reply_stored_once(db, "par-1", s["replies"])
