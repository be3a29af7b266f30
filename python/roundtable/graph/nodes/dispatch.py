"""dispatch: the plan's open speakers, one after another, through the member pipeline.

Speaker boundaries are durability boundaries: a speaker's final is committed to the event
log before anyone hears of it, and a graceful stop is checked here, between speakers
(after yielding to the event loop so a stop request that just arrived is seen), so it
never cuts a reply in half. Finished speakers (known from the log) are skipped: resume
is a set difference.

The whole round runs in one super-step. The speaker, not the super-step, is the unit of
resume (the event log holds every finished reply), so a super-step per speaker would only
add LangGraph's per-step cost (≈0.3 ms, ≈1 ms with a checkpoint) to every speaker and buy
nothing: a resumed dispatch re-runs from its start and skips the speakers the log has.
"""

from __future__ import annotations

import asyncio

from langgraph.runtime import Runtime

from roundtable.graph.context import Drained, GraphContext
from roundtable.graph.member import speak
from roundtable.graph.state import ConversationState, ReplyDict, step_from_dict


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
    steps = state.get("steps", [])
    replies = _logged_replies(state, ctx)
    done = {r["reply_id"] for r in replies}
    logged = ctx.prior.usage_of(r["reply_id"] for r in replies[len(state.get("replies", [])) :])
    input_tokens = state.get("input_tokens", 0) + logged.input_tokens
    output_tokens = state.get("output_tokens", 0) + logged.output_tokens
    for step in steps:
        if step["reply_id"] in done:
            continue
        await asyncio.sleep(0)
        await ctx.stop.refresh()
        if ctx.stop.requested:
            raise Drained(ctx.stop.reason)
        outcome = await speak(ctx, step_from_dict(step), replies)
        replies.append(outcome.reply)
        input_tokens += outcome.usage.input_tokens
        output_tokens += outcome.usage.output_tokens
    return {
        "replies": replies,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }
