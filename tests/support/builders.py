"""Builders of requests and readers of event streams, shared by the tests."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from typing import Any

from roundtable.v1 import events_pb2 as epb
from roundtable.v1 import orchestrator_service_pb2 as pb
from roundtable.v1 import snapshot_pb2 as spb

_ids = itertools.count(1)

DEFAULT_ROSTER = (
    ("a", "Alice", "A careful analyst."),
    ("b", "Bob", "A friendly builder."),
    ("c", "Carol", "A curious critic."),
    ("d", "Dave", "A quiet gardener."),
)


def member(member_id: str, name: str, persona: str = "", **kwargs: object) -> spb.Member:
    """One member."""
    return spb.Member(member_id=member_id, display_name=name, persona=persona, **kwargs)  # type: ignore[arg-type]


def start_request(
    text: str,
    *,
    kind: int = spb.SESSION_KIND_GROUP,
    members: Sequence[spb.Member] | None = None,
    primary: str = "",
    run_id: str = "",
    thread_id: str = "thread-1",
    tenant: str = "tenant-1",
    default_model: spb.ModelRef | None = None,
    credentials: dict[str, str] | None = None,
    mentions: Iterable[str] = (),
    mention_all: bool = False,
    options: pb.RunOptions | None = None,
    budgets: spb.Budgets | None = None,
) -> pb.StartRunRequest:
    """A valid StartRunRequest around the user's text (the default roster: a, b, c, d)."""
    roster = list(members) if members is not None else [member(*m) for m in DEFAULT_ROSTER]
    session = spb.Session(
        session_id="s-1",
        kind=kind,  # type: ignore[arg-type]
        primary_member_id=primary or roster[0].member_id,
    )
    if default_model is not None:
        session.default_model.CopyFrom(default_model)
    if budgets is not None:
        session.budgets.CopyFrom(budgets)
    request = pb.StartRunRequest(
        context=spb.RunContext(
            run_id=run_id or f"run-{next(_ids)}",
            thread_id=thread_id,
            request_id=f"req-{next(_ids)}",
            tenant=tenant,
        ),
        snapshot=spb.Snapshot(
            session=session,
            members=roster,
            user_turn=spb.UserTurn(text=text, mentions=list(mentions), mention_all=mention_all),
        ),
        credentials=credentials or {},
    )
    if options is not None:
        request.options.CopyFrom(options)
    return request


def model_ref(provider: str, model: str = "m", **kwargs: object) -> spb.ModelRef:
    """A model ref to one target."""
    return spb.ModelRef(target=spb.ModelTarget(provider=provider, model=model, **kwargs))  # type: ignore[arg-type]


async def collect(
    stream: AsyncIterable[pb.StartRunResponse | pb.StreamRunResponse],
) -> list[epb.RunEvent]:
    """Every event of a stream, in order."""
    return [response.event async for response in stream]


def of_kind(events: Iterable[epb.RunEvent], kind: str) -> list[epb.RunEvent]:
    """The events with this payload."""
    return [e for e in events if e.WhichOneof("payload") == kind]


def finals(events: Iterable[epb.RunEvent]) -> list[epb.AssistantFinal]:
    """The assistant_final payloads, in order."""
    return [e.assistant_final for e in of_kind(events, "assistant_final")]


def kinds(events: Iterable[epb.RunEvent]) -> list[str]:
    """Payload names (deltas left out), in order."""
    return [k for e in events if (k := e.WhichOneof("payload") or "") != "assistant_delta"]


def last_execution(events: Sequence[epb.RunEvent]) -> list[epb.RunEvent]:
    """The stream's events from its last run_started on: what the last execution of the
    run did (StartRun streams a resumed run from seq 1, earlier executions first)."""
    starts = [i for i, e in enumerate(events) if e.WhichOneof("payload") == "run_started"]
    return list(events[starts[-1] :]) if starts else list(events)


def durable_seqs(events: Iterable[epb.RunEvent]) -> list[int]:
    """The seq of every event but a delta, in order."""
    return [e.seq for e in events if e.WhichOneof("payload") != "assistant_delta"]


async def read_until(
    call: AsyncIterable[Any], predicate: Callable[[epb.RunEvent], bool]
) -> list[epb.RunEvent]:
    """Reads a StartRun/StreamRun stream until an event matches (inclusive)."""
    events = []
    async for response in call:
        events.append(response.event)
        if predicate(response.event):
            return events
    raise AssertionError("stream ended before the expected event")
