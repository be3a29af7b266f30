"""Streams of runs no process executes: their stored events, then their end."""

from __future__ import annotations

from roundtable.domain.errors import RunContinued, RunOrphaned, StreamGap
from roundtable.domain.events import Envelope, RunCancelled, RunFailed
from roundtable.runs.live import Subscription
from roundtable.runs.log import EventLog
from roundtable.store.base import RunRecord, RunStatus


async def replay(
    log: EventLog, record: RunRecord, *, after_seq: int = 0, strict: bool = False
) -> Subscription:
    """The run's logged events after `after_seq`, then its end.

    Raises:
        StreamGap: (`strict`, what StreamRun asks) `after_seq` is past the run's last seq,
            or the log lost events.
    """
    events = await log.read(record.tenant, record.run_id)
    if strict:
        last = events[-1].seq if events else 0
        if after_seq > last:
            raise StreamGap(f"after_seq {after_seq} is past the run's last seq {last}")
        if [e.seq for e in events] != list(range(1, last + 1)):
            # Never skip silently: a gap means the log lost events the caller has not seen.
            raise StreamGap(f"the event log of run {record.run_id!r} is missing events")
    tail = [e for e in events if e.seq > after_seq]
    return stored_stream(record, tail, events[-1] if events else None)


def stored_stream(record: RunRecord, events: list[Envelope], last: Envelope | None) -> Subscription:
    """A stream of a run no process executes: its stored events, then its end.

    A log whose last execution died before its terminal event (a lease that ran out on a
    shared store, before any replica resumed the run) does not end OK, which a gateway
    would take for the run's end: it ends UNAVAILABLE (RunOrphaned: send the same
    StartRun, which resumes it). A run a later run continued ends FAILED_PRECONDITION
    (RunContinued) when its log does not end for good: no terminal event, a retryable
    run_failed or a run_cancelled (both say "send the same StartRun"), which would have
    the gateway send a StartRun that can only replay it.
    `events` are what the stream gives; `last` is the log's last event.
    """
    sub = Subscription(events, ended=True, thread_id=record.thread_id)
    log_ends = last is not None and last.terminal
    if record.status is RunStatus.CONTINUED:
        resumable = last is not None and (
            isinstance(last.event, RunCancelled)
            or (isinstance(last.event, RunFailed) and last.event.retryable)
        )
        if not log_ends or resumable:
            sub.error = RunContinued(f"run {record.run_id!r} by run {record.continued_by!r}")
    elif not log_ends:
        sub.error = RunOrphaned(record.run_id)
    return sub
