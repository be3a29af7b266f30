"""Fixtures of the Go gateway tests: the example, built once per session."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway-go"


@pytest.fixture(scope="session")
def gateway_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/gateway-go, built once per session."""
    go = shutil.which("go")
    if go is None:
        pytest.fail("the Go toolchain is required for tests/gateway (go not found on PATH)")
    out = tmp_path_factory.mktemp("gateway-go") / "gateway-go"
    try:
        built = subprocess.run(
            [go, "build", "-buildvcs=false", "-o", str(out), "./"],
            cwd=EXAMPLE,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("go build of examples/gateway-go took more than 600 s")
    assert built.returncode == 0, f"go build failed:\n{built.stdout}\n{built.stderr}"
    return out
