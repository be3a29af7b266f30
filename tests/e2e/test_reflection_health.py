"""Third-party clients, grpcurl and buf curl, find everything through reflection and health
alone (reflection v1alpha and v1).

grpcurl has no copy of our .proto files: `list`, `describe` and the JSON StartRun all work
from the server's reflection service. `make tools` installs grpcurl into .tools/bin; these
tests never install it. Without it they fail, unless ROUNDTABLE_ALLOW_MISSING_TOOLS=1,
which turns the failure into a skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GRPCURL = ROOT / ".tools" / "bin" / "grpcurl"
TIMEOUT_S = 60.0
SERVICE = "roundtable.v1.OrchestratorService"


@dataclass(frozen=True)
class Result:
    """What one grpcurl run did."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def grpcurl() -> Path:
    """The grpcurl binary `make tools` installs."""
    if not (GRPCURL.is_file() and os.access(GRPCURL, os.X_OK)):
        message = (
            f"grpcurl is missing at {GRPCURL}: run `make tools` (it runs `GOBIN=$PWD/.tools/bin "
            "go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3`)"
        )
        if os.environ.get("ROUNDTABLE_ALLOW_MISSING_TOOLS") == "1":
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    return GRPCURL


async def run_grpcurl(binary: Path, *args: str) -> Result:
    """Runs grpcurl (or another client binary) with a timeout; returns its exit code and
    output."""
    process = await asyncio.create_subprocess_exec(
        str(binary),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(TIMEOUT_S):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return Result(process.returncode, stdout.decode(), stderr.decode())


def json_stream(text: str) -> list[dict[str, Any]]:
    """grpcurl prints one pretty-printed JSON object per response message, back to back."""
    decoder = json.JSONDecoder()
    objects: list[dict[str, Any]] = []
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return objects
        obj, position = decoder.raw_decode(text, position)
        objects.append(obj)


def payload_of(event: dict[str, Any], name: str) -> dict[str, Any] | None:
    """An event's payload by proto field name, whichever JSON naming grpcurl used."""
    camel = name.split("_")[0] + "".join(part.title() for part in name.split("_")[1:])
    return event.get(name, event.get(camel))


async def test_list_shows_our_service_and_health(server, grpcurl) -> None:
    result = await run_grpcurl(grpcurl, "-plaintext", server.address, "list")

    assert result.returncode == 0, result.stderr
    services = result.stdout.split()
    assert SERVICE in services
    assert "grpc.health.v1.Health" in services


@pytest.mark.parametrize(
    ("symbol", "fields"),
    [
        ("roundtable.v1.StartRunRequest", ["context", "snapshot", "credentials", "options"]),
        ("roundtable.v1.RunEvent", ["seq", "run_started", "assistant_final", "run_completed"]),
    ],
)
async def test_describe_shows_the_fields(server, grpcurl, symbol, fields) -> None:
    result = await run_grpcurl(grpcurl, "-plaintext", server.address, "describe", symbol)

    assert result.returncode == 0, result.stderr
    assert f"{symbol} is a message" in result.stdout
    for field in fields:
        assert f" {field} = " in result.stdout, (field, result.stdout)


async def test_health_check_of_our_service_is_serving(server, grpcurl) -> None:
    result = await run_grpcurl(
        grpcurl,
        "-plaintext",
        "-d",
        json.dumps({"service": SERVICE}),
        server.address,
        "grpc.health.v1.Health/Check",
    )

    assert result.returncode == 0, result.stderr
    assert json_stream(result.stdout) == [{"status": "SERVING"}]


async def test_start_run_from_json_streams_a_count_off(server, grpcurl) -> None:
    roster = [("a", "Alice"), ("b", "Bob"), ("c", "Carol"), ("d", "Dave")]
    request = {
        "context": {
            "runId": "grpcurl-run-1",
            "threadId": "grpcurl-thread",
            "requestId": "grpcurl-req-1",
            "tenant": "tenant-grpcurl",
        },
        "snapshot": {
            "session": {"kind": "SESSION_KIND_GROUP", "primaryMemberId": "a"},
            "members": [{"memberId": m, "displayName": name} for m, name in roster],
            "userTurn": {"text": "报数"},
        },
    }

    result = await run_grpcurl(
        grpcurl,
        "-plaintext",
        "-d",
        json.dumps(request, ensure_ascii=False),
        server.address,
        f"{SERVICE}/StartRun",
    )

    assert result.returncode == 0, result.stderr
    events = [response["event"] for response in json_stream(result.stdout)]
    finals = [f for e in events if (f := payload_of(e, "assistant_final")) is not None]
    assert len(finals) == 4
    assert [payload_of(f, "member_id") for f in finals] == ["a", "b", "c", "d"]
    assert [f["content"] for f in finals] == ["1!", "2!", "3!", "4!"]
    assert payload_of(events[0], "run_started") is not None
    assert payload_of(events[-1], "run_completed") is not None
    assert {e.get("runId", e.get("run_id")) for e in events} == {"grpcurl-run-1"}


@pytest.mark.parametrize("protocol", ["grpc-v1", "grpc-v1alpha"])
async def test_a_strict_client_of_either_reflection_version_finds_and_calls_the_service(
    server, protocol: str
) -> None:
    # buf curl with one reflection protocol only (its default tries v1, then v1alpha).
    npx = shutil.which("npx")
    if npx is None:
        pytest.fail("npx is missing: install Node.js (buf runs as npx @bufbuild/buf)")
    base = ["--yes", "@bufbuild/buf@1.75.0", "curl", "--protocol", "grpc"]
    base += ["--http2-prior-knowledge", "--reflect-protocol", protocol]
    url = f"http://{server.address}"
    listed = await run_grpcurl(Path(npx), *base, "--list-methods", url)
    assert listed.returncode == 0, listed.stderr
    assert f"{SERVICE}/StartRun" in listed.stdout.splitlines()
    called = await run_grpcurl(
        Path(npx),
        *base,
        "-d",
        '{"run_id": "no-such-run", "tenant": "t"}',
        f"{url}/{SERVICE}/GetRun",
    )
    assert called.returncode != 0 and '"code": "not_found"' in called.stderr, called.stderr
