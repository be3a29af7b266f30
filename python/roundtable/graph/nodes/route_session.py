"""route_session: where the turn goes next.

The order of the checks is the point: "a plan already exists" comes before the kind of
turn, so a resumed open discussion goes straight to dispatch instead of asking the
supervisor for a second plan.
"""

from __future__ import annotations

from typing import Literal

from roundtable.graph.state import ConversationState


async def route_session(state: ConversationState) -> ConversationState:
    """A routing point only: the decision is `next_after_route`."""
    return {}


def next_after_route(state: ConversationState) -> Literal["dispatch", "classify_directive"]:
    """Plan exists -> dispatch; otherwise classify the turn (single chats included)."""
    if state.get("steps"):
        return "dispatch"
    return "classify_directive"
