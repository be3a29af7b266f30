"""A real `roundtable serve` process for tests that kill, restart or signal it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import grpc
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc

_SERVING = re.compile(r"roundtable serving on [\d.]+:(\d+)")


class ServerProcess:
    """`roundtable serve` on a free port with a given database; stderr goes to a file."""

    def __init__(
        self, db: Path | str, log: Path, *extra_args: str, env: dict[str, str] | None = None
    ) -> None:
        """`db` is a SQLite file, or a full store URL (postgresql://...); `env` adds variables."""
        self.db = db
        self.env = env or {}
        self.log_path = log
        self.args = extra_args
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def start(self, wait_s: float = 30.0) -> ServerProcess:
        """Starts the process and waits until it says where it listens."""
        self._log = self.log_path.open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "roundtable.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            self.db if isinstance(self.db, str) else f"sqlite:///{self.db}",
            *self.args,
            stdout=self._log,
            stderr=self._log,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        async with asyncio.timeout(wait_s):
            while True:
                match = _SERVING.search(self.log_path.read_text("utf-8", "replace"))
                if match:
                    self.port = int(match.group(1))
                    return self
                if self.proc.returncode is not None:
                    raise RuntimeError(f"server exited: {self.log_path.read_text()}")
                await asyncio.sleep(0.05)

    @property
    def address(self) -> str:
        """host:port to dial."""
        return f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.aio.Channel:
        """A new channel to the server."""
        return grpc.aio.insecure_channel(self.address)

    def stub(self, channel: grpc.aio.Channel) -> pb_grpc.OrchestratorServiceStub:
        """The generated client on a channel."""
        return pb_grpc.OrchestratorServiceStub(channel)

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup, like a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM: the graceful stop."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    async def wait(self, wait_s: float = 30.0) -> int:
        """Waits for the process to exit; returns its exit code."""
        assert self.proc is not None
        async with asyncio.timeout(wait_s):
            code = await self.proc.wait()
        self._log.close()
        return code

    async def stop(self) -> None:
        """Ends the process if it still runs (SIGTERM, then SIGKILL after 3 s), and waits.

        The graceful stop lets the server write the log lines it still holds (it writes them
        in batches), so `audit()` afterwards sees every record; a server still draining a
        live run after 3 s is killed, as a test's leftover run is of no interest.
        """
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.terminate()
            try:
                await self.wait(3.0)
                return
            except TimeoutError:
                self.kill()
        await self.wait()

    def audit(self) -> list[dict[str, object]]:
        """The audit records this process wrote."""
        records = []
        for line in self.log_path.read_text("utf-8", "replace").splitlines():
            if " roundtable.audit " in line:
                records.append(json.loads(line.split(" roundtable.audit ", 1)[1]))
        return records
