"""The SQL both stores share, written once with named parameters (`:tenant`).

SQLite (sqlite3 takes `:name` as it stands) and Postgres through psycopg (`%(name)s`) run
the same statements on the same tables (`roundtable.store.schema`): `Statements.for_dialect`
renders them in a dialect's parameter style, and every statement takes a dict. What differs
stays in the stores: how a dead owner's runs are marked at start-up, and Postgres's appends
that read the run's cancel and fence out a replica that lost the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from roundtable.store.base import RunRecord, RunStatus, StoredEvent
from roundtable.store.schema import EVENTS, LIVE_STATUS, RUNS, Dialect

RUN_COLUMNS = RUNS.column_names
"""The registry's columns, as every SELECT of runs lists them (`run_from_row`'s order)."""

_RUNS = ", ".join(RUN_COLUMNS)
EVENT_COLUMNS = ", ".join(EVENTS.column_names)
EVENT_VALUES = ", ".join(f":{c}" for c in EVENTS.column_names)
"""An event's parameters, in EVENT_COLUMNS' order (`event_params` gives their values)."""


@dataclass(frozen=True, slots=True)
class Statements:
    """The run registry's and event log's statements, in one parameter style."""

    create_run: str
    get_run: str
    update_run: str
    append_event: str
    read_events: str
    resumable_runs: str
    live_thread_runs: str
    claim_continuation: str
    continued_run: str
    acquire_lease: str
    resume_parked: str
    renew_lease: str
    finish_run: str
    request_cancel: str
    park_run: str
    renew_parked: str
    decided_parked: str

    @classmethod
    def for_dialect(cls, dialect: Dialect) -> Statements:
        """Every statement with the dialect's parameters."""
        return cls(**{f.name: dialect.bind(getattr(_TEMPLATES, f.name)) for f in fields(cls)})


FINISH_RUN = (
    # `holder`, not `owner`: the record's own owner column is not what is checked.
    "UPDATE rt_runs SET status=:status, last_seq=:last_seq, updated_at=:updated_at, "
    "owner='', lease_until=0, cancel_mode='', cancel_reason='' "
    "WHERE tenant=:tenant AND run_id=:run_id AND owner=:holder"
)
"""A run's final row, written only while `holder` holds the run (`finish_params`)."""

