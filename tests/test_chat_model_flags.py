"""`roundtable chat --model provider:model --base-url URL --api-key-file FILE`: a real model
without hand-writing a snapshot, the key sent as a credential and never printed."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from roundtable.chat import (
    CLI_CREDENTIAL,
    ModelChoice,
    chat_snapshot,
    model_choice,
    parse_model,
    read_api_key,
)
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb
from support.openai_server import OpenAITestServer, Reply
from support.process import ServerProcess

KEY = "sk-chat-test-93b1c0ffee"


def args(**given: object) -> argparse.Namespace:
    values: dict[str, object] = {"model": None, "base_url": None, "api_key_file": None}
    values["timeout_ms"] = 0
    return argparse.Namespace(**{**values, **given})


def test_the_model_splits_at_the_first_colon() -> None:
    assert parse_model("openai:qwen3:8b") == ("openai", "qwen3:8b")
    for bad in ("gpt-4o", ":gpt", "openai:"):
        with pytest.raises(ValueError, match="provider:model"):
            parse_model(bad)


def test_the_key_comes_from_the_file_else_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(f"{KEY}\n", "utf-8")
    env = {"ROUNDTABLE_API_KEY": "from-roundtable", "OPENAI_API_KEY": "from-openai"}
    assert read_api_key(str(key_file), env) == KEY
    assert read_api_key(None, env) == "from-roundtable"
    assert read_api_key(None, {"OPENAI_API_KEY": "from-openai"}) == "from-openai"
    assert read_api_key(None, {}) == ""


def test_base_url_without_a_model_is_refused() -> None:
    with pytest.raises(ValueError, match="need --model"):
        model_choice(args(base_url="http://127.0.0.1:1/v1"), {})
    assert model_choice(args(), {"OPENAI_API_KEY": KEY}) is None, "no --model, no change"


def test_the_choice_becomes_the_default_model_and_the_key_a_credential() -> None:
    request = pb.StartRunRequest()
    request.snapshot.session.default_model.fallbacks.add(provider="offline", model="old")
    request.snapshot.session.default_model.temperature = 0.2
    choice = ModelChoice("openai", "smollm2", "http://127.0.0.1:8089/v1", KEY, timeout_ms=9000)
    choice.apply(request)

    ref = request.snapshot.session.default_model
    assert (ref.target.provider, ref.target.model) == ("openai", "smollm2")
    assert ref.target.base_url == "http://127.0.0.1:8089/v1"
    assert ref.target.credential_ref == CLI_CREDENTIAL and not ref.fallbacks
    assert ref.timeout_ms == 9000 and ref.temperature == 0.2, "the snapshot's sampling stays"
    assert dict(request.credentials) == {CLI_CREDENTIAL: KEY}
    assert KEY not in repr(choice) and KEY not in str(request.snapshot)


async def test_chat_reaches_the_model_with_the_key_and_never_prints_it(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY, "utf-8")
    server = ServerProcess(tmp_path / "rt.db", tmp_path / "serve.log")
    async with OpenAITestServer() as model_server:
        model_server.script(Reply(text="Hello from the model."))
        await server.start()
        try:
            chat = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "roundtable.cli",
                "chat",
                "--target",
                server.address,
                "--kind",
                "single",
                "--model",
                "openai:tiny-test",
                "--base-url",
                model_server.base_url,
                "--api-key-file",
                str(key_file),
                "hello",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(chat.communicate(), 60)
        finally:
            await server.stop()

    printed = out.decode() + err.decode()
    assert chat.returncode == 0, printed
    assert "Lin: Hello from the model." in printed
    speaker = model_server.requests[0]
    assert speaker.body["model"] == "tiny-test"
    assert speaker.authorization == f"Bearer {KEY}"
    assert KEY not in printed
    assert KEY not in (tmp_path / "serve.log").read_text("utf-8")


def test_kind_replaces_the_kind_of_a_snapshot_file_and_text_its_user_turn(
    tmp_path: Path,
) -> None:
    path = tmp_path / "snapshot.json"
    example = Path(__file__).parents[1] / "examples" / "llm-snapshot.json"
    path.write_text(example.read_text("utf-8"), "utf-8")
    as_written = chat_snapshot(str(path), "", None)
    assert as_written.session.kind == spb.SESSION_KIND_GROUP and as_written.user_turn.text
    single = chat_snapshot(str(path), "use weather for Paris", "single")
    assert single.session.kind == spb.SESSION_KIND_SINGLE
    assert single.user_turn.text == "use weather for Paris"
    assert single.members == as_written.members, "nothing else changes"
    assert chat_snapshot(None, "", "single").session.kind == spb.SESSION_KIND_SINGLE
    assert chat_snapshot(None, "", None).session.kind == spb.SESSION_KIND_GROUP


def test_a_snapshot_file_that_is_missing_or_no_snapshot_is_a_usage_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"bogus": 1}', "utf-8")
    for path, says in ((tmp_path / "missing.json", "No such file"), (bogus, '"bogus"')):
        with pytest.raises(ValueError, match=f"--snapshot {path}: .*{says}"):
            chat_snapshot(str(path), "hi", None)
        done = subprocess.run(
            [sys.executable, "-m", "roundtable.cli", "chat", "--snapshot", str(path), "hi"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        assert "Traceback" not in done.stderr
        assert f"roundtable chat: error: --snapshot {path}: " in done.stderr
