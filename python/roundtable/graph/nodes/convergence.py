"""convergence: whether an open discussion needs another supervisor round.

Decided at the end of dispatch (`graph.routing`). Bounded by the session's round and speaker budgets;
deterministic plans and fallbacks always converge. A converged turn goes on to
propose_memory, or ends the graph at once when it has nothing to remember (a count-off, a
stop, no reply): that node would only mark the graph finished, at the cost of a super-step.
"""

from __future__ import annotations

from typing import Literal, cast

from langgraph.graph import END

from roundtable.domain.plan import PlanSource
from roundtable.domain.snapshot import Budgets
from roundtable.graph.context import GraphContext
from roundtable.graph.nodes.propose_memory import nothing_to_remember
from roundtable.graph.state import ConversationState

Destination = Literal["supervisor", "propose_memory", "__end__"]
LABELS = {
    "supervisor": "another round",
    "propose_memory": "no more rounds",
    END: "nothing to remember",
}
"""Each destination as the graph's drawing labels it."""


def another_round(state: ConversationState, budgets: Budgets) -> bool:
    """An open discussion the supervisor has not closed, with rounds and speakers left."""
    return (
        state.get("source") == PlanSource.SUPERVISOR.value
        and not state.get("converged", True)
        and state.get("round", 1) < budgets.max_rounds
        and len(state.get("steps", [])) < budgets.max_speakers
    )


async def convergence(state: ConversationState, ctx: GraphContext) -> Destination:
    """Decides whether another round is wanted and allowed.

    `converged` stays the supervisor's own verdict, so a discussion cut short by its
    budget is reported as not converged.
    """
    if another_round(state, ctx.request.snapshot.session.budgets):
        return "supervisor"  # which checks for a stop first: between rounds is a boundary
    if nothing_to_remember(state, ctx):
        return cast(Destination, END)  # LangGraph types END as a plain str
    return "propose_memory"
