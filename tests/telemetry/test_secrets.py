"""The canary test: a unique secret and a unique persona string, searched for everywhere."""

from __future__ import annotations

import json
import logging
import uuid

import grpc
from roundtable.telemetry.setup import telemetry_from_env
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.approvals import sent_key, tool_request
from support.builders import collect, finals, member, start_request
from support.openai_server import Fail, OpenAITestServer, Reply
from support.otlp import OtlpReceiver
from support.stores import written_bytes


def leak_places(store_url: str, events: list, caplog, receiver: OtlpReceiver) -> dict[str, str]:
    """The text of every place a secret must never reach, once a run is over."""
    assert any(r.name == "roundtable.audit" for r in caplog.records), "audit lines were captured"
    return {
        "database": written_bytes(store_url).decode("utf-8", "replace"),
        "event stream": "".join(e.SerializeToString().decode("utf-8", "replace") for e in events),
        "logs": "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records),
        "spans": json.dumps([(s.name, s.attributes) for s in receiver.spans], default=str),
    }


async def test_secret_never_leaves_the_runtime_context(start_server, store_url, caplog) -> None:
    secret = f"sk-canary-{uuid.uuid4().hex}"
    persona = f"PERSONA-CANARY-{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG, logger="roundtable")
    caplog.set_level(logging.INFO)
    async with OpenAITestServer() as model_server:
        # The first attempt fails with an error body that echoes the key and the prompt,
        # the way some providers do; the retry succeeds.
        model_server.script(
            Fail(status=500, message=f"bad key {secret} for prompt {persona}"),
            Reply(text="Noted, and here is my answer."),
            Reply(text="A second speaker answers."),
        )
        ref = spb.ModelRef(
            target=spb.ModelTarget(
                provider="openai",
                model="canary-model",
                base_url=model_server.base_url,
                credential_ref="k",
            )
        )
        roster = [
            member("a", "Alice", f"{persona} Alice is careful.", model=ref),
            member("b", "Bob", f"{persona} Bob is bold.", model=ref),
        ]
        request = start_request(
            "@Alice @Bob remember that I like tea",
            members=roster,
            credentials={"k": secret},
            run_id="canary-1",
        )
        with OtlpReceiver() as receiver:
            telemetry = telemetry_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
            async with start_server(telemetry=telemetry) as server:
                async with grpc.aio.insecure_channel(server.address) as channel:
                    events = await collect(
                        pb_grpc.OrchestratorServiceStub(channel).StartRun(request)
                    )
                telemetry.force_flush()
    assert len(finals(events)) == 2, "the run went through, retry included"

    places = leak_places(store_url, events, caplog, receiver)
    assert receiver.spans, "spans were exported"
    for where, text in places.items():
        assert secret not in text, f"the secret leaked into the {where}"
        assert persona not in text, f"the persona leaked into the {where}"
    # The persona goes where a prompt legitimately goes: the request to the model server.
    sent = [json.dumps(r.body) for r in model_server.requests]
    assert any(persona in body for body in sent)
    assert all(secret not in body for body in sent)
    assert {r.authorization for r in model_server.requests} == {f"Bearer {secret}"}


async def test_a_tool_servers_token_never_leaves_the_runtime_context(
    start_server, store_url, caplog, start_mcp_server
) -> None:
    """The bearer token of a tool server (StartRunRequest.credentials, named by
    ToolServer.credential_ref) reaches the tool server and nothing else: not the store, the
    events, the logs (DEBUG included: the MCP SDK logs messages there) or the spans."""
    secret = f"tool-canary-{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG)
    async with start_mcp_server(token=secret) as mcp:
        request = tool_request("use weather for Paris", mcp, "tool-canary")
        request.snapshot.session.tool_servers[0].credential_ref = "tools"
        request.credentials["tools"] = secret
        with OtlpReceiver() as receiver:
            telemetry = telemetry_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
            async with start_server(telemetry=telemetry) as server:
                async with grpc.aio.insecure_channel(server.address) as channel:
                    events = await collect(
                        pb_grpc.OrchestratorServiceStub(channel).StartRun(request)
                    )
                telemetry.force_flush()
        ran = mcp.counts("weather")
    (final,) = finals(events)
    assert "Sunny, 21°C in Paris" in final.content, "the token was accepted by the server"
    assert ran == {sent_key("tool-canary", "tool-canary#0/1"): 1}
    assert any(s.name == "execute_tool weather" for s in receiver.spans)
    places = leak_places(store_url, events, caplog, receiver)
    for where, text in places.items():
        assert secret not in text, f"the tool server's token leaked into the {where}"
