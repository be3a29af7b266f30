"""supervisor: the invisible director of an open discussion.

The session's default model (no persona, nothing user-visible) returns a structured plan,
validated against a pydantic schema and then against the snapshot. A model error or an
invalid plan in the first round falls back, by a pure function, to the primary member (an
open discussion names nobody: a turn that does is a mention); in a later round, whose
speakers have answered already, it ends the discussion with an empty round. Either way
`plan_created` says why.
"""

from __future__ import annotations

import asyncio

from langgraph.runtime import Runtime
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from roundtable.domain import prompt_sections
from roundtable.domain.errors import InvalidModelOutput, ModelError
from roundtable.domain.events import PlanCreated, TokenUsage
from roundtable.domain.plan import DirectiveKind, PlanSource, PlanStep, reply_id_for
from roundtable.domain.snapshot import Snapshot
from roundtable.graph import tasks
from roundtable.graph.concurrency import by_marker
from roundtable.graph.context import Drained, GraphContext
from roundtable.graph.directives import member_named
from roundtable.graph.member import call_meta
from roundtable.graph.prompts import supervisor_messages
from roundtable.graph.state import ConversationState, ReplyDict, step_to_dict, tokens_with
from roundtable.harness.request import ModelRequest
from roundtable.models.base import ChatCall, unheard


