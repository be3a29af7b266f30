"""Harness behaviour seen from a gateway: faults injected through the OpenAI-compatible
test server (real HTTP) and the offline model, over a real gRPC server."""

from __future__ import annotations

import asyncio
import json
import logging

import grpc
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, member, of_kind, start_request
from support.openai_server import Fail, OpenAITestServer, Reply


def openai_ref(
    base_url: str, model: str = "flaky", *fallbacks: spb.ModelTarget, timeout_ms: int = 0
) -> spb.ModelRef:
    return spb.ModelRef(
        target=spb.ModelTarget(provider="openai", model=model, base_url=base_url),
        fallbacks=list(fallbacks),
        timeout_ms=timeout_ms,
    )


def audit(caplog) -> list[dict]:
    """The speakers' audit records (memory proposals make calls of their own)."""
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "roundtable.audit"]
    return [r for r in records if r["caller_node"] == "dispatch"]


def single(text: str, ref: spb.ModelRef, run_id: str):
    return start_request(
        text, kind=spb.SESSION_KIND_SINGLE, members=[member("a", "Alice", model=ref)], run_id=run_id
    )


async def test_500_twice_then_200_succeeds_with_three_audit_lines(stub, caplog) -> None:
    caplog.set_level(logging.INFO, logger="roundtable.audit")
    async with OpenAITestServer() as model_server:
        model_server.script(Fail(status=500), Fail(status=500), Reply(text="third time lucky"))
        events = await collect(
            stub.StartRun(single("hi", openai_ref(model_server.base_url), "f-1"))
        )
    assert [f.content for f in finals(events)] == ["third time lucky"]
    lines = [line for line in audit(caplog) if line["run_id"] == "f-1"]
    assert [(line["attempt"], line["status"]) for line in lines] == [
        (1, "error"),
        (2, "error"),
        (3, "success"),
    ]
    assert len(model_server.requests) == 3


async def test_a_400_is_not_retried(stub, caplog) -> None:
    caplog.set_level(logging.INFO, logger="roundtable.audit")
    async with OpenAITestServer() as model_server:
        model_server.script(Fail(status=400))
        events = await collect(
            stub.StartRun(single("hi", openai_ref(model_server.base_url), "f-2"))
        )
    (failed,) = of_kind(events, "speaker_failed")
    assert failed.speaker_failed.code == "MODEL_REJECTED"
    assert len(model_server.requests) == 1
    assert [line["status"] for line in audit(caplog) if line["run_id"] == "f-2"] == ["error"]


async def test_a_timeout_is_retried_then_succeeds(stub, caplog) -> None:
    caplog.set_level(logging.INFO, logger="roundtable.audit")
    ref = spb.ModelRef(
        target=spb.ModelTarget(
            provider="offline", model="sleepy", base_url="offline:?fail=timeout&fail_times=1"
        ),
        timeout_ms=200,
    )
    events = await collect(stub.StartRun(single("hi", ref, "f-3")))
    assert len(finals(events)) == 1
    assert [line["status"] for line in audit(caplog) if line["run_id"] == "f-3"] == [
        "timeout",
        "success",
    ]


async def test_breaker_opens_fails_over_and_a_half_open_probe_closes_it(
    start_server, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="roundtable.audit")
    async with OpenAITestServer() as primary, OpenAITestServer() as backup:
        backup_target = spb.ModelTarget(provider="openai", model="backup", base_url=backup.base_url)
        ref = openai_ref(primary.base_url, "primary", backup_target)
        async with (
            start_server(
                breaker_failure_threshold=2, breaker_cooldown_seconds=0.5, model_max_retries=0
            ) as server,
            grpc.aio.insecure_channel(server.address) as channel,
        ):
            stub = pb_grpc.OrchestratorServiceStub(channel)
            primary.script(Fail(status=503), Fail(status=503))
            for i in range(2):  # two failures open the breaker; each turn fails over
                events = await collect(stub.StartRun(single("hi", ref, f"b-{i}")))
                assert finals(events)[0].model == "openai/backup"
            assert len(primary.requests) == 2
            events = await collect(stub.StartRun(single("hi", ref, "b-open")))
            assert finals(events)[0].model == "openai/backup"
            assert len(primary.requests) == 2, "an open breaker keeps calls off the failing target"
            assert "breaker_open" in [
                line["status"] for line in audit(caplog) if line["run_id"] == "b-open"
            ]
            await asyncio.sleep(0.6)  # cool-down: the next call is the half-open probe
            events = await collect(stub.StartRun(single("hi", ref, "b-probe")))
            assert finals(events)[0].model == "openai/primary"
            events = await collect(stub.StartRun(single("hi", ref, "b-closed")))
            assert finals(events)[0].model == "openai/primary", "the probe closed the breaker"
