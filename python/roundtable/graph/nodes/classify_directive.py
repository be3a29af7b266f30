"""classify_directive: records what the user's turn asked for. Code, never a model."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime

from roundtable.domain.plan import DirectiveKind
from roundtable.graph.context import GraphContext
from roundtable.graph.state import ConversationState


async def classify_directive(
    state: ConversationState, runtime: Runtime[GraphContext]
) -> ConversationState:
    """Stores the directive the runs layer classified (a pure function of the snapshot)."""
    return {"directive": runtime.context.directive.kind.value}


def next_after_classify(state: ConversationState) -> Literal["supervisor", "deterministic_router"]:
    """Only an open discussion goes to the supervisor."""
    if state.get("directive") == DirectiveKind.OPEN.value:
        return "supervisor"
    return "deterministic_router"
