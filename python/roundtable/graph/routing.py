"""The graph's routing decisions, run as conditional edges: no super-step of their own.

route_session, classify_directive and convergence only choose where the turn goes next.
As nodes, each cost a LangGraph super-step (task preparation, channel reads and writes,
an in-memory checkpoint: ≈0.15-0.3 ms here), so a count-off turn took seven super-steps
where four nodes do work. As a conditional edge, a decision runs in the writer of the
node before it, in the same super-step, and reads that node's update on top of the state.

LangGraph runs a plain function given as an edge's path as a LangChain run of its own
(callback manager, metadata merge: ≈0.4 ms a decision measured here). `Route` is a
Runnable of its own instead, so nothing but the decision runs; when traces are exported it
opens a span named after the decision, a child of the run's span like a node's, so a trace
still shows every routing point of DESIGN.md's diagram with its `caller_node`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.runtime import get_runtime

from roundtable.graph.context import GraphContext
from roundtable.graph.state import ConversationState
from roundtable.telemetry.attributes import run_correlation

Decide = Callable[[ConversationState, GraphContext], Awaitable[str]]
"""A routing decision: the state (with the source node's update) and the run's context
give the name of the next node, or of the next `Route` to ask."""


class Route(Runnable[ConversationState, str]):
    """A named routing decision used as the path of a conditional edge.

    `then` hands the turn to further decisions: when `decide` answers a name in `then`,
    that route decides next (in a span of its own), as route_session hands a turn with no
    plan to classify_directive. `labels` names each final destination for the drawing
    (`roundtable graph`); `path_map` is what `add_conditional_edges` takes.
    """

    def __init__(
        self,
        name: str,
        decide: Decide,
        labels: Mapping[str, str] | None = None,
        then: Mapping[str, Route] | None = None,
    ) -> None:
        """`labels`: destination node -> what the edge means (drawn as "<name>: <label>")."""
        self.name = name
        self.decision = name
        """The decision's name: its span's name and `caller_node` (`name` is Runnable's)."""
        self.decide = decide
        self.labels = {node: f"{name}: {label}" for node, label in (labels or {}).items()}
        self.then = dict(then or {})

    @property
    def path_map(self) -> dict[Hashable, str]:
        """Label -> node, for every destination this route and those it hands to can give."""
        out: dict[Hashable, str] = {label: node for node, label in self.labels.items()}
        for route in self.then.values():
            out.update(route.path_map)
        return out

    def invoke(
        self, input: ConversationState, config: RunnableConfig | None = None, **_: Any
    ) -> str:
        """Roundtable runs its graph asynchronously only; a decision may await the store."""
        raise RuntimeError(f"route {self.decision} runs asynchronously only (ainvoke)")

    async def ainvoke(
        self, input: ConversationState, config: RunnableConfig | None = None, **_: Any
    ) -> str:
        """The label of the destination, decided in the run's context."""
        token = var_child_runnable_config.set(config) if config is not None else None
        try:
            ctx: GraphContext = get_runtime(GraphContext).context
        finally:
            if token is not None:
                var_child_runnable_config.reset(token)
        route: Route = self
        while True:
            if ctx.tracer is None:
                destination = await route.decide(input, ctx)
            else:
                attributes = run_correlation(ctx.request.context, route.decision)
                with ctx.tracer.start_as_current_span(route.decision, attributes=attributes):
                    destination = await route.decide(input, ctx)
            if destination not in route.then:
                return route.labels[destination]
            route = route.then[destination]
