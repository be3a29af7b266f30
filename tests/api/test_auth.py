"""Caller auth, tenant isolation and transport security, over real servers on real ports.

Bearer tokens, TLS and mutual TLS (certificates made at test time by `support.certs`), the
answers a caller gets for another tenant's runs, and the refusal to serve a non-loopback
address without caller authentication.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from roundtable.api import auth
from roundtable.api.auth import Authenticator, parse_tenant_map, read_token_file
from roundtable.api.tls import is_loopback, server_credentials
from roundtable.chat import ClientSecurity, send_turn
from roundtable.domain.errors import InvalidSettings
from roundtable.server import RunningServer
from roundtable.settings import Settings
from roundtable.telemetry.setup import telemetry_from_env
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import orchestrator_service_pb2_grpc as pb_grpc
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, kinds, start_request
from support.certs import CertificateAuthority, Issued
from support.otlp import OtlpReceiver

Metadata = Sequence[tuple[str, str]]
COUNT_OFF = ["1!", "2!", "3!", "4!"]


@dataclass(frozen=True)
class Tokens:
    """Three gateways: one for tenant-a, one for tenant-b and tenant-c, one for any tenant."""

    alpha: str
    beta: str
    admin: str

    @property
    def setting(self) -> str:
        """The `auth_tokens` setting that configures them."""
        return f"{self.alpha}=tenant-a;{self.beta}=tenant-b|tenant-c;{self.admin}=*"


@pytest.fixture
def tokens() -> Tokens:
    """Fresh random tokens (random, so a leak of one is unmistakable)."""
    return Tokens(*(f"tok-{name}-{secrets.token_urlsafe(24)}" for name in ("a", "b", "admin")))


@contextlib.asynccontextmanager
async def connected(
    start_server: Any, **settings: Any
) -> AsyncIterator[pb_grpc.OrchestratorServiceStub]:
    """Starts a server with `settings`; a plaintext client of it."""
    async with (
        start_server(**settings) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        yield pb_grpc.OrchestratorServiceStub(channel)


def bearer(token: str) -> Metadata:
    """Call metadata that carries a bearer token."""
    return (("authorization", f"Bearer {token}"),)


@dataclass(frozen=True)
class Failure:
    """How a call failed: its code, its message and its rich status (when it had one)."""

    code: grpc.StatusCode
    details: str
    status: status_pb2.Status | None


async def failure(call: Any) -> Failure:
    """Drives a call of any shape to its end; it must fail."""
    with pytest.raises(grpc.aio.AioRpcError):
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    return Failure(await call.code(), await call.details(), await rpc_status.aio.from_call(call))


async def count_off(
    stub: pb_grpc.OrchestratorServiceStub, tenant: str, metadata: Metadata = (), run_id: str = ""
) -> list[str]:
    """Runs a count-off for `tenant`; the replies' texts."""
    request = start_request("报数", tenant=tenant, run_id=run_id)
    return [f.content for f in finals(await collect(stub.StartRun(request, metadata=metadata)))]


def the_three_lookups(
    stub: pb_grpc.OrchestratorServiceStub, tenant: str, run_id: str, metadata: Metadata
) -> dict[str, Any]:
    """GetRun, StreamRun and CancelRun of one run, as calls not yet awaited."""
    return {
        "GetRun": stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant=tenant), metadata=metadata),
        "StreamRun": stub.StreamRun(
            pb.StreamRunRequest(run_id=run_id, tenant=tenant), metadata=metadata
        ),
        "CancelRun": stub.CancelRun(
            pb.CancelRunRequest(run_id=run_id, tenant=tenant), metadata=metadata
        ),
    }


# -- bearer tokens ----------------------------------------------------------------------------


async def test_no_token_or_a_wrong_one_is_unauthenticated(start_server, tokens: Tokens) -> None:
    async with connected(start_server, auth_tokens=tokens.setting) as stub:
        wrong = f"tok-wrong-{secrets.token_urlsafe(24)}"
        for metadata in [
            (),
            bearer(wrong),
            bearer(tokens.alpha[:-1]),  # a prefix of a real token is no token
            (("authorization", f"Basic {tokens.alpha}"),),  # nor is another scheme
            (("authorization", "Bearer "),),
        ]:
            started = await failure(
                stub.StartRun(start_request("报数", tenant="tenant-a"), metadata=metadata)
            )
            got = await failure(
                stub.GetRun(pb.GetRunRequest(run_id="r", tenant="tenant-a"), metadata=metadata)
            )
            for answer in (started, got):
                assert answer.code == grpc.StatusCode.UNAUTHENTICATED, metadata
                assert tokens.alpha not in answer.details and wrong not in answer.details
        # The rejected StartRuns left nothing behind.
        assert await count_off(stub, "tenant-a", bearer(tokens.alpha)) == COUNT_OFF
        runs = await failure(
            stub.GetRun(
                pb.GetRunRequest(run_id="never", tenant="tenant-a"),
                metadata=bearer(tokens.admin),
            )
        )
        assert runs.code == grpc.StatusCode.NOT_FOUND


