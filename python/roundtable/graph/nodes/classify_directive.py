"""classify_directive: records what the user's turn asked for. Code, never a model."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from roundtable.domain.plan import DirectiveKind
from roundtable.graph.context import GraphContext
from roundtable.graph.state import ConversationState

Destination = Literal["supervisor", "deterministic_router"]
DESTINATIONS: tuple[Destination, ...] = ("supervisor", "deterministic_router")


def next_after_classify(directive: str) -> Destination:
    """Only an open discussion goes to the supervisor."""
    if directive == DirectiveKind.OPEN.value:
        return "supervisor"
    return "deterministic_router"


async def classify_directive(
    state: ConversationState, runtime: Runtime[GraphContext]
) -> Command[Destination]:
    """Stores the directive the runs layer classified (a pure function of the snapshot)."""
    directive = runtime.context.directive.kind.value
    return Command(update={"directive": directive}, goto=next_after_classify(directive))
