"""The store interface: a run registry and an append-only event log, keyed by tenant.

SQLite is the embedded default; a Postgres store implements the same protocol for
several replicas. Events are stored in their wire form (serialized `RunEvent`), so a
replay sends exactly the bytes that were sent live, with the same `seq`.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from langgraph.checkpoint.base import BaseCheckpointSaver

from roundtable.domain.tools import ToolCallStore


class RunStatus(StrEnum):
    """Where a run is in its life (mirrors the contract's RunStatus)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    CONTINUED = "continued"
    AWAITING_APPROVAL = "awaiting_approval"

    @property
    def is_terminal(self) -> bool:
        """Whether the run has ended (a cancelled or interrupted run may still resume)."""
        return self in _ENDED


_ENDED = frozenset(
    {
        RunStatus.SUCCEEDED,
        RunStatus.CANCELLED,
        RunStatus.INTERRUPTED,
        RunStatus.FAILED,
        RunStatus.CONTINUED,
    }
)

RESUMABLE = frozenset({RunStatus.CANCELLED, RunStatus.INTERRUPTED})
"""Runs that stopped before their end and resume on the same StartRun."""
ACTIVE = frozenset({RunStatus.RUNNING, RunStatus.QUEUED})
"""Runs that a process executes (or is about to)."""
LEASED = ACTIVE | {RunStatus.AWAITING_APPROVAL}
"""Runs a replica may hold under a lease: executing, or parked for approval and kept by
the replica that holds their snapshot."""


class LeaseLost(Exception):
    """Another replica took the run over: this one may write nothing more for it."""


class StoreUnavailable(Exception):
    """The store cannot be opened: a path that is no database file, a server not reached.

    Its message says why in words that name no secret (never a DSN's password); the
    opener (`store.factory.open_store`) names the store.
    """


@dataclass(slots=True, kw_only=True)
class RunRecord:
    """A run as the registry knows it (its fields are the registry's columns, see
    `roundtable.store.schema.RUNS`). The plan and the finished replies are not kept here:
    the event log says them (GetRun reads them from it)."""

    tenant: str
    run_id: str
    thread_id: str
    fingerprint: str
    status: RunStatus
    created_at: float
    updated_at: float
    last_seq: int = 0
    trace_context: str = ""
    """`<trace_id>-<span_id>` (hex) of the span that first ran the run: resumes link to it."""
    owner: str = ""
    """The replica executing the run ("" when none)."""
    lease_until: float = 0.0
    """Seconds since the epoch until which `owner` holds the run; renewed while it runs."""
    cancel_mode: str = ""
    """A cancel recorded for the owner to honour: "graceful" or "immediate" ("" when none)."""
    cancel_reason: str = ""
    continued_by: str = ""
    """For a run whose steps left a continue turn took over: that turn's run id."""
    turn_hash: str = ""
    """The hash of the user's words the run answers (`graph.directives.words_hash`): a
    continue turn finds them in its history ("" from a version that kept none)."""

    def leased_by_other(self, owner: str, now: float) -> bool:
        """Whether another replica holds a live lease on the run."""
        return bool(self.owner) and self.owner != owner and self.lease_until > now


@dataclass(frozen=True, slots=True)
class CancelMark:
    """A cancel recorded on a run's row, for the replica that owns the run to honour."""

    mode: str
    """"graceful" or "immediate"."""
    reason: str


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event of the log, in wire form."""

    seq: int
    kind: str
    body: bytes


class RunStore(ToolCallStore, Protocol):
    """What the runs layer needs from storage. Every call commits before it returns."""

    @property
    def checkpointer(self) -> BaseCheckpointSaver[str]:
        """LangGraph's checkpoint saver, in the same database."""
        ...

    async def create_run(self, record: RunRecord) -> bool:
        """Registers a new run; False when (tenant, run_id) exists already (another replica
        created it a moment ago)."""
        ...

    async def get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        """The run, or None when this tenant has no such run."""
        ...

    async def update_run(self, record: RunRecord) -> None:
        """Writes the run's status and last seq."""
        ...

    async def append_event(
        self, tenant: str, run_id: str, event: StoredEvent, *, owner: str | None = None
    ) -> CancelMark | None:
        """Commits one event to the log (write ahead: before anyone hears of it).

        A shared store also answers, from the same round trip, the cancel recorded on the
        run's row as of the append (None when there is none): the replica that owns the run
        learns of it at its next speaker boundary without a read of its own. A store no
        other process writes to answers None.

        With `owner`, a shared store appends only while the run's row names that owner,
        checked under a lock on the row in the same statement: a replica that lost its
        lease (paused past it, say) can never write into the log of the replica that took
        the run over. A store no other process writes to has no one to fence out.

        Raises:
            LeaseLost: the row names another owner; nothing was written.
        """
        ...

    async def read_events(self, tenant: str, run_id: str, after_seq: int) -> list[StoredEvent]:
        """The run's events with seq > after_seq, in order."""
        ...

    async def resumable_runs(
        self, tenant: str, thread_id: str, *, exclude_run_id: str = "", limit: int = 1
    ) -> list[RunRecord]:
        """The thread's most recent cancelled or interrupted runs (at most `limit`, newest
        first), other than `exclude_run_id` (a continue run looking for the run it
        continues)."""
        ...

    def thread_lock(self, tenant: str, thread_id: str) -> AbstractAsyncContextManager[None]:
        """Holds a thread against other replicas' StartRuns while one checks the thread's
        runs and records its own (a no-op where the store is not shared)."""
        ...

    async def claim_continuation(self, tenant: str, run_id: str, by_run_id: str) -> bool:
        """Marks a cancelled or interrupted run continued by `by_run_id`, atomically.

        False when the run is no longer cancelled or interrupted, or a replica holds a live
        lease on it (another continue turn, or a resume, got there first): two turns never
        take over the same steps, and a run being resumed is not taken over.
        """
        ...

    async def continued_run(self, tenant: str, by_run_id: str) -> RunRecord | None:
        """The run that `by_run_id` claimed with `claim_continuation`, if any."""
        ...

    async def live_thread_runs(
        self, tenant: str, thread_id: str, *, exclude_run_id: str, owner: str, now: float
    ) -> list[RunRecord]:
        """The runs of the thread, other than `exclude_run_id`, that replicas other than
        `owner` hold a live lease on (running, queued, or parked for approval), and those
        parked for approval under no live lease (their process ended: they wait for their
        StartRun again), oldest first: what the busy-thread policy looks at beyond the
        process's own runs, which it knows in memory."""
        ...

    async def mark_interrupted(self, *, expired_for_s: float = 0.0) -> list[tuple[str, str]]:
        """Marks runs left `running` or `queued` by a dead process as interrupted.

        A SQLite file belongs to one process, so every such run is marked; a shared store
        marks only runs whose lease has expired (at least `expired_for_s` ago). Returns the
        (tenant, run_id) of each.
        """
        ...

    async def acquire_lease(self, tenant: str, run_id: str, owner: str, ttl_s: float) -> bool:
        """Takes the run for `owner` unless another replica holds a live lease."""
        ...

    async def resume_parked(self, record: RunRecord, owner: str, ttl_s: float) -> bool:
        """Takes a run parked for approval back to running, for `owner` (`record` updated):
        only if it still waits where this process left it (its status, its last seq) and
        no other replica holds a live lease on it, or its row still says running under
        `owner` (a resume whose commit went unanswered, a park whose write failed). False
        otherwise: another replica took it over, or ended it."""
        ...

    async def renew_lease(self, tenant: str, run_id: str, owner: str, ttl_s: float) -> bool:
        """Extends `owner`'s lease; False when the lease was lost (another replica took over)."""
        ...

    async def finish_run(self, record: RunRecord, owner: str) -> bool:
        """Writes the run's final status and last seq, and gives it up (its lease and any
        cancel recorded for it), in one statement; only while `owner` holds it, so a replica
        that lost the run never overwrites its new owner's record. False when the row was not
        `owner`'s any more (nothing written)."""
        ...

    async def end_run(self, record: RunRecord, holder: str, event: StoredEvent) -> None:
        """Commits the run's terminal event and its final row together, in one transaction:
        the row takes `record.status` and the event's seq, and gives the run up as
        `finish_run` does, while `holder` holds it. Both or neither: a crash leaves no log
        that ended under a row still running, and a stream that ends with the event ends
        after the row says so (a StartRun of the thread sent on seeing it finds the
        thread free).

        Raises:
            LeaseLost: the row names another owner; nothing was written.
        """
        ...

    async def park_run(
        self, record: RunRecord, holder: str, owner: str, lease_until: float
    ) -> bool:
        """Marks the run waiting for approval (with its last seq), while `holder` holds it;
        `owner` and `lease_until` say who keeps it parked ("" and 0: nobody, on a store
        only this process uses). False when the row was not `holder`'s any more."""
        ...

    async def renew_parked(self, owner: str, ttl_s: float) -> set[tuple[str, str]]:
        """Extends the leases of every run `owner` keeps parked; returns their (tenant,
        run_id): a run this process holds parked that is not among them is another
        replica's now."""
        ...

    async def decided_parked(self, owner: str) -> list[tuple[str, str, bool]]:
        """(tenant, run_id, whether a cancel is recorded) of the runs `owner` keeps parked
        that have a decision or a cancel recorded (by any replica) to act on."""
        ...

    async def request_cancel(self, tenant: str, run_id: str, mode: str, reason: str) -> bool:
        """Records a cancel for whichever replica runs the run; False (nothing recorded)
        when the run is no longer queued or running."""
        ...

    @property
    def shared(self) -> bool:
        """Whether other processes may run this store's runs (leases and remote cancels matter)."""
        ...

    async def close(self) -> None:
        """Releases connections."""
        ...
