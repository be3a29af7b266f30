"""convergence: whether an open discussion needs another supervisor round.

Bounded by the session's round and speaker budgets; deterministic plans and fallbacks
always converge.
"""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime

from roundtable.domain.plan import PlanSource
from roundtable.graph.context import GraphContext
from roundtable.graph.state import ConversationState


async def convergence(
    state: ConversationState, runtime: Runtime[GraphContext]
) -> ConversationState:
    """Decides whether another round is wanted and allowed.

    `converged` stays the supervisor's own verdict, so a discussion cut short by its
    budget is reported as not converged.
    """
    budgets = runtime.context.request.snapshot.session.budgets
    more = (
        state.get("source") == PlanSource.SUPERVISOR.value
        and not state.get("converged", True)
        and state.get("round", 1) < budgets.max_rounds
        and len(state.get("steps", [])) < budgets.max_speakers
    )
    return {"another_round": more}


def next_after_convergence(state: ConversationState) -> Literal["supervisor", "propose_memory"]:
    """Another round, or on to memory proposals."""
    return "supervisor" if state.get("another_round") else "propose_memory"
