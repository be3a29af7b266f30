"""The edge rejects malformed requests over the real server, naming every bad field.

Every StartRun case goes through the generated stub to a real server on a real port,
decodes the `google.rpc.BadRequest` detail of the status, and checks that nothing of the
rejected request reached the store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
import pytest
from google.rpc import status_pb2
from roundtable.api.limits import RequestLimits
from roundtable.api.validation import validate_start_run
from roundtable.harness.audit import AUDIT_LOGGER
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb
from support.builders import collect, finals, member, model_ref, start_request
from support.rejections import rejection
from support.stores import count_rows

KIB = 1024
MAX_MESSAGE_BYTES = RequestLimits().max_message_bytes
assert MAX_MESSAGE_BYTES == 32 * KIB, "the cases below are written for the documented 32 KiB"


# -- StartRun: one bad field at a time --------------------------------------------------------


def _without_run_id() -> pb.StartRunRequest:
    request = start_request("hello")
    request.context.run_id = ""
    return request


def _duplicate_member_ids() -> pb.StartRunRequest:
    return start_request(
        "hello", members=[member("a", "Alice"), member("b", "Bob"), member("a", "Alicia")]
    )


def _unknown_mention() -> pb.StartRunRequest:
    return start_request("hello", mentions=["b", "ghost"])


def _oversized_ascii_text() -> pb.StartRunRequest:
    return start_request("x" * (MAX_MESSAGE_BYTES + 1))


def _oversized_cjk_text() -> pb.StartRunRequest:
    # 11,000 characters (well under 32 Ki characters) but 33,000 UTF-8 bytes: the limit
    # is in bytes.
    return start_request("报" * 11_000)


def _unknown_provider() -> pb.StartRunRequest:
    return start_request(
        "hello",
        members=[member("a", "Alice", model=model_ref("no-such-provider")), member("b", "Bob")],
    )


def _bob_keyed(credentials: dict[str, str]) -> pb.StartRunRequest:
    """Bob's model names the credential "vault-b"; `credentials` are the request's."""
    return start_request(
        "hello",
        members=[
            member("a", "Alice"),
            member("b", "Bob", model=model_ref("openai", "gpt", credential_ref="vault-b")),
        ],
        credentials=credentials,
    )


def _missing_credential() -> pb.StartRunRequest:
    return _bob_keyed({"vault-a": "sk-secret-value"})


def _empty_credential() -> pb.StartRunRequest:
    # Outside testing: it went out as the provider's placeholder key and failed late (401).
    return _bob_keyed({"vault-b": ""})


def _invisible_text() -> pb.StartRunRequest:
    # Outside testing: zero-width spaces alone started (and stored) a run.
    return start_request("\u200b\ufeff \u2060")


def _long_skill_name() -> pb.StartRunRequest:
    request = start_request("hello")
    request.snapshot.members[0].skills.add(skill_id="s", name="x" * 1_025)
    return request


def _credentials_no_header_can_carry() -> pb.StartRunRequest:
    # Outside testing: a key with a newline failed at the model server's door as if the
    # server were down, and opened the breaker that server's every tenant shares.
    request = start_request(
        "hello",
        members=[
            member("a", "Alice", model=model_ref("openai", "gpt", credential_ref="nl")),
            member("b", "Bob", model=model_ref("openai", "gpt", credential_ref="wide")),
            member("c", "Cai", model=model_ref("openai", "gpt", credential_ref="fine")),
        ],
        credentials={
            "nl": "sk-secret-value\nx",
            "wide": "sk-secret-value密钥",
            "tab": "sk-secret-value\tx",
            "fine": "sk-secret value",
            "unused": "-----BEGIN KEY-----\nsk-secret-value\n-----END KEY-----",
        },
    )
    session = request.snapshot.session
    session.tool_servers.add(server_id="local", url="http://127.0.0.1:1/mcp", credential_ref="tab")
    return request


def _unspecified_kind() -> pb.StartRunRequest:
    return start_request("hello", kind=spb.SESSION_KIND_UNSPECIFIED)


def _primary_not_a_member() -> pb.StartRunRequest:
    return start_request("hello", primary="zed")


def _a_tool_named_twice() -> pb.StartRunRequest:
    request = start_request("hello")
    request.snapshot.session.tool_servers.add(server_id="local", url="http://127.0.0.1:1/mcp")
    schema = '{"type": "object"}'
    request.snapshot.session.tools.add(name="t", input_schema_json=schema, server_id="local")
    request.snapshot.members[0].tool_names.extend(["t", "t"])
    return request


def _approval_timeout_past_its_bound() -> pb.StartRunRequest:
    request = start_request("hello")
    request.options.budget_overrides.approval_timeout_seconds = 2_592_001
    return request


CASES: list[tuple[str, Callable[[], pb.StartRunRequest], dict[str, str]]] = [
    ("missing run_id", _without_run_id, {"context.run_id": "is required"}),
    (
        "duplicate member ids",
        _duplicate_member_ids,
        {"snapshot.members[2].member_id": "duplicates member id 'a'"},
    ),
    (
        "unknown mention",
        _unknown_mention,
        {"snapshot.user_turn.mentions[1]": "names no member: 'ghost'"},
    ),
    (
        "oversized text (ascii)",
        _oversized_ascii_text,
        {"snapshot.user_turn.text": f"at most {MAX_MESSAGE_BYTES} bytes"},
    ),
    (
        "oversized text (utf-8 bytes)",
        _oversized_cjk_text,
        {"snapshot.user_turn.text": f"at most {MAX_MESSAGE_BYTES} bytes"},
    ),
    (
        "unknown provider",
        _unknown_provider,
        {"snapshot.members[0].model.target.provider": "unknown provider 'no-such-provider'"},
    ),
    (
        "credential_ref not in credentials",
        _missing_credential,
        {"snapshot.members[1].model.target.credential_ref": "names no entry of credentials"},
    ),
    (
        "an empty credential",
        _empty_credential,
        {"snapshot.members[1].model.target.credential_ref": "names an empty credential"},
    ),
    (
        "text of invisible characters alone",
        _invisible_text,
        {"snapshot.user_turn.text": "is required unless mentions"},
    ),
    (
        "a skill name over 1 KiB",
        _long_skill_name,
        {"snapshot.members[0].skills[0].name": "at most 1024 bytes"},
    ),
    (
        "credentials no HTTP header can carry",
        _credentials_no_header_can_carry,
        {
            f"snapshot.members[{i}].model.target.credential_ref": "an HTTP header cannot carry"
            for i in (0, 1)
        }
        | {"snapshot.session.tool_servers[0].credential_ref": "an HTTP header cannot carry"},
    ),
    ("unspecified session kind", _unspecified_kind, {"snapshot.session.kind": "SINGLE or GROUP"}),
    (
        "primary member not in members",
        _primary_not_a_member,
        {"snapshot.session.primary_member_id": "must name one of snapshot.members"},
    ),
    (
        "a tool named twice",
        _a_tool_named_twice,
        {"snapshot.members[0].tool_names[1]": "'t' a second time"},
    ),
    (
        "approval timeout past its bound",
        _approval_timeout_past_its_bound,
        {"options.budget_overrides.approval_timeout_seconds": "between 0 and 2592000"},
    ),
]


@pytest.mark.parametrize(("build", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_start_run_names_the_bad_field(server, stub, build, expected) -> None:
    request = build()

    rejected = await rejection(stub.StartRun(request))

    assert rejected.code == grpc.StatusCode.INVALID_ARGUMENT
    violations = rejected.violations
    assert set(violations) == set(expected), violations
    for field, words in expected.items():
        assert words in violations[field], (field, violations[field])
    # The status message names the fields too; no credential value leaks into any of it.
    for field in expected:
        assert field in rejected.details
    assert "sk-secret-value" not in str(rejected.status)
    assert await count_rows(server.store) == 0


async def test_start_run_reports_every_violation_at_once(server, stub) -> None:
    """One request with eight independent faults gets all eight, each exactly once."""
    request = start_request(
        "x" * (MAX_MESSAGE_BYTES + 1),
        kind=spb.SESSION_KIND_UNSPECIFIED,
        members=[
            member("a", "Alice", model=model_ref("no-such-provider")),
            member("a", "Alicia"),
            member("b", "Bob", model=model_ref("openai", "gpt", credential_ref="vault-b")),
        ],
        primary="zed",
        mentions=["ghost"],
        credentials={"vault-a": "sk-secret-value"},
    )
    request.context.run_id = ""

    rejected = await rejection(stub.StartRun(request))

    assert rejected.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(rejected.violations) == {
        "context.run_id",
        "snapshot.members[1].member_id",
        "snapshot.members[0].model.target.provider",
        "snapshot.members[2].model.target.credential_ref",
        "snapshot.session.kind",
        "snapshot.session.primary_member_id",
        "snapshot.user_turn.text",
        "snapshot.user_turn.mentions[0]",
    }
    assert rejected.details.startswith("invalid request: 8 bad field(s)")
    assert "sk-secret-value" not in str(rejected.status)
    assert await count_rows(server.store) == 0


# -- the run-id RPCs ------------------------------------------------------------------------


@pytest.mark.parametrize("rpc", ["StreamRun", "GetRun", "CancelRun"])
async def test_empty_run_id_is_invalid(server, stub, rpc) -> None:
    request_type = {
        "StreamRun": pb.StreamRunRequest,
        "GetRun": pb.GetRunRequest,
        "CancelRun": pb.CancelRunRequest,
    }[rpc]

    rejected = await rejection(getattr(stub, rpc)(request_type(run_id="", tenant="A")))

    assert rejected.code == grpc.StatusCode.INVALID_ARGUMENT
    assert rejected.violations == {"run_id": "is required"}
    assert await count_rows(server.store) == 0


async def test_get_run_of_an_unknown_run_is_not_found(stub) -> None:
    rejected = await rejection(stub.GetRun(pb.GetRunRequest(run_id="no-such-run", tenant="A")))

    assert rejected.code == grpc.StatusCode.NOT_FOUND


async def test_another_tenants_run_looks_exactly_like_an_unknown_one(server, stub) -> None:
    request = start_request("报数", tenant="A")
    run_id = request.context.run_id
    events = await collect(stub.StartRun(request))
    assert len(finals(events)) == 4
    owned = await stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant="A"))
    assert owned.run.run_id == run_id and owned.run.status == pb.RUN_STATUS_SUCCEEDED

    foreign = await rejection(stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant="B")))
    # The same id asked by a tenant that has never used it, and an id nobody ever used.
    never_used = await rejection(stub.GetRun(pb.GetRunRequest(run_id=run_id, tenant="C")))
    unknown = await rejection(stub.GetRun(pb.GetRunRequest(run_id="no-such-run", tenant="A")))

    assert foreign.code == grpc.StatusCode.NOT_FOUND
    assert (foreign.code, foreign.details, foreign.status) == (
        never_used.code,
        never_used.details,
        never_used.status,
    )
    assert foreign.code == unknown.code
    assert foreign.details.replace(run_id, "ID") == unknown.details.replace("no-such-run", "ID")
    assert _strip_message(foreign.status) == _strip_message(unknown.status)
    # Streaming and cancelling another tenant's run are NOT_FOUND too.
    for call in (
        stub.StreamRun(pb.StreamRunRequest(run_id=run_id, tenant="B")),
        stub.CancelRun(pb.CancelRunRequest(run_id=run_id, tenant="B")),
    ):
        assert (await rejection(call)).code == grpc.StatusCode.NOT_FOUND


def _strip_message(status: status_pb2.Status | None) -> status_pb2.Status | None:
    if status is None:
        return None
    stripped = status_pb2.Status()
    stripped.CopyFrom(status)
    stripped.message = ""
    return stripped


# -- idempotency on (tenant, run_id) ------------------------------------------------------


async def test_same_run_id_with_another_snapshot_already_exists(server, stub) -> None:
    first = start_request("报数", run_id="run-fixed", tenant="A")
    await collect(stub.StartRun(first))
    rows = await count_rows(server.store)

    second = start_request("报数 please", run_id="run-fixed", tenant="A")
    rejected = await rejection(stub.StartRun(second))

    assert rejected.code == grpc.StatusCode.ALREADY_EXISTS
    assert await count_rows(server.store) == rows


async def test_same_run_id_with_the_same_snapshot_replays_without_a_model(
    stub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    request = start_request("报数", tenant="A")
    first = await collect(stub.StartRun(request))
    assert [r for r in caplog.records if r.name == AUDIT_LOGGER], "the first run calls models"
    caplog.clear()

    replayed = await collect(stub.StartRun(request))

    durable = [e for e in first if e.WhichOneof("payload") != "assistant_delta"]
    assert [e.seq for e in replayed] == [e.seq for e in durable] == list(range(1, len(durable) + 1))
    assert [e.SerializeToString(deterministic=True) for e in replayed] == [
        e.SerializeToString(deterministic=True) for e in durable
    ]
    assert [f.content for f in finals(replayed)] == [f.content for f in finals(first)]
    assert [r for r in caplog.records if r.name == AUDIT_LOGGER] == []


# -- the history window, unit level ---------------------------------------------------------


def test_only_the_history_window_is_validated_message_by_message() -> None:
    """A bad role in the last 64 messages is reported; one further back is not read.

    Roundtable reads only the most recent `history_window` (64) messages of the history
    into a prompt (convert.snapshot_from_proto keeps just that window). Validation matches
    what is read: the window is validated message by message, the rest is only counted
    (max 10,000) and bounded by the request size. A bad message outside the window can
    never reach a model, so checking it would cost time for nothing on every request.
    """
    limits = RequestLimits()
    assert limits.history_window == 64
    total = 10_000
    request = start_request("hello")
    request.snapshot.history.extend(
        spb.HistoryMessage(role=spb.MESSAGE_ROLE_USER, content=f"m{i}") for i in range(total)
    )
    inside = total - 10  # within the last 64
    outside = total - limits.history_window - 1  # the newest message outside the window
    request.snapshot.history[inside].role = spb.MESSAGE_ROLE_UNSPECIFIED
    request.snapshot.history[outside].role = spb.MESSAGE_ROLE_UNSPECIFIED

    violations = validate_start_run(request, limits=limits, providers={"offline", "openai"})

    assert [v.field for v in violations] == [f"snapshot.history[{inside}].role"]
    assert "USER or ASSISTANT" in violations[0].description


def _history_bytes(request: pb.StartRunRequest, bad: dict[int, bytes]) -> bytes:
    """The request's wire bytes with some history messages replaced by other bytes."""
    snapshot = spb.Snapshot()
    snapshot.CopyFrom(request.snapshot)
    history = [m.SerializeToString() for m in snapshot.history]
    for index, raw in bad.items():
        history[index] = raw
    snapshot.ClearField("history")
    field = spb.Snapshot.DESCRIPTOR.fields_by_name["history"].number
    tag = bytes([field << 3 | 2])
    body = snapshot.SerializeToString() + b"".join(tag + _varint(len(raw)) + raw for raw in history)
    head = pb.StartRunRequest(context=request.context).SerializeToString()
    snapshot_tag = bytes([pb.StartRunRequest.DESCRIPTOR.fields_by_name["snapshot"].number << 3 | 2])
    return head + snapshot_tag + _varint(len(body)) + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