async def test_health_needs_no_token_but_reflection_does(start_server, tokens: Tokens) -> None:
    async with (
        start_server(auth_tokens=tokens.setting) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)

        def ask() -> list[reflection_pb2.ServerReflectionRequest]:
            return [reflection_pb2.ServerReflectionRequest(list_services="")]

        denied = await failure(reflection.ServerReflectionInfo(ask()))
        assert denied.code == grpc.StatusCode.UNAUTHENTICATED
        listed = [
            s.name
            async for response in reflection.ServerReflectionInfo(
                ask(), metadata=bearer(tokens.beta)
            )
            for s in response.list_services_response.service
        ]
        assert "roundtable.v1.OrchestratorService" in listed


async def test_the_right_token_runs_a_count_off_for_its_tenants(
    start_server, tokens: Tokens
) -> None:
    async with connected(start_server, auth_tokens=tokens.setting) as stub:
        assert await count_off(stub, "tenant-a", bearer(tokens.alpha)) == COUNT_OFF
        assert await count_off(stub, "tenant-b", bearer(tokens.beta)) == COUNT_OFF
        assert await count_off(stub, "tenant-c", bearer(tokens.beta)) == COUNT_OFF


async def test_a_wildcard_token_acts_for_any_tenant(start_server, tokens: Tokens) -> None:
    async with connected(start_server, auth_tokens=tokens.setting) as stub:
        for tenant in ("tenant-a", "tenant-b", "someone-else"):
            assert await count_off(stub, tenant, bearer(tokens.admin), "run-x") == COUNT_OFF
            got = await stub.GetRun(
                pb.GetRunRequest(run_id="run-x", tenant=tenant), metadata=bearer(tokens.admin)
            )
            assert got.run.status == pb.RUN_STATUS_SUCCEEDED


async def test_tokens_from_a_file(start_server, tmp_path: Path, tokens: Tokens) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({tokens.alpha: ["tenant-a"], tokens.admin: ["*"]}))
    async with connected(start_server, auth_tokens_file=str(path)) as stub:
        assert await count_off(stub, "tenant-a", bearer(tokens.alpha)) == COUNT_OFF
        assert await count_off(stub, "tenant-z", bearer(tokens.admin)) == COUNT_OFF
        denied = await failure(
            stub.StartRun(start_request("报数", tenant="tenant-b"), metadata=bearer(tokens.alpha))
        )
        assert denied.code == grpc.StatusCode.PERMISSION_DENIED
        unknown = await failure(
            stub.StartRun(start_request("报数", tenant="tenant-a"), metadata=bearer(tokens.beta))
        )
        assert unknown.code == grpc.StatusCode.UNAUTHENTICATED


# -- tenant isolation -------------------------------------------------------------------------


async def test_another_tenants_run_is_not_found_exactly_like_a_missing_run(
    start_server, tokens: Tokens
) -> None:
    async with connected(start_server, auth_tokens=tokens.setting) as stub:
        assert await count_off(stub, "tenant-a", bearer(tokens.alpha), "run-a") == COUNT_OFF

        # beta may not act for tenant-a: its run is answered as if it did not exist...
        forbidden = {
            name: await failure(call)
            for name, call in the_three_lookups(
                stub, "tenant-a", "run-a", bearer(tokens.beta)
            ).items()
        }
        # ...which is what anyone gets for a run that does not exist.
        missing = {
            name: await failure(call)
            for name, call in the_three_lookups(
                stub, "tenant-nobody", "run-a", bearer(tokens.admin)
            ).items()
        }
        assert forbidden == missing
        assert {f.code for f in forbidden.values()} == {grpc.StatusCode.NOT_FOUND}

        got = await stub.GetRun(
            pb.GetRunRequest(run_id="run-a", tenant="tenant-a"), metadata=bearer(tokens.alpha)
        )
        assert got.run.status == pb.RUN_STATUS_SUCCEEDED


