"""The SQL both stores share, written once; each store renders it with its placeholder.

SQLite (qmark: `?`) and Postgres through psycopg (`%s`) run the same statements on the same
tables. What differs stays in the stores: the schema's types, how a dead owner's runs
are marked at start-up, and the names of LangGraph's checkpoint tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from roundtable.store.base import RUN_COLUMNS, RunRecord

_COLUMNS = ", ".join(RUN_COLUMNS)


@dataclass(frozen=True, slots=True)
class Statements:
    """The run registry's and event log's statements, for one placeholder style."""

    create_run: str
    get_run: str
    update_run: str
    append_event: str
    append_event_read_cancel: str
    append_event_owned: str
    read_events: str
    resumable_runs: str
    live_thread_runs: str
    claim_continuation: str
    continued_run: str
    acquire_lease: str
    renew_lease: str
    finish_run: str
    request_cancel: str

    @classmethod
    def with_placeholder(cls, p: str) -> Statements:
        """Every statement with `p` as its parameter placeholder."""
        return cls(
            create_run=(
                f"INSERT INTO rt_runs ({_COLUMNS}) VALUES ({','.join([p] * len(RUN_COLUMNS))}) "
                "ON CONFLICT (tenant, run_id) DO NOTHING"
            ),
            get_run=f"SELECT {_COLUMNS} FROM rt_runs WHERE tenant={p} AND run_id={p}",
            update_run=(
                f"UPDATE rt_runs SET status={p}, plan_json={p}, finished_reply_ids={p}, "
                f"last_seq={p}, updated_at={p} WHERE tenant={p} AND run_id={p}"
            ),
            append_event=(
                "INSERT INTO rt_events (tenant, run_id, seq, kind, body) "
                f"VALUES ({p},{p},{p},{p},{p})"
            ),
            append_event_read_cancel=(
                # One round trip: the append, and the run's cancel marks as of it.
                "WITH appended AS (INSERT INTO rt_events (tenant, run_id, seq, kind, body) "
                f"VALUES ({p},{p},{p},{p},{p})) "
                f"SELECT cancel_mode, cancel_reason FROM rt_runs WHERE tenant={p} AND run_id={p}"
            ),
            append_event_owned=(
                # The same, only while the row names the owner. FOR SHARE orders it with a
                # takeover's UPDATE of the owner: the append waits for it and then sees the
                # new owner, or the takeover waits for the append, whose row its log read
                # then sees. No row back: another replica owns the run, nothing written.
                "WITH run AS (SELECT cancel_mode, cancel_reason FROM rt_runs "
                f"WHERE tenant={p} AND run_id={p} AND owner={p} FOR SHARE), "
                "appended AS (INSERT INTO rt_events (tenant, run_id, seq, kind, body) "
                f"SELECT {p},{p},{p},{p},{p} FROM run) "
                "SELECT cancel_mode, cancel_reason FROM run"
            ),
            read_events=(
                f"SELECT seq, kind, body FROM rt_events WHERE tenant={p} AND run_id={p} "
                f"AND seq>{p} ORDER BY seq"
            ),
            resumable_runs=(
                f"SELECT {_COLUMNS} FROM rt_runs WHERE tenant={p} AND thread_id={p} "
                f"AND run_id<>{p} AND status IN ('cancelled','interrupted') "
                f"ORDER BY created_at DESC LIMIT {p}"
            ),
            live_thread_runs=(
                f"SELECT {_COLUMNS} FROM rt_runs WHERE tenant={p} AND thread_id={p} "
                f"AND run_id<>{p} AND owner<>{p} AND status IN ('running','queued') "
                f"AND lease_until>{p} ORDER BY created_at"
            ),
            claim_continuation=(
                f"UPDATE rt_runs SET status='continued', continued_by={p}, updated_at={p} "
                f"WHERE tenant={p} AND run_id={p} AND status IN ('cancelled','interrupted') "
                # Not while a replica resumes it (a StartRun retry of that run).
                f"AND (owner='' OR lease_until<{p})"
            ),
            continued_run=(
                f"SELECT {_COLUMNS} FROM rt_runs WHERE tenant={p} AND continued_by={p} LIMIT 1"
            ),
            acquire_lease=(
                f"UPDATE rt_runs SET owner={p}, lease_until={p} WHERE tenant={p} AND run_id={p} "
                f"AND (owner='' OR owner={p} OR lease_until<{p}) "
                # A run a continue turn took over is never run again, nor one that ended;
                # a failed one only when it failed retryably (the manager checks the log).
                "AND status IN ('running','queued','cancelled','interrupted','failed')"
            ),
            renew_lease=(
                f"UPDATE rt_runs SET lease_until={p} WHERE tenant={p} AND run_id={p} AND owner={p}"
            ),
            finish_run=(
                f"UPDATE rt_runs SET status={p}, plan_json={p}, finished_reply_ids={p}, "
                f"last_seq={p}, updated_at={p}, owner='', lease_until=0, cancel_mode='', "
                f"cancel_reason='' WHERE tenant={p} AND run_id={p} AND owner={p}"
            ),
            # Only a queued or running run takes a cancel: one recorded after the run ended
            # would stay on its row and stop its next resume at once.
            request_cancel=(
                f"UPDATE rt_runs SET cancel_mode={p}, cancel_reason={p} "
                f"WHERE tenant={p} AND run_id={p} AND status IN ('queued', 'running')"
            ),
        )


def update_params(record: RunRecord) -> tuple[Any, ...]:
    """The parameters of `update_run` (the caller has set `record.updated_at`)."""
    return (
        record.status.value,
        record.plan_json,
        json.dumps(record.finished_reply_ids),
        record.last_seq,
        record.updated_at,
        record.tenant,
        record.run_id,
    )


def finish_params(record: RunRecord, owner: str) -> tuple[Any, ...]:
    """The parameters of `finish_run` (the caller has set `record.updated_at`)."""
    return (*update_params(record), owner)


def acquire_params(
    tenant: str, run_id: str, owner: str, ttl_s: float, now: float
) -> tuple[Any, ...]:
    """The parameters of `acquire_lease`: take it when free, ours, or expired at `now`."""
    return (owner, now + ttl_s, tenant, run_id, owner, now)
