"""Shared helpers of the benchmark suite: statistics, requests, server processes, /proc.

Nothing here changes the product: it builds requests the way a gateway would, starts
`roundtable serve` (or bench/flood_server.py, the same composition root with extra bench
providers) as a real process on loopback, and reads CPU time and RSS from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# -- statistics ---------------------------------------------------------------------------


def summary(values: Iterable[float], unit: str, **extra: Any) -> dict[str, Any]:
    """min / median / max of the repetitions, with the samples themselves."""
    vals = [float(v) for v in values]
    if not vals:
        return {"min": None, "median": None, "max": None, "n": 0, "unit": unit, **extra}
    return {
        "min": min(vals),
        "median": statistics.median(vals),
        "max": max(vals),
        "n": len(vals),
        "unit": unit,
        "samples": [round(v, 6) for v in vals],
        **extra,
    }


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of unsorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[k]


# -- token time stamps (B2) ---------------------------------------------------------------

_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
STAMP_MOD = 36**6
"""Stamps are CLOCK_MONOTONIC microseconds modulo 36^6 (~36 min), 6 base-36 characters."""


def stamp_now() -> str:
    """The current CLOCK_MONOTONIC time as a 6-character token (shared by all processes)."""
    n = (time.monotonic_ns() // 1000) % STAMP_MOD
    out = []
    for _ in range(6):
        n, r = divmod(n, 36)
        out.append(_B36[r])
    return "".join(reversed(out))


def stamp_age_ms(stamp: str, now_us: int) -> float:
    """Milliseconds between a stamp and `now_us` (CLOCK_MONOTONIC microseconds)."""
    produced = int(stamp, 36)
    return ((now_us % STAMP_MOD - produced) % STAMP_MOD) / 1000


def read_replay(path: str) -> list[bytes]:
    """Serialized responses, each behind its length as 4 bytes big-endian (`write_replay`)."""
    data = Path(path).read_bytes() if path else b""
    out, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        out.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def write_replay(path: Path, responses: list[bytes]) -> None:
    """Writes what `read_replay` reads."""
    path.write_bytes(b"".join(len(r).to_bytes(4, "big") + r for r in responses))


# -- requests -----------------------------------------------------------------------------

NAMES = [
    "Alice",
    "Bob",
    "Carol",
    "Dave",
    "Erin",
    "Frank",
    "Grace",
    "Heidi",
    "Ivan",
    "Judy",
    "Ken",
    "Lena",
    "Mallory",
    "Niaj",
    "Olivia",
    "Peggy",
]


def _pb() -> tuple[Any, Any]:
    from roundtable.v1 import orchestrator_service_pb2 as pb
    from roundtable.v1 import snapshot_pb2 as spb

    return pb, spb


def model_ref(provider: str = "offline", model: str = "m", base_url: str = "", timeout_ms: int = 0):
    """A ModelRef to one target."""
    _, spb = _pb()
    return spb.ModelRef(
        target=spb.ModelTarget(provider=provider, model=model, base_url=base_url),
        timeout_ms=timeout_ms,
    )


def offline_ref(*, latency_ms: float = 0, token_delay_ms: float = 0, timeout_ms: int = 0):
    """The built-in offline model with latency knobs (see roundtable.models.offline)."""
    query = []
    if latency_ms:
        query.append(f"latency_ms={latency_ms:g}")
    if token_delay_ms:
        query.append(f"token_delay_ms={token_delay_ms:g}")
    base_url = "offline:?" + "&".join(query) if query else ""
    return model_ref("offline", "bench", base_url, timeout_ms)


def history(n: int) -> list[Any]:
    """n history messages, user and assistant alternating, ~90 bytes each."""
    _, spb = _pb()
    out = []
    for i in range(n):
        user = i % 2 == 0
        out.append(
            spb.HistoryMessage(
                message_id=f"h{i}",
                role=spb.MESSAGE_ROLE_USER if user else spb.MESSAGE_ROLE_ASSISTANT,
                member_id="" if user else "m0",
                content=f"message {i}: what do you think about the garden plan for next week?",
            )
        )
    return out


def turn_request(
    text: str,
    *,
    run_id: str,
    thread_id: str = "",
    tenant: str = "bench",
    members: int = 4,
    kind: str = "group",
    member_model: Any = None,
    default_model: Any = None,
    history_messages: int = 0,
    max_speakers: int = 0,
    max_output_tokens: int = 0,
    delta_window_ms: int = 0,
    delta_max_bytes: int = 0,
):
    """A valid StartRunRequest: `members` members (m0..), the offline model unless told."""
    pb, spb = _pb()
    roster = [
        spb.Member(
            member_id=f"m{i}",
            display_name=NAMES[i % len(NAMES)] + ("" if i < len(NAMES) else str(i)),
            persona=f"{NAMES[i % len(NAMES)]} speaks plainly and briefly.",
        )
        for i in range(members)
    ]
    if member_model is not None:
        for m in roster:
            m.model.CopyFrom(member_model)
    session = spb.Session(
        session_id="bench-session",
        kind=spb.SESSION_KIND_SINGLE if kind == "single" else spb.SESSION_KIND_GROUP,
        primary_member_id="m0",
    )
    if default_model is not None:
        session.default_model.CopyFrom(default_model)
    if max_speakers or max_output_tokens:
        session.budgets.CopyFrom(
            spb.Budgets(max_speakers=max_speakers, max_output_tokens=max_output_tokens)
        )
    request = pb.StartRunRequest(
        context=spb.RunContext(
            run_id=run_id,
            thread_id=thread_id or f"t-{run_id}",
            request_id=f"r-{run_id}",
            tenant=tenant,
        ),
        snapshot=spb.Snapshot(
            session=session,
            members=roster,
            history=history(history_messages),
            user_turn=spb.UserTurn(text=text),
        ),
    )
    if delta_window_ms or delta_max_bytes:
        request.options.CopyFrom(
            pb.RunOptions(delta_window_ms=delta_window_ms, delta_max_bytes=delta_max_bytes)
        )
    return request


def with_run_id(request: Any, run_id: str) -> Any:
    """A copy of a request with a new run id (and thread), everything else the same."""
    copy = type(request)()
    copy.CopyFrom(request)
    copy.context.run_id = run_id
    copy.context.thread_id = f"t-{run_id}"
    copy.context.request_id = f"r-{run_id}"
    return copy


COUNT_OFF = "大家报数！"


def kind_of(event: Any) -> str:
    """The payload kind of a RunEvent, or of a domain event's envelope (in process)."""
    if hasattr(event, "WhichOneof"):
        return event.WhichOneof("payload") or ""
    from roundtable.codec.events import kind_of as domain_kind

    return domain_kind(event.event)