async def test_history_messages_outside_the_window_are_counted_not_parsed(server) -> None:
    """A message Roundtable reads must parse; one it never reads is only counted.

    `content` is a proto3 string: bytes that are not UTF-8 make the message unparseable.
    Inside the window that is INVALID_ARGUMENT naming the message; outside it the turn runs
    (the bytes still count in the fingerprint, so a changed old message is another turn).
    """
    request = start_request("大家报数！")
    total = 100
    request.snapshot.history.extend(
        spb.HistoryMessage(role=spb.MESSAGE_ROLE_USER, content=f"m{i}") for i in range(total)
    )
    not_utf8 = (
        spb.HistoryMessage(role=spb.MESSAGE_ROLE_USER).SerializeToString() + b"\x22\x02\xff\xfe"
    )
    async with grpc.aio.insecure_channel(server.address) as channel:
        start_run = channel.unary_stream(
            "/roundtable.v1.OrchestratorService/StartRun",
            request_serializer=lambda data: data,
            response_deserializer=pb.StartRunResponse.FromString,
        )
        rejected = await rejection(start_run(_history_bytes(request, {total - 1: not_utf8})))
        assert rejected.code == grpc.StatusCode.INVALID_ARGUMENT
        assert rejected.violations == {
            f"snapshot.history[{total - 1}]": "is not a valid HistoryMessage"
        }
        assert await count_rows(server.store) == 0

        outside = total - RequestLimits().history_window - 1
        events = [r.event async for r in start_run(_history_bytes(request, {outside: not_utf8}))]
    assert events[-1].WhichOneof("payload") == "run_completed"
    assert len(finals(events)) == len(request.snapshot.members)


