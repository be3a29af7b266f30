"""A real llama-server (scripts/llm.sh: llama.cpp's server, SmolLM2-135M-Instruct) for the
session, and a Roundtable server on SQLite for each test.

Run by `make test-llm`, which sets ROUNDTABLE_TEST_LLM=1; elsewhere (make test) every test
here is skipped with the reason, since the first build of llama-server takes ~12 minutes.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.llama_server import LlamaServer

ROOT = Path(__file__).resolve().parents[2]
LLM_SCRIPT = ROOT / "scripts" / "llm.sh"
ENABLE_VARIABLE = "ROUNDTABLE_TEST_LLM"


def _exports(text: str) -> dict[str, str]:
    """The variables of `export NAME=value` lines."""
    found = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = shlex.split(value)[0] if value else ""
    return found


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama-server on a free loopback port, its own state folder, stopped at the end."""
    if not os.environ.get(ENABLE_VARIABLE):
        pytest.skip(
            f"real-model tests run with `make test-llm` ({ENABLE_VARIABLE}=1): they build "
            "llama-server once (~12 min) and start it"
        )
    state = tmp_path_factory.mktemp("llama-server")
    env = {**os.environ, "ROUNDTABLE_LLM_STATE": str(state), "ROUNDTABLE_LLM_PORT": "0"}
    started = subprocess.run(
        [str(LLM_SCRIPT), "env"], env=env, capture_output=True, text=True, timeout=1800
    )
    if started.returncode != 0:
        pytest.fail(f"scripts/llm.sh env failed:\n{started.stderr}")
    exports = _exports(started.stdout)
    try:
        yield LlamaServer(
            base_url=exports["ROUNDTABLE_LLM_BASE_URL"],
            model=exports["ROUNDTABLE_LLM_MODEL"],
            log=state / "server.log",
        )
    finally:
        subprocess.run([str(LLM_SCRIPT), "stop"], env=env, timeout=60, check=False)


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    """SQLite only: these tests are about the model edge, and the model is the slow part."""
    yield f"sqlite:///{tmp_path / 'roundtable.db'}"
