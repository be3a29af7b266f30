"""classify_directive: routes a turn with no plan by what the user asked for. Code, never a model.

The directive itself is classified by the runs layer (a pure function of the snapshot,
`graph.directives`) and recorded in the state by hydrate_context.
"""

from __future__ import annotations

from typing import Literal

from roundtable.domain.plan import DirectiveKind
from roundtable.graph.context import GraphContext
from roundtable.graph.state import ConversationState

Destination = Literal["supervisor", "deterministic_router"]
LABELS = {
    "deterministic_router": "deterministic directive",
    "supervisor": "open discussion",
}
"""Each destination as the graph's drawing labels it."""


def next_after_classify(directive: str) -> Destination:
    """Only an open discussion goes to the supervisor."""
    if directive == DirectiveKind.OPEN.value:
        return "supervisor"
    return "deterministic_router"


async def classify_directive(state: ConversationState, ctx: GraphContext) -> Destination:
    """The supervisor for an open discussion, the deterministic router for everything else."""
    return next_after_classify(ctx.directive.kind.value)
