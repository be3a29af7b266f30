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
    """Decides whether the discussion has converged."""
    budgets = runtime.context.request.snapshot.session.budgets
    more = (
        state.get("source") == PlanSource.SUPERVISOR.value
        and not state.get("converged", True)
        and state.get("round", 1) < budgets.max_rounds
        and len(state.get("steps", [])) < budgets.max_speakers
    )
    return {"converged": not more}


def next_after_convergence(state: ConversationState) -> Literal["supervisor", "propose_memory"]:
    """Another round, or on to memory proposals."""
    return "propose_memory" if state.get("converged", True) else "supervisor"
