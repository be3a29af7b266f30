"""The event log as the runs layer reads it: decoded domain events with their seq.

The store keeps each event as the bytes the codec made when it was logged; this reader
decodes them into envelopes (their bytes kept, so a replay sends what was sent live) and
answers the questions a run's life asks of its log: what is left to do, whether the last
execution ended, whether it failed in a way the same StartRun may resume.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from roundtable.codec.events import decode, kind_of, seal
from roundtable.domain.errors import StreamGap
from roundtable.domain.events import Envelope, Event, RunFailed
from roundtable.domain.plan import PlanStep
from roundtable.runs.progress import Progress
from roundtable.store.base import RunRecord, RunStatus, RunStore, StoredEvent

RUN_INTERRUPTED = "RUN_INTERRUPTED"
"""run_failed's code for an execution that died before its end, written when it is found dead."""


class EventLog:
    """Reads and closes runs' event logs in one store."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    async def read(self, tenant: str, run_id: str, after_seq: int = 0) -> list[Envelope]:
        """The run's events with seq > after_seq, in order."""
        return [decode(e.body) for e in await self.store.read_events(tenant, run_id, after_seq)]

    async def read_up_to(
        self, tenant: str, run_id: str, after_seq: int, first_kept: Callable[[], int]
    ) -> list[Envelope]:
        """The events after `after_seq` up to those a live run keeps in memory, from
        `first_kept()` on: a moving mark, asked again after each read, since the run may
        go on, or park and let its events go from memory, while a read is on its way
        (review: a stream skipped the permission_required its read came too early for).

        Raises:
            StreamGap: the log lacks events before the mark (never skipped silently).
        """
        head: list[Envelope] = []
        while after_seq + 1 < first_kept():
            more = await self.read(tenant, run_id, after_seq)
            if not more:
                raise StreamGap(f"the event log of run {run_id!r} is missing events")
            head += more
            after_seq = more[-1].seq
        return head

    async def progress(self, record: RunRecord) -> Progress:
        """The run's progress as its log records it; sets `record.last_seq` from the log."""
        events = await self.read(record.tenant, record.run_id)
        if events:
            record.last_seq = events[-1].seq
        return Progress.of(events)

    async def steps_left(self, record: RunRecord) -> tuple[tuple[PlanStep, ...], Envelope | None]:
        """The run's steps not yet finished, and the last event of its log (one read)."""
        events = await self.read(record.tenant, record.run_id)
        return tuple(Progress.of(events).steps_left), events[-1] if events else None

    async def failed_retryably(self, record: RunRecord) -> bool:
        """Whether the run failed with `retryable` set (an internal error, not a deadline):
        the same StartRun then resumes it, as `RunFailed.retryable` promises, like a run a
        crash interrupted, finished speakers kept."""
        if record.status is not RunStatus.FAILED:
            return False
        last = await self.read(record.tenant, record.run_id, record.last_seq - 1)
        return bool(last) and isinstance(last[-1].event, RunFailed) and last[-1].event.retryable

    async def close_dead_execution(
        self,
        record: RunRecord,
        last_seq: int,
        *,
        retryable: bool,
        owner: str | None = None,
        continued_by: str = "",
    ) -> Envelope:
        """Appends the run_failed (RUN_INTERRUPTED) that a dead execution never wrote, so
        that every execution in a log ends in a terminal event, as the contract says."""
        why = (
            f"continued by run {continued_by}"
            if continued_by
            else "send the same StartRun to resume it (finished speakers are kept)"
        )
        failed = RunFailed(
            code=RUN_INTERRUPTED,
            message=f"the execution stopped before its end (its process ended); {why}",
            retryable=retryable,
        )
        return await self._append(record, last_seq + 1, failed, owner)

    async def end(self, record: RunRecord, event: Event, status: RunStatus, owner: str) -> None:
        """Appends a terminal event after the log's last (outside any execution) with the
        run's final row in `status`, in one transaction (`RunStore.end_run`); `record`
        takes them once written.

        Raises:
            LeaseLost: the row names another owner; nothing was written.
        """
        envelope = seal(record.run_id, record.last_seq + 1, time.time(), event)
        final = dataclasses.replace(record, status=status)
        await self.store.end_run(
            final, owner, StoredEvent(envelope.seq, kind_of(event), envelope.wire)
        )
        record.status, record.last_seq, record.updated_at = status, envelope.seq, final.updated_at

    async def _append(
        self, record: RunRecord, seq: int, event: Event, owner: str | None
    ) -> Envelope:
        envelope = seal(record.run_id, seq, time.time(), event)
        stored = StoredEvent(envelope.seq, kind_of(event), envelope.wire)
        await self.store.append_event(record.tenant, record.run_id, stored, owner=owner)
        return envelope

    async def close_if_open(self, tenant: str, run_id: str) -> None:
        """Closes the log of a run whose process died mid-execution (retryable), if its
        last event is not an end already; a run queued and never started has no log."""
        record = await self.store.get_run(tenant, run_id)
        events = await self.read(tenant, run_id)
        if record is None or not events or events[-1].terminal:
            return
        closed = await self.close_dead_execution(record, events[-1].seq, retryable=True)
        record.last_seq = closed.seq
        await self.store.update_run(record)
