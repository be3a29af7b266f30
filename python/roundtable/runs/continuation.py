"""A continue turn's claim on the steps an earlier stopped run of its thread left."""

from __future__ import annotations

from roundtable.graph.context import Continuation
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