_TEMPLATES = Statements(
    create_run=(
        f"INSERT INTO rt_runs ({_RUNS}) VALUES ({', '.join(f':{c}' for c in RUN_COLUMNS)}) "
        "ON CONFLICT (tenant, run_id) DO NOTHING"
    ),
    get_run=f"SELECT {_RUNS} FROM rt_runs WHERE tenant=:tenant AND run_id=:run_id",
    update_run=(
        "UPDATE rt_runs SET status=:status, last_seq=:last_seq, updated_at=:updated_at "
        "WHERE tenant=:tenant AND run_id=:run_id"
    ),
    append_event=f"INSERT INTO rt_events ({EVENT_COLUMNS}) VALUES ({EVENT_VALUES})",
    read_events=(
        "SELECT seq, kind, body FROM rt_events WHERE tenant=:tenant AND run_id=:run_id "
        "AND seq>:after_seq ORDER BY seq"
    ),
    resumable_runs=(
        f"SELECT {_RUNS} FROM rt_runs WHERE tenant=:tenant AND thread_id=:thread_id "
        "AND run_id<>:exclude_run_id AND status IN ('cancelled','interrupted') "
        "ORDER BY created_at DESC LIMIT :limit"
    ),
    # The status condition is rt_runs_thread_live's, word for word: the index holds only
    # such runs, so a thread of a thousand turns is not read a thousand rows deep.
    live_thread_runs=(
        f"SELECT {_RUNS} FROM rt_runs WHERE tenant=:tenant AND thread_id=:thread_id "
        f"AND {LIVE_STATUS} AND run_id<>:exclude_run_id "
        "AND ((owner<>:owner AND lease_until>:now) "
        "OR (status='awaiting_approval' AND lease_until<=:now)) ORDER BY created_at"
    ),
    claim_continuation=(
        "UPDATE rt_runs SET status='continued', continued_by=:by_run_id, updated_at=:now "
        "WHERE tenant=:tenant AND run_id=:run_id AND status IN ('cancelled','interrupted') "
        # Not while a replica resumes it (a StartRun retry of that run).
        "AND (owner='' OR lease_until<:now)"
    ),
    continued_run=(
        f"SELECT {_RUNS} FROM rt_runs WHERE tenant=:tenant AND continued_by=:by_run_id LIMIT 1"
    ),
    acquire_lease=(
        "UPDATE rt_runs SET owner=:owner, lease_until=:lease_until "
        "WHERE tenant=:tenant AND run_id=:run_id "
        "AND (owner='' OR owner=:owner OR lease_until<:now) "
        # A run a continue turn took over is never run again, nor one that ended;
        # a failed one only when it failed retryably (the manager checks the log).
        "AND status IN ('running','queued','cancelled','interrupted','failed','awaiting_approval')"
    ),
    # A parked run goes on where it waits, and only there: still waiting, its log where the
    # parking process left it (no other replica took it over and wrote on), and not under
    # another replica's live lease. An acquire_lease would also take a run another replica
    # ended meanwhile (cancelled, failed), and the run would go on after its end. A row
    # still `running` under this owner is ours too: an earlier resume whose commit went
    # unanswered, or a park whose write failed.
    resume_parked=(
        "UPDATE rt_runs SET status='running', owner=:owner, lease_until=:lease_until, "
        "updated_at=:now WHERE tenant=:tenant AND run_id=:run_id AND last_seq=:last_seq "
        "AND ((status='awaiting_approval' AND (owner='' OR owner=:owner OR lease_until<:now)) "
        "OR (status='running' AND owner=:owner))"
    ),
    renew_lease=(
        "UPDATE rt_runs SET lease_until=:lease_until "
        "WHERE tenant=:tenant AND run_id=:run_id AND owner=:owner"
    ),
    finish_run=FINISH_RUN,
    # Only a queued, running or waiting run takes a cancel: one recorded after the run
    # ended would stay on its row and stop its next resume at once.
    request_cancel=(
        "UPDATE rt_runs SET cancel_mode=:cancel_mode, cancel_reason=:cancel_reason "
        "WHERE tenant=:tenant AND run_id=:run_id "
        "AND status IN ('queued', 'running', 'awaiting_approval')"
    ),
    # A parked run keeps its owner (and a lease the owner renews) on a shared store: the
    # replica holding its snapshot resumes it; other replicas follow it.
    park_run=(
        "UPDATE rt_runs SET status='awaiting_approval', last_seq=:last_seq, "
        "updated_at=:updated_at, owner=:owner, lease_until=:lease_until "
        "WHERE tenant=:tenant AND run_id=:run_id AND owner=:holder"
    ),
    renew_parked=(
        "UPDATE rt_runs SET lease_until=:lease_until "
        "WHERE owner=:owner AND status='awaiting_approval' RETURNING tenant, run_id"
    ),
    # The runs parked by `owner` with a decision on one of their calls, or a cancel,
    # recorded elsewhere; and whether a cancel is.
    decided_parked=(
        "SELECT r.tenant, r.run_id, CASE WHEN r.cancel_mode<>'' THEN 1 ELSE 0 END "
        "FROM rt_runs r WHERE r.owner=:owner "
        "AND r.status='awaiting_approval' AND (r.cancel_mode<>'' OR EXISTS ("
        "SELECT 1 FROM rt_tool_calls c WHERE c.tenant=r.tenant AND c.run_id=r.run_id "
        "AND c.needs_approval=1 AND c.verdict<>'' AND c.status='requested'))"
    ),
)


def run_params(record: RunRecord) -> dict[str, Any]:
    """A record as the parameters of `create_run` and `update_run` (by column name)."""
    params = {name: getattr(record, name) for name in RUN_COLUMNS}
    params["status"] = record.status.value
    return params


def run_from_row(row: Sequence[Any]) -> RunRecord:
    """The record of a row of RUN_COLUMNS, in their order."""
    values = dict(zip(RUN_COLUMNS, row, strict=True))
    values["status"] = RunStatus(values["status"])
    return RunRecord(**values)


def finish_params(record: RunRecord, owner: str) -> dict[str, Any]:
    """The parameters of `finish_run`: only while `owner` holds the run (the caller has set
    `record.updated_at`)."""
    return {**run_params(record), "holder": owner}


def end_params(record: RunRecord, holder: str, event: StoredEvent) -> dict[str, Any]:
    """The parameters of a run's end: `finish_run`'s, with the terminal event's seq as the
    row's last seq, and the event's own (`append_event`'s)."""
    params = finish_params(record, holder)
    params.update(event_params(record.tenant, record.run_id, event.seq, event.kind, event.body))
    params["last_seq"] = event.seq
    return params


def acquire_params(
    tenant: str, run_id: str, owner: str, ttl_s: float, now: float
) -> dict[str, Any]:
    """The parameters of `acquire_lease`: take it when free, ours, or expired at `now`."""
    return {
        "tenant": tenant,
        "run_id": run_id,
        "owner": owner,
        "lease_until": now + ttl_s,
        "now": now,
    }


def event_params(tenant: str, run_id: str, seq: int, kind: str, body: bytes) -> dict[str, Any]:
    """The parameters of the `append_event` statements (with `owner` for the fenced one)."""
    return {"tenant": tenant, "run_id": run_id, "seq": seq, "kind": kind, "body": body}
