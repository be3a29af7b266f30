"""The harness chain, layer by layer, with a provider that fails on cue."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import fields, replace

import pytest
from roundtable.domain.errors import CircuitOpen, ModelRejected, ModelUnavailable
from roundtable.domain.events import TokenUsage
from roundtable.domain.snapshot import ModelRef, ModelTarget
from roundtable.harness.breaker import BreakerBoard, BreakerState
from roundtable.harness.chain import Harness
from roundtable.harness.policies import BreakerPolicy, HarnessPolicy, RetryPolicy, TimeoutPolicy
from roundtable.harness.request import CallMeta, ModelRequest
from roundtable.models.base import ChatCall, ChatMessage, ChatResult

META = CallMeta(thread_id="t", run_id="r", request_id="q", tenant="x", caller_node="dispatch")
PRIMARY = ModelTarget(provider="fake", model="primary")
BACKUP = ModelTarget(provider="fake", model="backup")


class FlakyProvider:
    """Fails per target following a script of exceptions (None means succeed)."""

    name = "fake"

    def __init__(self, script: dict[str, list[Exception | None]]) -> None:
        self.script = script
        self.calls: list[str] = []

    async def complete(self, target, call, *, api_key, on_text) -> ChatResult:
        self.calls.append(target.model)
        queue = self.script.get(target.model, [])
        outcome = queue.pop(0) if queue else None
        if outcome is not None:
            raise outcome
        return ChatResult(text="ok", usage=TokenUsage(3, 1), model=f"fake/{target.model}")


def harness(provider: FlakyProvider) -> Harness:
    policy = HarnessPolicy(
        timeout=TimeoutPolicy(default_s=1.0),
        retry=RetryPolicy(max_retries=2, initial_backoff_s=0.001),
    )
    return Harness({"fake": provider}, policy=policy)


def request(*fallbacks: ModelTarget) -> ModelRequest:
    return ModelRequest(
        ref=ModelRef(target=PRIMARY, fallbacks=fallbacks),
        call=ChatCall(messages=(ChatMessage("user", "hi"),)),
        meta=META,
    )


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "roundtable.audit"]


async def test_500_twice_then_200_succeeds_with_three_audit_lines(caplog) -> None:
    caplog.set_level(logging.INFO, logger="roundtable.audit")
    provider = FlakyProvider(
        {"primary": [ModelUnavailable("HTTP 500"), ModelUnavailable("HTTP 500")]}
    )
    result = await harness(provider).call(request())
    assert result.text == "ok" and provider.calls == ["primary"] * 3
    lines = audit_lines(caplog)
    assert [(line["attempt"], line["status"]) for line in lines] == [
        (1, "error"),
        (2, "error"),
        (3, "success"),
    ]
    assert set(lines[0]) == {
        "thread_id",
        "run_id",
        "request_id",
        "tenant",
        "caller_node",
        "target",
        "provider",
        "attempt",
        "status",
        "latency_ms",
        "input_tokens",
        "output_tokens",
        "error_code",
    }
    assert lines[2]["target"] == "llm:fake:primary" and lines[2]["input_tokens"] == 3


async def test_a_4xx_is_not_retried() -> None:
    provider = FlakyProvider({"primary": [ModelRejected("HTTP 400")]})
    with pytest.raises(ModelRejected):
        await harness(provider).call(request(BACKUP))
    assert provider.calls == ["primary"]


async def test_timeouts_are_retried_then_fail_over(caplog) -> None:
    caplog.set_level(logging.INFO, logger="roundtable.audit")

    class Slow(FlakyProvider):
        async def complete(self, target, call, *, api_key, on_text):
            if target.model == "primary":
                self.calls.append("primary")
                await asyncio.sleep(10)
            return await super().complete(target, call, api_key=api_key, on_text=on_text)

    provider = Slow({})
    h = Harness(
        {"fake": provider},
        policy=HarnessPolicy(
            timeout=TimeoutPolicy(default_s=0.05), retry=RetryPolicy(initial_backoff_s=0.001)
        ),
    )
    result = await h.call(request(BACKUP))
    assert result.model == "fake/backup"
    assert provider.calls == ["primary"] * 3 + ["backup"]
    assert [line["status"] for line in audit_lines(caplog)] == ["timeout"] * 3 + ["success"]


async def test_breaker_opens_skips_the_target_and_a_half_open_probe_closes_it() -> None:
    now = [0.0]
    provider = FlakyProvider({"primary": [ModelUnavailable("HTTP 503")] * 6})
    h = Harness(
        {"fake": provider},
        policy=HarnessPolicy(retry=RetryPolicy(initial_backoff_s=0.001)),
        breakers=BreakerBoard(
            BreakerPolicy(failure_threshold=2, cooldown_s=30.0), clock=lambda: now[0]
        ),
    )
    # Each call makes 3 attempts on primary (all fail) and then succeeds on the backup.
    for _ in range(2):
        assert (await h.call(request(BACKUP))).model == "fake/backup"
    breaker = h.breakers.get("llm:fake:primary")
    assert breaker.state is BreakerState.OPEN
    provider.calls.clear()
    assert (await h.call(request(BACKUP))).model == "fake/backup"
    assert provider.calls == ["backup"], "an open breaker skips its target"
    with pytest.raises(CircuitOpen):
        await h.call(request())
    now[0] += 31.0
    provider.script["primary"] = []
    assert (await h.call(request(BACKUP))).model == "fake/primary"
    assert breaker.state is BreakerState.CLOSED


def test_a_request_bound_for_an_attempt_keeps_every_other_field() -> None:
    # with_attempt spells the fields out (for speed): a field added to ModelRequest later
    # must not be dropped on the way through failover and retry.
    original = replace(
        request(ModelTarget(provider="offline", model="backup")),
        credentials={"k": "v"},
        on_text=lambda _text: None,
        on_restart=lambda: None,
    )
    target = ModelTarget(provider="offline", model="other")
    sink = lambda _text: None  # noqa: E731
    bound = original.with_attempt(target=target, attempt=3, on_text=sink)
    changed = {"target", "attempt", "on_text"}
    for f in fields(ModelRequest):
        if f.name not in changed:
            assert getattr(bound, f.name) is getattr(original, f.name), f.name
    assert (bound.target, bound.attempt, bound.on_text) == (target, 3, sink)