# -- processes ----------------------------------------------------------------------------

_SERVING = re.compile(r"roundtable serving on [\d.]+:(\d+)")
_RAW = re.compile(r"raw stream on [\d.]+:(\d+)")


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_bytes(pid: int) -> int:
    """VmRSS of a process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Server:
    """`roundtable serve` (or bench/flood_server.py) on a free loopback port; logs to a file.

    Its store is the SQLite file `db` unless `store` names another (a Postgres DSN).
    """

    def __init__(
        self,
        db: Path,
        log: Path,
        *args: str,
        script: Path | None = None,
        env: dict[str, str] | None = None,
        store: str = "",
    ) -> None:
        self.env = env or {}
        self.db = db
        self.store = store or f"sqlite:///{db}"
        self.log_path = log
        self.args = args
        self.script = script
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.raw_port = 0
        self.started_in_s = 0.0

    async def start(self, wait_s: float = 60.0) -> Server:
        entry = [str(self.script)] if self.script else ["-m", "roundtable.cli", "serve"]
        self._log = self.log_path.open("wb")
        t0 = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *entry,
            "--listen",
            "127.0.0.1:0",
            "--store",
            self.store,
            *self.args,
            stdout=self._log,
            stderr=self._log,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        async with asyncio.timeout(wait_s):
            while True:
                text = self.log_path.read_text("utf-8", "replace")
                match = _SERVING.search(text)
                if match and (self.script is None or _RAW.search(text)):
                    self.port = int(match.group(1))
                    raw = _RAW.search(text)
                    self.raw_port = int(raw.group(1)) if raw else 0
                    self.started_in_s = time.perf_counter() - t0
                    return self
                if self.proc.returncode is not None:
                    raise RuntimeError(f"server exited: {text[-4000:]}")
                await asyncio.sleep(0.02)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def channel(self, **options: Any):
        import grpc

        opts = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        return grpc.aio.insecure_channel(self.address, options=opts)

    def stub(self, channel: Any):
        from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc

        return pb_grpc.OrchestratorServiceStub(channel)

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def rss_bytes(self) -> int:
        return proc_rss_bytes(self.pid)

    def kill(self) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def wait(self, wait_s: float = 60.0) -> int:
        assert self.proc is not None
        async with asyncio.timeout(wait_s):
            code = await self.proc.wait()
        with contextlib.suppress(Exception):
            self._log.close()
        return code

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await self.wait(15)
        except TimeoutError:
            self.kill()
            await self.wait()

    def audit(self) -> list[dict[str, Any]]:
        """The audit records (one JSON line per model attempt) this process logged."""
        records = []
        for line in self.log_path.read_text("utf-8", "replace").splitlines():
            if "roundtable.audit" in line:
                rest = line.split("roundtable.audit", 1)[1]
                if "{" in rest:
                    with contextlib.suppress(ValueError):
                        records.append(json.loads(rest[rest.index("{") :]))
        return records


# -- machine ------------------------------------------------------------------------------


class BatchProcess:
    """A client in another process that runs batches of turns on command.

    It stays up between batches: `batch(n)` writes n on its stdin and reads back the mean
    milliseconds per turn it measured itself, so its batches can be interleaved with the
    suite's own (`suite.interleaved`). A line starting with "error" fails the batch.
    """

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.argv = argv
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> BatchProcess:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        return self

    async def batch(self, n: int) -> float:
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"{n}\n".encode())
        await self.proc.stdin.drain()
        line = (await self.proc.stdout.readline()).decode().strip()
        if not line or line.startswith("error"):
            raise RuntimeError(f"{self.name}: {line or 'exited'}")
        return float(line)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            await self.proc.wait()


class GoClient:
    """bench/goclient: the turn driven by a Go gRPC client, as the product's Go gateway would.

    Built with the Go toolchain on first use (its build cache makes later builds instant);
    `GoClient.available()` is False where there is no `go`, and the variant is left out.
    `client(...)` is a `BatchProcess` running n sequential turns per batch.
    """

    SOURCE = BENCH / "goclient"

    @staticmethod
    def available() -> bool:
        return shutil.which("go") is not None

    @classmethod
    async def build(cls, work: Path) -> Path:
        binary = work / "goclient"
        proc = await asyncio.create_subprocess_exec(
            "go", "build", "-o", str(binary), ".", cwd=cls.SOURCE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"go build bench/goclient failed: {out.decode()[-2000:]}")
        return binary

    @staticmethod
    def client(binary: Path, address: str, request: Any, work: Path, prefix: str) -> BatchProcess:
        request_path = work / "goclient-request.bin"
        request_path.write_bytes(request.SerializeToString())
        argv = [str(binary), "-addr", address, "-request", str(request_path), "-prefix", prefix]
        return BatchProcess("goclient", argv)


PEER_PYTHON = BENCH / ".venv-peer" / "bin" / "python"


def autogen_peer() -> BatchProcess | None:
    """B7's AutoGen peer in batch mode (`peer_autogen.py --serve`), when its venv exists.

    BENCH_PEER_PYTHON names another interpreter; set empty (`bench/run.sh --skip-peer`), none.
    """
    configured = os.environ.get("BENCH_PEER_PYTHON")
    if configured == "":
        return None
    python = Path(configured or PEER_PYTHON)
    if not python.exists():
        return None
    return BatchProcess("autogen peer", [str(python), str(BENCH / "peer_autogen.py"), "--serve"])


def cpu_idle_info() -> str:
    """How an idle CPU waits here: the cpuidle driver and, in a KVM guest, its halt polling.

    A served turn waits for its client and for gRPC's poller dozens of times; where the
    guest does not poll before it halts (`guest_halt_poll_ns` 0), every such wait halts the
    vCPU and its wake-up goes through the host (bench/README.md, "Served and in process").
    In-process figures never wait.
    """

    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return ""

    driver = read("/sys/devices/system/cpu/cpuidle/current_driver") or "unknown"
    out = f"cpuidle {driver}"
    poll_ns = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    if poll_ns:
        out += f", guest_halt_poll_ns {poll_ns}"
    return out


def machine_info() -> dict[str, Any]:
    """Cores, memory, CPU model, how idle CPUs wait, versions, date."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu_model": cpu,
        "cpu_idle": cpu_idle_info(),
        "kernel": os.uname().release,
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
        "python": sys.version.split()[0],
        "versions": {
            name: version(name)
            for name in (
                "roundtable",
                "langgraph",
                "langgraph-checkpoint-sqlite",
                "langchain-core",
                "grpcio",
                "protobuf",
                "aiosqlite",
            )
        },
        "commit": _commit(),
    }


def _commit() -> str:
    """The checked-out commit, read from .git files (no git command)."""
    git = ROOT / ".git"
    try:
        if git.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
            git = Path(git.read_text().split("gitdir:", 1)[1].strip())
        common = git
        if (git / "commondir").exists():  # branches and packed refs live in the main .git
            common = (git / (git / "commondir").read_text().strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:12]
        ref = head[5:]
        path = common / ref
        if path.exists():
            return path.read_text().strip()[:12]
        for line in (common / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:12]
    except OSError:
        pass
    return "unknown"
