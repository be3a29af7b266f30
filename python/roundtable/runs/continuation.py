"""A continue turn's claim on the steps an earlier stopped run of its thread left."""

from __future__ import annotations

from roundtable.domain.plan import run_of_reply
from roundtable.graph.context import Continuation
from roundtable.graph.directives import continued_text
from roundtable.runs.live import LiveRun
from roundtable.runs.log import EventLog
from roundtable.store.base import RunRecord

CONTINUE_LOOKBACK = 8
"""How many of a thread's latest stopped runs a continue turn looks through for steps left."""


async def claim_continuation(record: RunRecord, log: EventLog) -> Continuation | None:
    """The steps a continue turn takes over: what the thread's latest cancelled or
    interrupted run with steps left left, claimed for this run in the registry.

    The claim is atomic (two continue turns never take the same steps) and durable (a
    continue run that dies before its plan is logged finds its claim again on resume,
    and plans the same steps with the same reply ids). A run with nothing left (one
    stopped before it had a plan, say) is passed over, not claimed.
    """
    store = log.store
    claimed = await store.continued_run(record.tenant, record.run_id)
    if claimed is not None:
        steps, _ = await log.steps_left(claimed)
        return Continuation(run_id=claimed.run_id, steps=steps) if steps else None
    candidates = await store.resumable_runs(
        record.tenant, record.thread_id, exclude_run_id=record.run_id, limit=CONTINUE_LOOKBACK
    )
    for earlier in candidates:
        steps, last = await log.steps_left(earlier)
        if steps and await store.claim_continuation(record.tenant, earlier.run_id, record.run_id):
            if last is not None and not last.terminal:
                # Killed mid-way, then continued: its log gets the end it never wrote.
                # Not retryable: this run answers for it now. No owner fence: the claim
                # made it ours, and nobody else writes a continued run.
                await log.close_dead_execution(
                    earlier, last.seq, retryable=False, continued_by=record.run_id
                )
            return Continuation(run_id=earlier.run_id, steps=steps)
    return None


async def continued_words(live: LiveRun, log: EventLog, continuation: Continuation | None) -> str:
    """The user's words the steps a continue turn took over answer (`continued_text`),
    found by the hash the stopped run's row keeps; "" when the run continues none. The
    stopped run is the claim's, or, on a resume, the one its logged steps' reply ids name."""
    own = live.record.run_id
    stopped = continuation.run_id if continuation is not None else ""
    for step in () if stopped else live.progress.steps:
        if run_of_reply(step.reply_id) != own:
            stopped = run_of_reply(step.reply_id)
            break
    if not stopped:
        return ""
    record = await log.store.get_run(live.record.tenant, stopped)
    return continued_text(live.request.snapshot, record.turn_hash if record is not None else "")