async def test_a_forbidden_cancel_leaves_a_live_run_alone(start_server, tokens: Tokens) -> None:
    async with connected(start_server, auth_tokens=tokens.setting) as stub:
        # Each reply takes 300 ms: the run is still live while beta tries to cancel it.
        slow = spb.ModelRef(
            target=spb.ModelTarget(
                provider="offline", model="slow", base_url="offline:?latency_ms=300"
            )
        )
        request = start_request("报数", tenant="tenant-a", run_id="live-a", default_model=slow)
        events = []
        async for response in stub.StartRun(request, metadata=bearer(tokens.alpha)):
            events.append(response.event)
            if kinds(events) != ["run_started", "plan_created", "speaker_started"]:
                continue
            # The run is live: beta's immediate cancel is answered like a missing run's.
            cancel = stub.CancelRun(
                pb.CancelRunRequest(
                    run_id="live-a", tenant="tenant-a", mode=pb.CANCEL_MODE_IMMEDIATE
                ),
                metadata=bearer(tokens.beta),
            )
            assert (await failure(cancel)).code == grpc.StatusCode.NOT_FOUND
            live = await stub.GetRun(
                pb.GetRunRequest(run_id="live-a", tenant="tenant-a"),
                metadata=bearer(tokens.alpha),
            )
            assert live.run.status == pb.RUN_STATUS_RUNNING
        assert kinds(events)[-1] == "run_completed"
        assert [f.content for f in finals(events)] == COUNT_OFF


async def test_starting_a_run_for_another_tenant_is_permission_denied(
    start_server, tokens: Tokens
) -> None:
    async with connected(start_server, auth_tokens=tokens.setting) as stub:
        request = start_request("报数", tenant="tenant-a", run_id="run-stolen")
        denied = await failure(stub.StartRun(request, metadata=bearer(tokens.beta)))
        assert denied.code == grpc.StatusCode.PERMISSION_DENIED
        assert "tenant-a" in denied.details
        # Nothing of it was stored.
        missing = await failure(
            stub.GetRun(
                pb.GetRunRequest(run_id="run-stolen", tenant="tenant-a"),
                metadata=bearer(tokens.alpha),
            )
        )
        assert missing.code == grpc.StatusCode.NOT_FOUND


# -- TLS and mutual TLS ------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """A trusted CA with a server certificate and client certificates, and a rogue CA."""

    ca: CertificateAuthority
    server: Issued
    gateway: Issued
    stranger: Issued
    impostor: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates for this module's tests, made once."""
    directory = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.create(directory)
    rogue = CertificateAuthority.create(directory, "Rogue CA")
    return Pki(
        ca=ca,
        server=ca.issue("roundtable", server=True),
        gateway=ca.issue("gateway-1"),
        stranger=ca.issue("stranger"),
        impostor=rogue.issue("gateway-1"),
    )


def tls_settings(pki: Pki, *, mutual: bool) -> dict[str, str]:
    """Server settings for TLS (and, with `mutual`, client certificates from the trusted CA)."""
    settings = {
        "tls_cert_file": str(pki.server.cert_file),
        "tls_key_file": str(pki.server.key_file),
    }
    if mutual:
        settings["tls_client_ca_file"] = str(pki.ca.root.cert_file)
    return settings