def test_a_history_over_the_count_limit_is_reported() -> None:
    """The messages outside the window are still counted."""
    request = start_request("hello")
    request.snapshot.history.extend(
        spb.HistoryMessage(role=spb.MESSAGE_ROLE_USER, content="m") for _ in range(10_001)
    )

    violations = validate_start_run(request, limits=RequestLimits(), providers={"offline"})

    assert [v.field for v in violations] == ["snapshot.history"]


@pytest.mark.parametrize(
    "cancel, field",
    [
        (pb.CancelRunRequest(run_id="r-1", tenant="A", mode=7), "mode"),  # type: ignore[arg-type]
        (pb.CancelRunRequest(run_id="r-1", tenant="A", reason="stop\x00now"), "reason"),
        (pb.CancelRunRequest(run_id="r-1", tenant="A", reason="x" * 257), "reason"),
        # Review: it made a person's cancel a shutdown's (interrupted, calls left waiting).
        (pb.CancelRunRequest(run_id="r-1", tenant="A", reason="server_shutdown"), "reason"),
    ],
    ids=["unknown-mode", "nul-in-reason", "long-reason", "the-servers-own-reason"],
)
async def test_a_cancel_with_an_unknown_mode_or_a_bad_reason_is_invalid(
    server, stub, cancel: pb.CancelRunRequest, field: str
) -> None:
    # The same answer on either store and whether or not the run is this replica's: it is
    # decided before the run is even looked up (Postgres refused the NUL with UNKNOWN).
    rejected = await rejection(stub.CancelRun(cancel))

    assert rejected.code == grpc.StatusCode.INVALID_ARGUMENT
    assert list(rejected.violations) == [field]
    assert await count_rows(server.store) == 0
