"""route_session: where the turn goes next.

The order of the checks is the point: "a plan already exists" comes before the kind of
turn, so a resumed open discussion goes straight to dispatch instead of asking the
supervisor for a second plan.

The node routes with `Command(goto=...)` rather than a conditional edge: LangGraph traces
a conditional edge's function as a run of its own (callback manager, metadata merge),
which measured ≈0.4 ms per routing decision here, as much as a whole super-step.
"""

from __future__ import annotations

from typing import Literal

from langgraph.types import Command

from roundtable.graph.state import ConversationState

Destination = Literal["dispatch", "classify_directive"]
DESTINATIONS: tuple[Destination, ...] = ("dispatch", "classify_directive")


def next_after_route(state: ConversationState) -> Destination:
    """Plan exists -> dispatch; otherwise classify the turn (single chats included)."""
    if state.get("steps"):
        return "dispatch"
    return "classify_directive"


async def route_session(state: ConversationState) -> Command[Destination]:
    """A routing point only: goes where `next_after_route` says."""
    return Command(goto=next_after_route(state))