def tls_channel(server: RunningServer, pki: Pki, client: Issued | None = None) -> grpc.aio.Channel:
    """A channel that trusts the test CA and presents `client`'s certificate, if any."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.root.cert,
        private_key=client.key if client else None,
        certificate_chain=client.cert if client else None,
    )
    return grpc.aio.secure_channel(server.address, credentials)


async def test_tls_client_with_the_ca_connects(start_server, pki: Pki, tokens: Tokens) -> None:
    async with start_server(
        auth_tokens=tokens.setting, **tls_settings(pki, mutual=False)
    ) as server:
        # The way gateways send tokens over TLS: call credentials on the channel.
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(root_certificates=pki.ca.root.cert),
            grpc.access_token_call_credentials(tokens.alpha),
        )
        async with grpc.aio.secure_channel(server.address, credentials) as channel:
            stub = pb_grpc.OrchestratorServiceStub(channel)
            assert await count_off(stub, "tenant-a") == COUNT_OFF
        # Plaintext does not get through to a TLS server.
        async with grpc.aio.insecure_channel(server.address) as channel:
            plain = pb_grpc.OrchestratorServiceStub(channel)
            answer = await failure(
                plain.GetRun(
                    pb.GetRunRequest(run_id="r", tenant="tenant-a"),
                    metadata=bearer(tokens.alpha),
                    timeout=10,
                )
            )
            assert answer.code == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls(start_server, pki: Pki) -> None:
    settings = tls_settings(pki, mutual=True)
    async with start_server(auth_certificate_tenants="gateway-1=tenant-a", **settings) as server:
        # A trusted certificate with a mapped common name acts for its tenants.
        async with tls_channel(server, pki, pki.gateway) as channel:
            stub = pb_grpc.OrchestratorServiceStub(channel)
            assert await count_off(stub, "tenant-a", run_id="mtls-1") == COUNT_OFF
            denied = await failure(stub.StartRun(start_request("报数", tenant="tenant-b")))
            assert denied.code == grpc.StatusCode.PERMISSION_DENIED
            hidden = await failure(
                stub.GetRun(pb.GetRunRequest(run_id="mtls-1", tenant="tenant-b"))
            )
            assert hidden.code == grpc.StatusCode.NOT_FOUND

        # No certificate, or one signed by a CA the server does not trust: no connection.
        for client in (None, pki.impostor):
            async with tls_channel(server, pki, client) as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                rejected = await failure(
                    stub.GetRun(pb.GetRunRequest(run_id="mtls-1", tenant="tenant-a"), timeout=10)
                )
                assert rejected.code == grpc.StatusCode.UNAVAILABLE, client

        # A certificate from the trusted CA whose name maps to no tenant: not a caller.
        async with tls_channel(server, pki, pki.stranger) as channel:
            stub = pb_grpc.OrchestratorServiceStub(channel)
            stranger = await failure(
                stub.GetRun(pb.GetRunRequest(run_id="mtls-1", tenant="tenant-a"))
            )
            assert stranger.code == grpc.StatusCode.UNAUTHENTICATED


# -- listening --------------------------------------------------------------------------------


async def test_non_loopback_without_auth_refuses_to_start(start_server) -> None:
    with pytest.raises(InvalidSettings, match="allow-unauthenticated"):
        async with start_server(listen="0.0.0.0:0"):
            pytest.fail("the server started")


async def test_non_loopback_without_auth_starts_when_allowed(start_server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="roundtable")
    async with connected(start_server, listen="0.0.0.0:0", allow_unauthenticated=True) as stub:
        assert await count_off(stub, "t") == COUNT_OFF
    assert any("WITHOUT caller authentication" in r.getMessage() for r in caplog.records)


async def test_non_loopback_with_auth_starts_without_a_warning(
    start_server, tokens: Tokens, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="roundtable")
    async with connected(start_server, listen="0.0.0.0:0", auth_tokens=tokens.setting) as stub:
        assert await count_off(stub, "tenant-a", bearer(tokens.alpha)) == COUNT_OFF
    assert not any("caller authentication" in r.getMessage() for r in caplog.records)


async def test_loopback_without_auth_serves_with_a_warning(start_server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="roundtable")
    async with connected(start_server) as stub:
        assert await count_off(stub, "t") == COUNT_OFF
    assert any("without caller authentication" in r.getMessage() for r in caplog.records)


# -- secrecy ----------------------------------------------------------------------------------


async def test_tokens_never_reach_logs_or_spans(start_server, tokens: Tokens, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="roundtable")
    caplog.set_level(logging.INFO)
    wrong = f"tok-canary-{secrets.token_urlsafe(24)}"
    with OtlpReceiver() as receiver:
        telemetry = telemetry_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        async with start_server(auth_tokens=tokens.setting, telemetry=telemetry) as server:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                assert await count_off(stub, "tenant-a", bearer(tokens.alpha)) == COUNT_OFF
                await failure(stub.StartRun(start_request("报数"), metadata=bearer(wrong)))
                await failure(
                    stub.StartRun(start_request("报数", tenant="t-9"), metadata=bearer(tokens.beta))
                )
            telemetry.force_flush()
    assert receiver.spans, "spans were exported"
    assert any("rejected a call" in r.getMessage() for r in caplog.records)
    places = {
        "logs": "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records),
        "spans": json.dumps([(s.name, s.attributes) for s in receiver.spans], default=str),
        "settings": repr(Settings(auth_tokens=tokens.setting)),
    }
    for where, text in places.items():
        for token in (tokens.alpha, tokens.beta, tokens.admin, wrong):
            assert token not in text, f"a token leaked into the {where}"


# -- units: comparison and settings -----------------------------------------------------------


@pytest.mark.parametrize("presented", ["first", "second", "third", "none-of-them", ""])
def test_token_comparison_examines_every_configured_token(
    monkeypatch: pytest.MonkeyPatch, presented: str
) -> None:
    configured = {"first": frozenset({"a"}), "second": frozenset({"b"}), "third": frozenset({"*"})}
    authenticator = Authenticator(tokens=configured)
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    caller = authenticator.match_token(presented)
    assert len(calls) == len(configured), "every token is compared, matched or not"
    assert len({len(a) for a, _ in calls} | {len(b) for _, b in calls}) == 1, "equal lengths"
    if presented in configured:
        assert caller is not None and caller.tenants == configured[presented]
    else:
        assert caller is None


def test_tenant_maps_parse_and_never_quote_a_token(tmp_path: Path) -> None:
    padded = "c2VjcmV0LXRva2Vu=="  # base64 padding: the tenants follow the last "="
    parsed = parse_tenant_map(f" {padded}=tenant-a|tenant-b ; other=* ;", flag="--auth-tokens")
    assert parsed == {padded: frozenset({"tenant-a", "tenant-b"}), "other": frozenset({"*"})}

    secret = f"tok-{secrets.token_urlsafe(24)}"
    for text in (secret, f"{secret}=", f"{secret}=tenant a", f"{secret}=a,b"):
        with pytest.raises(InvalidSettings) as raised:
            parse_tenant_map(text, flag="--auth-tokens")
        assert secret not in str(raised.value)

    for content in ("[]", json.dumps({secret: "tenant-a"}), json.dumps({secret: []}), "{nope"):
        path = tmp_path / "tokens.json"
        path.write_text(content)
        with pytest.raises(InvalidSettings) as raised:
            read_token_file(str(path))
        assert secret not in str(raised.value)
    with pytest.raises(InvalidSettings, match="cannot read"):
        read_token_file(str(tmp_path / "missing.json"))


def test_contradictory_security_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSettings, match="needs mutual TLS"):
        Authenticator.from_settings(Settings(auth_certificate_tenants="gateway-1=*"))
    with pytest.raises(InvalidSettings, match="no caller may act"):
        Authenticator.from_settings(Settings(tls_client_ca_file="ca.pem"))
    with pytest.raises(InvalidSettings, match="go together"):
        server_credentials(Settings(tls_cert_file="server.pem"))
    with pytest.raises(InvalidSettings, match="needs --tls-cert-file"):
        server_credentials(Settings(tls_client_ca_file="ca.pem"))
    with pytest.raises(InvalidSettings, match="cannot read"):
        server_credentials(
            Settings(tls_cert_file=str(tmp_path / "no.pem"), tls_key_file=str(tmp_path / "no.key"))
        )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("roundtable.internal", False),
    ],
)
def test_only_loopback_hosts_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


async def test_roundtable_chat_sends_its_token_over_tls_and_its_certificate(
    start_server, pki: Pki, tokens: Tokens, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {"a": "Alice", "b": "Bob", "c": "Carol", "d": "Dave"}
    with_token = ClientSecurity(token=tokens.alpha, ca=pki.ca.root.cert)
    async with start_server(
        auth_tokens=tokens.setting, **tls_settings(pki, mutual=False)
    ) as server:
        out = io.StringIO()
        request = start_request("报数", tenant="tenant-a", run_id="chat-tls-1")
        assert await send_turn(server.address, request, names, out, security=with_token) == 0
        assert all(reply in out.getvalue() for reply in COUNT_OFF)

        # Without the token the server turns the chat away, and the chat says why.
        request = start_request("报数", tenant="tenant-a", run_id="chat-tls-2")
        no_token = ClientSecurity(ca=pki.ca.root.cert)
        assert (
            await send_turn(server.address, request, names, io.StringIO(), security=no_token) == 1
        )
        assert "UNAUTHENTICATED" in capsys.readouterr().err

    async with start_server(
        auth_certificate_tenants="gateway-1=tenant-a", **tls_settings(pki, mutual=True)
    ) as server:
        certificate = ClientSecurity(
            ca=pki.ca.root.cert, cert=pki.gateway.cert, key=pki.gateway.key
        )
        request = start_request("报数", tenant="tenant-a", run_id="chat-mtls-1")
        out = io.StringIO()
        assert await send_turn(server.address, request, names, out, security=certificate) == 0
        assert "4!" in out.getvalue()


async def test_roundtable_chat_sends_its_token_in_plaintext_to_a_loopback_server(
    start_server, tokens: Tokens
) -> None:
    async with start_server(auth_tokens=tokens.setting) as server:
        request = start_request("报数", tenant="tenant-a", run_id="chat-plain-1")
        out = io.StringIO()
        security = ClientSecurity(token=tokens.alpha)
        assert await send_turn(server.address, request, {}, out, security=security) == 0
        assert "4!" in out.getvalue()
