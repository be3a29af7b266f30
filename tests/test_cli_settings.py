"""The `roundtable` command and its settings, as an operator meets them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
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


def _serve_in(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "roundtable.cli", "serve", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _listening_port(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    for line in proc.stdout:
        if "roundtable serving on" in line:
            return int(line.split("roundtable serving on ", 1)[1].split()[0].rsplit(":", 1)[1])
    raise AssertionError(f"server exited ({proc.wait()}) before serving")


def _health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    return answer.status


def test_the_default_store_serves_in_a_fresh_checkout(tmp_path: Path) -> None:
    # `make run` on a fresh clone: no ./var yet, the store's lock file lives in it.
    proc = _serve_in(tmp_path, "--listen", "127.0.0.1:0")
    try:
        assert _health(_listening_port(proc)) == health_pb2.HealthCheckResponse.SERVING
        assert (tmp_path / "var" / "roundtable.db").is_file()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_four_slashes_name_an_absolute_path_and_three_a_relative_one(tmp_path: Path) -> None:
    from roundtable.store.sqlite import sqlite_path

    assert sqlite_path("sqlite:////srv/rt.db") == Path("/srv/rt.db")
    assert sqlite_path("sqlite:///srv/rt.db") == Path("srv/rt.db")
    elsewhere = tmp_path / "abs" / "rt.db"
    proc = _serve_in(tmp_path, "--listen", "127.0.0.1:0", "--store", f"sqlite:///{elsewhere}")
    try:
        _listening_port(proc)
        assert elsewhere.is_file()
        assert not (tmp_path / str(elsewhere).lstrip("/")).exists()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "(four slashes)" in " ".join(roundtable("serve", "--help").stdout.split())


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "mysql://db/rt"])
def test_a_store_url_that_names_no_sqlite_file_is_one_line(url: str, tmp_path: Path) -> None:
    done = roundtable("serve", "--listen", "127.0.0.1:0", "--store", url)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("roundtable serve: error: store:")


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error `roundtable serve` printed, asserting it printed nothing else but warnings."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "WARNING" not in line]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("roundtable serve: error: --store ")
    return errors[0]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("a-folder/", "is a directory, not a database file"),
        ("a-folder", "is a directory, not a database file"),
        ("a-file/rt.db", "a-file is not a directory"),
        ("not-sqlite.db", "cannot open it: file is not a database"),
    ],
)
def test_a_sqlite_store_that_cannot_be_opened_is_one_line(
    name: str, says: str, tmp_path: Path
) -> None:
    # Before, each was a traceback (sqlite3.OperationalError: unable to open database file).
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "not-sqlite.db").write_bytes(b"not a SQLite file, just text " * 100)
    url = f"sqlite:///{tmp_path / name}{'/' if name.endswith('/') else ''}"
    line = _one_line_error(roundtable("serve", "--listen", "127.0.0.1:0", "--store", url))
    assert line.startswith(f"roundtable serve: error: --store {url}: ")
    assert says in line
    assert not (tmp_path / "a-folder.lock").exists()


def test_an_unreachable_postgres_store_is_one_line_at_once_without_its_password() -> None:
    # Before: a 30 s wait, then a traceback (psycopg_pool.PoolTimeout).
    started = time.monotonic()
    line = _one_line_error(
        roundtable(
            "serve", "--listen", "127.0.0.1:0", "--store", "postgresql://rt:S3cretPw@127.0.0.1:1/rt"
        )
    )
    assert time.monotonic() - started < 15
    assert line.startswith("roundtable serve: error: --store postgresql://127.0.0.1:1/rt: ")
    assert "cannot connect" in line and "Connection refused" in line
    assert "S3cretPw" not in line


def test_a_postgres_store_that_never_answers_fails_within_its_connect_timeout() -> None:
    # A server that accepts the connection and then says nothing (a hung host, a black-holed
    # proxy): libpq's own connect_timeout, in the DSN, bounds the wait.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        started = time.monotonic()
        store = f"postgresql://rt:S3cretPw@127.0.0.1:{port}/rt?connect_timeout=2"
        line = _one_line_error(roundtable("serve", "--listen", "127.0.0.1:0", "--store", store))
    assert time.monotonic() - started < 12
    assert "cannot connect" in line and "timeout" in line
    assert "S3cretPw" not in line


def test_a_port_in_use_is_refused_not_shared(tmp_path: Path) -> None:
    first = _serve_in(tmp_path, "--listen", "127.0.0.1:0", "--store", "sqlite:///first.db")
    try:
        port = _listening_port(first)
        done = subprocess.run(
            [sys.executable, "-m", "roundtable.cli", "serve", "--listen", f"127.0.0.1:{port}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        errors = [line for line in done.stderr.splitlines() if "WARNING" not in line]
        assert errors == [
            f"roundtable serve: error: --listen 127.0.0.1:{port}: cannot listen there: "
            "Address already in use"
        ]
        assert not (tmp_path / "var").exists()  # the store was never opened
        assert _health(port) == health_pb2.HealthCheckResponse.SERVING
    finally:
        first.terminate()
        first.wait(timeout=30)


def test_a_killed_server_can_be_restarted_on_its_port_at_once(tmp_path: Path) -> None:
    # A server killed with connections open leaves them in TIME-WAIT on its port for about a
    # minute; a restart on the same port (what a supervisor or a gateway's retry loop does)
    # must serve at once, as gRPC's own listener would, and not take those for a listener.
    first = _serve_in(tmp_path, "--listen", "127.0.0.1:0", "--store", "sqlite:///rt.db")
    port = _listening_port(first)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # open while it dies
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == (
            health_pb2.HealthCheckResponse.SERVING
        )
        first.kill()
        first.wait(timeout=30)
    second = _serve_in(tmp_path, "--listen", f"127.0.0.1:{port}", "--store", "sqlite:///rt.db")
    try:
        assert _listening_port(second) == port
        assert _health(port) == health_pb2.HealthCheckResponse.SERVING
    finally:
        second.terminate()
        second.wait(timeout=30)


def test_each_policy_flag_sets_its_policy_field_and_defaults_to_the_policys_own() -> None:
    from roundtable.api.limits import RequestLimits
    from roundtable.domain.limits import RunLimits
    from roundtable.domain.snapshot import Budgets
    from roundtable.harness.policies import HarnessPolicy

    defaults = load_settings([], env={})
    assert defaults.harness == HarnessPolicy()
    assert defaults.request_limits == RequestLimits()
    assert defaults.run_limits == RunLimits()
    assert defaults.budgets == Budgets()
    settings = load_settings(
        ["--model-timeout-seconds", "5", "--stream-buffer-events", "7", "--max-history", "9"],
        env={"ROUNDTABLE_DEFAULT_MAX_SPEAKERS": "3", "ROUNDTABLE_MODEL_MAX_RETRIES": "0"},
    )
    assert settings.harness.timeout.default_s == 5.0
    assert settings.harness.retry.max_retries == 0
    assert settings.run_limits.stream_buffer == 7
    assert settings.request_limits.max_history == 9
    assert settings.budgets.max_speakers == 3
    assert settings == Settings().with_values(
        model_timeout_seconds=5.0,
        model_max_retries=0,
        stream_buffer_events=7,
        max_history=9,
        default_max_speakers=3,
    )


def test_help_shows_each_flag_with_its_variable_and_default() -> None:
    text = " ".join(roundtable("serve", "--help").stdout.split())
    assert "--breaker-cooldown-seconds" in text
    assert "(env ROUNDTABLE_BREAKER_COOLDOWN_SECONDS; default 30.0; at least 0)" in text
    assert "(env ROUNDTABLE_DEFAULT_MAX_SPEAKERS; default 8; at least 1; at most 64)" in text


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--max-runs", "0"], {}, "--max-runs: must be at least 1, got '0'"),
        (["--max-members", "-1"], {}, "--max-members: must be at least 1, got '-1'"),
        ([], {"ROUNDTABLE_LEASE_SECONDS": "0"}, "--lease-seconds: must be at least 0.1"),
        (["--model-max-retries", "-3"], {}, "--model-max-retries: must be at least 0"),
        (["--stream-buffer-events", "0"], {}, "--stream-buffer-events: must be at least 1"),
        (["--log-level", "LOUD"], {}, "--log-level: expected DEBUG, INFO, WARNING"),
        ([], {"ROUNDTABLE_LOG_LEVEL": "debugx"}, "--log-level: expected DEBUG, INFO, WARNING"),
        (["--lease-seconds", "nan"], {}, "--lease-seconds: not a valid float: 'nan'"),
        ([], {"ROUNDTABLE_DEFAULT_RUN_TIMEOUT_SECONDS": "inf"}, "not a valid float: 'inf'"),
        # A default budget past what a request may ask for (outside testing: 2**32 output
        # tokens started a server whose every run failed INTERNAL, retryable).
        (
            ["--default-max-output-tokens", "4294967296"],
            {},
            "--default-max-output-tokens: must be at most 32768, got '4294967296'",
        ),
        (["--default-max-speakers", "65"], {}, "--default-max-speakers: must be at most 64"),
        (["--default-max-rounds", "9"], {}, "--default-max-rounds: must be at most 8"),
        (["--default-max-parallel-speakers", "17"], {}, "must be at most 16"),
        (["--default-run-timeout-seconds", "3601"], {}, "must be at most 3600"),
        (["--default-max-tool-calls-per-speaker", "33"], {}, "must be at most 32"),
        (["--default-approval-timeout-seconds", "2592001"], {}, "must be at most 2592000"),
    ],
)
def test_a_value_no_server_could_run_with_is_refused_at_start(
    argv: list[str], env: dict[str, str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, these started a server that refused every run (max-runs 0), or crashed with a
    # traceback (an unknown log level).
    with pytest.raises(SystemExit) as exit_:
        load_settings(argv, env)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
    assert (
        load_settings(["--max-runs", "1", "--model-max-retries", "0"], {}).run_limits.max_runs == 1
    )
    most = load_settings(["--default-max-output-tokens", "32768"], {})
    assert most.budgets.max_output_tokens == 32768


def test_a_setting_that_does_not_exist_is_refused() -> None:
    with pytest.raises(TypeError, match="no such setting: max_run"):
        Settings().with_values(max_run=1)
    with pytest.raises(SystemExit) as exit_:
        load_settings(["--max-runs", "many"])
    assert exit_.value.code == 2
