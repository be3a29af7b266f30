"""dispatch: one speaker per super-step, through the member pipeline.

Speaker boundaries are durability boundaries: a speaker's final is committed to the event
log before anyone hears of it, and a graceful stop is checked here, between speakers
(after yielding to the event loop so a stop request that just arrived is seen), so it
never cuts a reply in half. Finished speakers (known from the log) are skipped: resume
is a set difference.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from langgraph.runtime import Runtime

from roundtable.graph.context import Drained, GraphContext
from roundtable.graph.member import speak
from roundtable.graph.state import ConversationState, ReplyDict, StepDict, step_from_dict


def _next_open(steps: list[StepDict], done: set[str], cursor: int) -> int:
    while cursor < len(steps) and steps[cursor]["reply_id"] in done:
        cursor += 1
    return cursor


def _logged_replies(state: ConversationState, ctx: GraphContext) -> list[ReplyDict]:
    """State replies plus any the event log has and the checkpoint missed.

    A checkpoint is written a little after a speaker's final is committed to the log; a
    crash in between must not make that speaker speak twice.
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
    """Runs the next unfinished speaker of the plan."""
    ctx = runtime.context
    steps = state.get("steps", [])
    replies = _logged_replies(state, ctx)
    cursor = _next_open(steps, {r["reply_id"] for r in replies}, 0)
    if cursor >= len(steps):
        return {"cursor": cursor, "replies": replies}
    await asyncio.sleep(0)
    await ctx.stop.refresh()
    if ctx.stop.requested:
        raise Drained(ctx.stop.reason)
    outcome = await speak(ctx, step_from_dict(steps[cursor]), replies)
    return {
        "cursor": cursor + 1,
        "replies": [*replies, outcome.reply],
        "input_tokens": state.get("input_tokens", 0) + outcome.usage.input_tokens,
        "output_tokens": state.get("output_tokens", 0) + outcome.usage.output_tokens,
    }


def next_after_dispatch(state: ConversationState) -> Literal["dispatch", "convergence"]:
    """Loop while a planned speaker has not spoken."""
    steps = state.get("steps", [])
    done = {r["reply_id"] for r in state.get("replies", [])}
    if _next_open(steps, done, 0) < len(steps):
        return "dispatch"
    return "convergence"
