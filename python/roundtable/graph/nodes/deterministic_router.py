"""deterministic_router: turns a directive into a plan, in code.

Count-off gives every member, in roster order, an immutable task with its number in
it; @all gives everybody the turn in roster order; @mentions in the order written;
continue takes over the steps an earlier run left, with their original reply ids.
"""

from __future__ import annotations

from langgraph.runtime import Runtime

from roundtable.domain.events import PlanCreated
from roundtable.domain.plan import DirectiveKind, PlanSource, PlanStep, reply_id_for
from roundtable.domain.snapshot import SessionKind
from roundtable.graph import tasks
from roundtable.graph.concurrency import all_at_once
from roundtable.graph.context import GraphContext
from roundtable.graph.countoff import count_off_task
from roundtable.graph.state import ConversationState, step_to_dict

COUNT_OFF_TOKENS = 32
_TASKS = {
    DirectiveKind.SINGLE: tasks.ANSWER,
    DirectiveKind.MENTION: tasks.MENTIONED,
    DirectiveKind.ALL: tasks.EVERYONE,
}


def deterministic_steps(ctx: GraphContext) -> tuple[list[PlanStep], str]:
    """The steps of a deterministic directive, and a reason when there are none."""
    directive = ctx.directive
    run_id = ctx.request.context.run_id
    budgets = ctx.request.snapshot.session.budgets
    if directive.kind is DirectiveKind.STOP:
        return [], ""
    if directive.kind is DirectiveKind.CONTINUE:
        if ctx.continuation is None:
            if ctx.request.snapshot.session.kind is SessionKind.SINGLE:
                # In a one-to-one chat "go on" asks the assistant to say more: it answers.
                return [
                    PlanStep(
                        index=0,
                        member_id=ctx.request.snapshot.session.primary_member_id,
                        reply_id=reply_id_for(run_id, 0),
                        task=_TASKS[DirectiveKind.SINGLE],
                        token_budget=budgets.max_output_tokens,
                    )
                ], "nothing to continue: answered as a message"
            return [], "nothing to continue"
        # A member who left the session since cannot take their step: it is dropped, and
        # the reason says whose.
        present = {m.member_id for m in ctx.request.snapshot.members}
        steps = [s for s in ctx.continuation.steps if s.member_id in present]
        gone = [s.member_id for s in ctx.continuation.steps if s.member_id not in present]
        return steps, f"no longer in the session: {', '.join(gone)}" if gone else ""
    members = directive.member_ids[: budgets.max_speakers]
    # The contract cuts a count-off, @all or @mentions to max_speakers; the plan says so.
    cut = (
        f"cut to max_speakers: {len(members)} of {len(directive.member_ids)} members"
        if len(members) < len(directive.member_ids)
        else ""
    )
    if directive.kind is DirectiveKind.COUNT_OFF:
        total = len(members)
        return [
            PlanStep(
                index=i,
                member_id=member_id,
                reply_id=reply_id_for(run_id, i),
                task=count_off_task(i + 1, total),
                token_budget=min(COUNT_OFF_TOKENS, budgets.max_output_tokens),
                count_off_number=i + 1,
            )
            for i, member_id in enumerate(members)
        ], cut
    task = _TASKS[directive.kind]
    return [
        PlanStep(
            index=i,
            member_id=member_id,
            reply_id=reply_id_for(run_id, i),
            task=task,
            token_budget=budgets.max_output_tokens,
        )
        for i, member_id in enumerate(members)
    ], cut


async def deterministic_router(
    state: ConversationState, runtime: Runtime[GraphContext]
) -> ConversationState:
    """Builds and announces the plan of a deterministic directive."""
    ctx = runtime.context
    if ctx.prior.planned(1) is not None:
        # An earlier execution announced this plan; the log has it. Never plan twice.
        return {"steps": [step_to_dict(s) for s in ctx.prior.steps], "round": 1, "converged": True}
    steps, reason = deterministic_steps(ctx)
    if ctx.directive.kind is not DirectiveKind.CONTINUE:
        # A continued plan keeps the groups its steps had.
        steps = all_at_once(steps, ctx.request.snapshot.session)
    continued = ctx.directive.kind is DirectiveKind.CONTINUE and ctx.continuation is not None
    await ctx.sink.emit(
        PlanCreated(
            directive=ctx.directive.kind,
            source=PlanSource.CONTINUED if continued else PlanSource.DETERMINISTIC,
            steps=tuple(steps),
            round=1,
            fallback_reason=reason,
            continued_run_id=ctx.continuation.run_id if continued and ctx.continuation else "",
        )
    )
    return {"steps": [step_to_dict(s) for s in steps], "round": 1, "converged": True}
