"""The contract's guard rails: `buf breaking` catches a removed field; `buf lint` passes.

buf runs through npx at the version the Makefile pins, on copies of the repository's
layout (buf.yaml + proto/) in a temporary directory, so the real tree is never touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BUF_VERSION = "1.75.0"
# The first run downloads buf through npx.
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def buf() -> list[str]:
    """The command that runs the pinned buf."""
    npx = shutil.which("npx")
    if npx is None:
        message = "npx is missing: install Node.js (buf runs as npx @bufbuild/buf)"
        if os.environ.get("ROUNDTABLE_ALLOW_MISSING_TOOLS") == "1":
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    return [npx, "--yes", f"@bufbuild/buf@{BUF_VERSION}"]


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env={**os.environ, "BUF_LOG_FORMAT": "text", "NO_COLOR": "1"},
    )


def copy_contract(target: Path) -> Path:
    """Copies buf.yaml and proto/ (the module buf.yaml names) into `target`."""
    target.mkdir(parents=True)
    shutil.copy2(ROOT / "buf.yaml", target / "buf.yaml")
    shutil.copytree(ROOT / "proto", target / "proto")
    return target


def remove_field(proto: Path, message: str, declaration: str) -> None:
    """Deletes one field (and its comment lines) from one message of a .proto file."""
    text = proto.read_text()
    block = re.search(rf"^message {message} \{{\n.*?^\}}\n", text, flags=re.M | re.S)
    assert block is not None, f"message {message} not found in {proto}"
    field = re.compile(rf"(?:^ +//.*\n)*^ +{re.escape(declaration)}\n", flags=re.M)
    body, removed = field.subn("", block.group(0))
    assert removed == 1, f"{declaration!r} not found once in message {message}"
    proto.write_text(text[: block.start()] + body + text[block.end() :])


def violations(output: str) -> list[dict[str, object]]:
    """The JSON lines of `--error-format json`."""
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_breaking_fails_on_a_removed_field(buf, tmp_path: Path) -> None:
    copy_contract(tmp_path / "before")
    after = copy_contract(tmp_path / "after")
    events = after / "proto" / "roundtable" / "v1" / "events.proto"
    remove_field(events, "AssistantFinal", "string content = 4;")

    result = run(
        [*buf, "breaking", "after", "--against", "before", "--error-format", "json"], tmp_path
    )

    assert result.returncode != 0, result.stdout + result.stderr
    found = violations(result.stdout)
    assert len(found) == 1, result.stdout + result.stderr
    assert found[0]["type"] == "FIELD_NO_DELETE"
    assert str(found[0]["path"]).endswith("roundtable/v1/events.proto")
    message = str(found[0]["message"])
    assert '"content"' in message and '"AssistantFinal"' in message, message

    text = run([*buf, "breaking", "after", "--against", "before"], tmp_path)
    assert text.returncode != 0
    assert 'name "content" on message "AssistantFinal" was deleted' in text.stdout


def test_breaking_passes_on_an_unchanged_contract(buf, tmp_path: Path) -> None:
    copy_contract(tmp_path / "before")
    copy_contract(tmp_path / "after")

    result = run([*buf, "breaking", "after", "--against", "before"], tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_lint_passes_on_the_real_contract(buf) -> None:
    result = run([*buf, "lint"], ROOT)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""
