"""route_session: where the turn goes next, decided at the end of hydrate_context.

The order of the checks is the point: "a plan already exists" comes before the kind of
turn, so a resumed open discussion goes straight to dispatch instead of asking the
supervisor for a second plan. A turn with no plan yet is classify_directive's to route.
"""

from __future__ import annotations

from typing import Literal

from roundtable.graph.context import GraphContext
from roundtable.graph.state import ConversationState

Destination = Literal["dispatch", "classify_directive"]
LABELS = {"dispatch": "plan exists"}
"""The destination that ends the decision here, as the graph's drawing labels it."""


def next_after_route(state: ConversationState) -> Destination:
    """Plan exists -> dispatch; otherwise classify the turn (single chats included)."""
    if state.get("steps"):
        return "dispatch"
    return "classify_directive"


async def route_session(state: ConversationState, ctx: GraphContext) -> Destination:
    """A routing point only: goes where `next_after_route` says."""
    return next_after_route(state)