class SupervisorStep(BaseModel):
    """One speaker the supervisor chose."""

    model_config = ConfigDict(extra="ignore")

    member_id: str = Field(description="Id of a member from the roster.", max_length=128)
    task: str = Field(min_length=1, max_length=2000, description="What this member should do.")
    token_budget: int | None = Field(
        default=None, description="Output tokens this speaker may use (optional)."
    )
    builds_on_previous: bool = Field(
        default=False,
        description="True when this speaker should react to the replies before it in this "
        "round (it then waits for them); false when it can answer independently.",
    )

    @field_validator("token_budget", mode="wrap")
    @classmethod
    def _unset_when_unusable(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        """A budget that is no positive whole number is left unset (the session's limit),
        not a reason to drop the whole plan: a real model wrote 0 and 1000 (review); one
        past the session's limit is cut to it where the plan is followed."""
        if isinstance(value, bool):
            return None  # JSON's true is no number (pydantic would read it as 1)
        try:
            budget = handler(value)
        except ValidationError:
            return None
        return budget if budget is None or budget >= 1 else None


class SupervisorPlan(BaseModel):
    """Who speaks next, in order, with what task."""

    model_config = ConfigDict(title=prompt_sections.SUPERVISOR_PLAN_TOOL, extra="ignore")

    steps: list[SupervisorStep] = Field(description="Speakers in speaking order.")
    converged: bool = Field(description="True when no further round is needed.")


def by_id(plan: SupervisorPlan, snapshot: Snapshot) -> SupervisorPlan:
    """The plan with each step that names a member by display name or alias ("Kai",
    "@梅") naming it by id, as a mention would (outside testing: a real model wrote the
    members' names, and the plan fell back)."""
    known = {m.member_id for m in snapshot.members}
    for step in plan.steps:
        if step.member_id not in known:
            step.member_id = member_named(step.member_id, snapshot.members) or step.member_id
    return plan


def check_plan(plan: SupervisorPlan, snapshot: Snapshot, *, speakers_left: int) -> str:
    """Why a plan cannot be followed, or "" when it can."""
    if not plan.steps:
        return "invalid_plan: empty"
    known = {m.member_id for m in snapshot.members}
    unknown = sum(s.member_id not in known for s in plan.steps)
    if unknown:
        # Counted, never quoted: what a model wrote is no part of an event (the proto).
        return f"invalid_plan: {unknown} step(s) name no member"
    blank = [s.member_id for s in plan.steps if not s.task.strip()]
    if blank:
        return "invalid_plan: blank task for " + ", ".join(b[:64] for b in blank[:3])
    ids = [s.member_id for s in plan.steps]
    twice = sorted({m for m in ids if ids.count(m) > 1})
    if twice:
        # One round gives each member one turn; a second would answer itself.
        return "invalid_plan: duplicate member " + ", ".join(t[:64] for t in twice[:3])
    if len(plan.steps) > speakers_left:
        return f"invalid_plan: {len(plan.steps)} speakers over a budget of {speakers_left}"
    return ""


def fallback_members(snapshot: Snapshot, round_no: int) -> tuple[str, ...]:
    """Who speaks when the supervisor cannot plan: in the first round the primary member,
    who answers the message; in a later one nobody (outside review: the primary member
    answered the same message again, after answering it in round one)."""
    return (snapshot.session.primary_member_id,) if round_no == 1 else ()


async def supervisor(state: ConversationState, runtime: Runtime[GraphContext]) -> ConversationState:
    """Plans one round of an open discussion (or falls back)."""
    ctx = runtime.context
    snapshot = ctx.request.snapshot
    budgets = snapshot.session.budgets
    steps_so_far = state.get("steps", [])
    round_no = state.get("round", 0) + 1
    speakers_left = max(0, budgets.max_speakers - len(steps_so_far))
    if steps_so_far:
        await _stop_between_rounds(ctx)
    already = ctx.prior.planned(round_no)
    if already is not None:
        # This round's plan is in the log from an earlier execution: no second model call,
        # no second plan_created, and the verdict the supervisor gave then.
        source, converged = ctx.prior.verdict(round_no)
        return {
            "steps": [*steps_so_far, *(step_to_dict(s) for s in already)],
            "round": round_no,
            "converged": converged,
            "source": source.value,
        }
    plan, reason, usage = await _ask(ctx, state.get("replies", []), speakers_left, round_no)
    if plan is not None and not reason:
        source = PlanSource.SUPERVISOR
        limit = budgets.max_output_tokens
        chosen = [(s.member_id, s.task, min(s.token_budget or limit, limit)) for s in plan.steps]
        builds_on = [s.builds_on_previous for s in plan.steps]
        converged = plan.converged
    else:
        source = PlanSource.FALLBACK
        task = tasks.ANSWER
        members = fallback_members(snapshot, round_no)[: max(1, speakers_left)]
        chosen = [(m, task, budgets.max_output_tokens) for m in members]
        builds_on = [False] * len(chosen)  # the fallback's speakers are independent
        converged = True
    start, run_id = len(steps_so_far), ctx.request.context.run_id
    steps = [
        PlanStep(
            index=start + i,
            member_id=member_id,
            reply_id=reply_id_for(run_id, start + i),
            task=task,
            token_budget=tokens,
            round=round_no,
        )
        for i, (member_id, task, tokens) in enumerate(chosen)
    ]
    steps = by_marker(steps, builds_on, snapshot.session)
    await ctx.sink.emit(
        PlanCreated(
            directive=DirectiveKind.OPEN,
            source=source,
            steps=tuple(steps),
            round=round_no,
            fallback_reason=reason,
            converged=converged,
        )
    )
    return {
        "steps": [*steps_so_far, *(step_to_dict(s) for s in steps)],
        "round": round_no,
        "converged": converged,
        "source": source.value,
        **tokens_with(state, usage),
    }


async def _stop_between_rounds(ctx: GraphContext) -> None:
    """Between rounds is a speaker boundary too: a stop asked for during the round ends the
    run here, before the supervisor is asked for the next one (a resume asks it).

    Checked in this node, not in the convergence decision before it, so that the round's
    replies and usage are in the checkpoint the stop leaves. As in dispatch, after yielding
    to the event loop, so that a stop that just arrived is seen.
    """
    await asyncio.sleep(0)
    await ctx.stop.refresh()
    if ctx.stop.requested:
        raise Drained(ctx.stop.reason)


async def _ask(
    ctx: GraphContext, replies: list[ReplyDict], speakers_left: int, round_no: int
) -> tuple[SupervisorPlan | None, str, TokenUsage]:
    """The supervisor model's plan for the round, why it cannot be used ("" when it can),
    and the tokens the call took."""
    snapshot = ctx.request.snapshot
    ref = snapshot.session.default_model
    try:
        result = await ctx.harness.call(
            ModelRequest(
                ref=ref,
                call=ChatCall(
                    messages=supervisor_messages(
                        snapshot, replies, max_steps=speakers_left, round_no=round_no
                    ),
                    max_tokens=1024,
                    temperature=ref.temperature,
                    schema=SupervisorPlan,
                    choices=(("steps.member_id", tuple(m.member_id for m in snapshot.members)),),
                ),
                meta=call_meta(ctx, "supervisor"),
                credentials=ctx.credentials,
                on_text=unheard,
            )
        )
    except InvalidModelOutput as exc:
        # What did not parse (the form, the fields), never the model's text: a model that
        # answers but not in shape is the one failure the model's operator can act on.
        detail = f"supervisor_{exc.code.lower()}: {exc.detail}" if exc.detail else ""
        return None, detail or "supervisor_invalid_output", exc.spent
    except ModelError as exc:
        return None, f"supervisor_{exc.code.lower()}", exc.spent
    usage = TokenUsage(result.usage.input_tokens, result.usage.output_tokens)
    assert isinstance(result.parsed, SupervisorPlan)
    plan = by_id(result.parsed, snapshot)
    return plan, check_plan(plan, snapshot, speakers_left=speakers_left), usage
