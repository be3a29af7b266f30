"""dispatch: the plan's open speakers through the member pipeline, in plan order: one
after another, or a parallel group's speakers at once (`graph.concurrency`).

Speaker boundaries are durability boundaries: a speaker's final is committed to the event
log before anyone hears of it, and a graceful stop is checked here, before a speaker starts
(after yielding to the event loop so a stop request that just arrived is seen), so it
never cuts a reply in half: the speakers of a group already answering finish, and no new
one starts. Finished speakers (known from the log) are skipped: resume is a set
difference. An immediate stop cancels the run's task, and with it every speaker of a group.

The whole round runs in one super-step. The speaker, not the super-step, is the unit of
resume (the event log holds every finished reply), so a super-step per speaker would only
add LangGraph's per-step cost (≈0.3 ms, ≈1 ms with a checkpoint) to every speaker and buy
nothing: a resumed dispatch re-runs from its start and skips the speakers the log has.
"""

from __future__ import annotations

import asyncio

from langgraph.runtime import Runtime

from roundtable.domain.plan import PlanStep
from roundtable.graph.concurrency import batches
from roundtable.graph.context import Drained, GraphContext, Parked
from roundtable.graph.member import SpeakerOutcome, speak
from roundtable.graph.state import ConversationState, ReplyDict, step_from_dict, tokens_with


def _logged_replies(state: ConversationState, ctx: GraphContext) -> list[ReplyDict]:
    """State replies plus any the event log has and the checkpoint missed.

    A checkpoint is written a little after a speaker's final is committed to the log; a
    crash in between must not make that speaker speak twice. (Their tokens are not in the
    checkpoint's usage either: `dispatch` adds them.)
    """
    replies = list(state.get("replies", []))
    have = {r["reply_id"] for r in replies}
    for step in state.get("steps", []):
        rid = step["reply_id"]
        if rid in ctx.prior.finished and rid not in have:
            content = ctx.prior.finished[rid]
            replies.append(
                ReplyDict(
                    reply_id=rid,
                    member_id=step["member_id"],
                    step=step["index"],
                    content=content or "",
                    failed=content is None,
                )
            )
    return replies


async def dispatch(state: ConversationState, runtime: Runtime[GraphContext]) -> ConversationState:
    """Runs every planned speaker that has not spoken yet, in plan order."""
    ctx = runtime.context
    replies = _logged_replies(state, ctx)
    done = {r["reply_id"] for r in replies}
    spent = ctx.prior.usage_of(r["reply_id"] for r in replies[len(state.get("replies", [])) :])
    open_steps = [step_from_dict(s) for s in state.get("steps", []) if s["reply_id"] not in done]
    limit = ctx.request.snapshot.session.budgets.max_parallel_speakers
    group_of = {
        s["index"]: (s["round"], s.get("parallel_group", 0)) for s in state.get("steps", [])
    }
    for batch in batches(open_steps):
        await _boundary(ctx)
        seen = _before_group(replies, batch[0], group_of)
        if len(batch) == 1:
            outcomes: list[SpeakerOutcome | None] = [await speak(ctx, batch[0], seen)]
        else:
            outcomes = await _together(ctx, batch, seen, limit)
        for outcome in outcomes:
            if outcome is not None:
                replies.append(outcome.reply)
                spent += outcome.usage
        # A resumed group's logged replies came first: in plan order again, as a run that
        # never stopped has them (review: the next speakers, the next round's planner and
        # the memory proposal read them B, A, C; or B, C, A with one speaker left).
        replies.sort(key=_step_of)
        if None in outcomes:
            raise Drained(ctx.stop.reason)  # a stop came mid-group: its rest never started
    return {"replies": replies, **tokens_with(state, spent)}


def _step_of(reply: ReplyDict) -> int:
    return reply["step"]


def _before_group(
    replies: list[ReplyDict], first: PlanStep, group_of: dict[int, tuple[int, int]]
) -> list[ReplyDict]:
    """What a batch's speakers see: every reply but those of their own parallel group. A
    resumed group (after a crash, or a wait for approval) has some of its speakers logged
    already, and parallel speakers never see each other's replies."""
    if not first.parallel_group:
        return replies
    group = (first.round, first.parallel_group)
    return [r for r in replies if group_of.get(r["step"]) != group]


async def _boundary(ctx: GraphContext) -> None:
    """A speaker boundary: ends the run here when a graceful stop was asked for."""
    await asyncio.sleep(0)
    await ctx.stop.refresh()
    if ctx.stop.requested:
        raise Drained(ctx.stop.reason)


async def _together(
    ctx: GraphContext, batch: list[PlanStep], seen: list[ReplyDict], limit: int
) -> list[SpeakerOutcome | None]:
    """Runs a parallel group, at most `limit` speakers at once; each sees `seen` (the
    replies before the group), not the others'. Each final is committed and streamed as
    its speaker finishes. A speaker still waiting for a place when a graceful stop comes
    never starts (None in its place); the outcomes are in plan order."""
    places = asyncio.Semaphore(limit)
    waiting: list[Parked] = []

    async def one(position: int, step: PlanStep) -> SpeakerOutcome | None:
        async with places:
            if position >= limit:  # it waited for a place: that is a speaker boundary
                await ctx.stop.refresh()
                if ctx.stop.requested:
                    return None
            try:
                return await speak(ctx, step, seen)
            except Parked as parked:
                # It waits for a person; the others of the group finish their replies.
                waiting.append(parked)
                return None

    tasks = [asyncio.ensure_future(one(i, step)) for i, step in enumerate(batch)]
    try:
        outcomes = await asyncio.gather(*tasks)
        if waiting:
            keys = tuple(key for parked in waiting for key in parked.call_keys)
            raise Parked(keys, min(parked.expires_at for parked in waiting))
        return outcomes
    except Parked:
        raise
    except BaseException:
        # One speaker's unexpected error (or the store refusing an append) ends the group:
        # the others stop at once, as the run does.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
