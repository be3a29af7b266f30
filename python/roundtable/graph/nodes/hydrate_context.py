"""hydrate_context: brings what is already known about the run into state.

It records the turn's directive (classified by the runs layer from the snapshot, a pure
function). A fresh run starts with no steps. A resumed run starts from its durable event
log: the steps already planned and the replies already final (with their tokens), so
nothing finished is done again.
"""

from __future__ import annotations

from langgraph.runtime import Runtime

from roundtable.domain.plan import Route
from roundtable.domain.snapshot import SessionKind
from roundtable.graph.context import GraphContext
from roundtable.graph.state import ConversationState, ReplyDict, step_to_dict


async def hydrate_context(
    state: ConversationState, runtime: Runtime[GraphContext]
) -> ConversationState:
    """Initializes the run's progress from the prior executions (if any)."""
    ctx = runtime.context
    prior = ctx.prior
    snapshot = ctx.request.snapshot
    replies = [
        ReplyDict(
            reply_id=step.reply_id,
            member_id=step.member_id,
            step=step.index,
            content=prior.finished[step.reply_id] or "",
            failed=prior.finished[step.reply_id] is None,
        )
        for step in prior.steps
        if step.reply_id in prior.finished
    ]
    # The last logged round's planner and verdict: a resumed discussion whose supervisor
    # asked for another round still gets it.
    source, converged = prior.verdict(prior.rounds)
    # The finished speakers' tokens, as their finals in the log report them, so the run's
    # usage still counts them. (A supervisor's or memory call's tokens are in no event: a
    # run resumed without its checkpoint reports only those of its new calls.)
    usage = prior.usage_of(r["reply_id"] for r in replies)
    state = ConversationState(
        # A plain str, as every state value (the checkpoint serializer needs no allow-list).
        route=(Route.SINGLE if snapshot.session.kind is SessionKind.SINGLE else Route.GROUP).value,
        round=prior.rounds,
        converged=converged,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        directive=ctx.directive.kind.value,
    )
    if prior.rounds:
        state["source"] = source.value
    if prior.steps:
        # Only a resumed run brings steps and replies: writing them empty would make a
        # fresh run's start a checkpoint boundary (store/checkpoints.py) for nothing.
        state["steps"] = [step_to_dict(s) for s in prior.steps]
        state["replies"] = replies
    return state
