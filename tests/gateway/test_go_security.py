"""The Go gateway against a secured sidecar: a bearer token over TLS, and mutual TLS.

The gateway reads its token from a file (`-token-file`) and sends it as per-RPC
credentials; `-tls-ca` makes the channel TLS, `-tls-cert`/`-tls-key` present a client
certificate whose common name the sidecar maps to tenants.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import pytest
from support.certs import CertificateAuthority
from support.process import ServerProcess

from .test_go_gateway import ROSTER, _env, run_gateway

pytestmark = [pytest.mark.go, pytest.mark.e2e]


async def _sidecar(tmp_path: Path, name: str, *args: str) -> ServerProcess:
    return await ServerProcess(tmp_path / f"{name}.db", tmp_path / f"{name}.log", *args).start()


async def _run_expecting_failure(binary: Path, server: ServerProcess, *args: str) -> dict:
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        "-target",
        server.address,
        "-db",
        str(server.log_path.with_suffix(".gateway.json")),
        "-timeout",
        "30s",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode != 0
    (line,) = [x for x in out.decode().splitlines() if x.startswith("SUMMARY ")]
    return json.loads(line.removeprefix("SUMMARY "))


async def test_the_gateway_sends_its_token_over_tls(gateway_binary: Path, tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path)
    cert = ca.issue("roundtable", server=True)
    token = f"tok-{secrets.token_urlsafe(24)}"
    token_file = tmp_path / "gateway.token"
    token_file.write_text(token + "\n")
    server = await _sidecar(
        tmp_path,
        "tls",
        "--tls-cert-file",
        str(cert.cert_file),
        "--tls-key-file",
        str(cert.key_file),
        "--auth-tokens",
        f"{token}=tenant-a",
    )
    try:
        tls = ("-tls-ca", str(ca.root.cert_file), "-tenant", "tenant-a")
        run = await run_gateway(
            gateway_binary,
            server,
            tmp_path / "gateway.json",
            *tls,
            "-token-file",
            str(token_file),
            "-run-id",
            "gw-tls-1",
            "-text",
            "大家报数！",
        )
        assert run.summary["status"] == "completed"
        assert [r["member_id"] for r in run.summary["replies"]] == ROSTER

        refused = await _run_expecting_failure(
            gateway_binary, server, *tls, "-run-id", "gw-tls-2", "-text", "大家报数！"
        )
        assert "Unauthenticated" in refused["error"] and refused["replies"] == []
    finally:
        await server.stop()
    assert token not in server.log_path.read_text(), "the token never reaches the log"


async def test_the_gateway_presents_its_certificate(gateway_binary: Path, tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path)
    cert = ca.issue("roundtable", server=True)
    gateway = ca.issue("gateway-1")
    server = await _sidecar(
        tmp_path,
        "mtls",
        "--tls-cert-file",
        str(cert.cert_file),
        "--tls-key-file",
        str(cert.key_file),
        "--tls-client-ca-file",
        str(ca.root.cert_file),
        "--auth-certificate-tenants",
        "gateway-1=tenant-a",
    )
    try:
        run = await run_gateway(
            gateway_binary,
            server,
            tmp_path / "gateway.json",
            "-tls-ca",
            str(ca.root.cert_file),
            "-tls-cert",
            str(gateway.cert_file),
            "-tls-key",
            str(gateway.key_file),
            "-tenant",
            "tenant-a",
            "-run-id",
            "gw-mtls-1",
            "-text",
            "大家报数！",
        )
        assert run.summary["status"] == "completed"
        assert len(run.summary["replies"]) == 4
    finally:
        await server.stop()
