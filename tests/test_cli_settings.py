"""The `roundtable` command and its settings, as an operator meets them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from roundtable.api.auth import read_token_file
from roundtable.server import running_server
from roundtable.settings import Settings, load_settings


def roundtable(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "roundtable.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_configuration_mistake_is_one_line_and_exit_code_2() -> None:
    done = roundtable("serve", "--listen", "0.0.0.0:0")  # no caller authentication
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("roundtable serve: error: refusing")


def test_help_goes_to_stdout() -> None:
    done = roundtable("--help")
    assert done.returncode == 0 and "roundtable serve" in done.stdout


@pytest.mark.parametrize("word", ["ture", "maybe"])
def test_a_misspelt_boolean_is_refused_not_read_as_false(word: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        load_settings(["--allow-unauthenticated", word])
    assert exit_.value.code == 2
    assert load_settings(["--allow-unauthenticated", "no"]).allow_unauthenticated is False
    assert load_settings(["--allow-unauthenticated", "TRUE"]).allow_unauthenticated is True


def test_the_store_password_is_never_shown() -> None:
    settings = Settings(store="postgresql://rt:S3cretPw@db.internal:5432/rt?sslpassword=k3y")
    assert settings.store_for_logs == "postgresql://db.internal:5432/rt"
    assert "S3cretPw" not in repr(settings)


async def test_serves_on_an_ipv6_address() -> None:
    settings = Settings(listen="[::1]:0", store="sqlite:///:memory:")
    async with (
        running_server(settings) as running,
        grpc.aio.insecure_channel(f"[::1]:{running.port}") as channel,
    ):
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_token_file_entry_with_stray_whitespace_still_matches(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"s3cret-token\n": ["acme"]}), encoding="utf-8")
    assert read_token_file(str(path)) == {"s3cret-token": frozenset({"acme"})}


def test_tokens_over_plaintext_beyond_loopback_are_warned_about(caplog) -> None:
    from roundtable.api.tls import check_listen_address

    check_listen_address(Settings(listen="0.0.0.0:50051"), authenticated=True)
    assert "bearer tokens travel in cleartext" in caplog.text
    caplog.clear()
    check_listen_address(Settings(listen="127.0.0.1:50051"), authenticated=True)
    assert "cleartext" not in caplog.text
