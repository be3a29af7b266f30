"""The graph's routing decisions, taken at the end of the node before them: no super-step.

route_session, classify_directive and convergence only choose where the turn goes next.
As nodes, each cost a LangGraph super-step (task preparation, channel reads and writes,
an in-memory checkpoint: ≈0.15-0.3 ms here), so a count-off turn took seven super-steps
where four nodes do work. As conditional edges they cost no super-step, but LangGraph
hands an edge a fresh copy of every channel with the node's writes applied (≈50 µs a
decision here), and runs a plain function given as an edge's path as a LangChain run of
its own (≈0.4 ms a decision).

So `routed` runs the decision in the node's own task, right after the node, on the state
with the node's update laid over it (every state key holds its last value, so that is the
state the next node will see), and returns the node's update as a `Command` whose `goto`
is the decision. When traces are exported the decision gets a span named after it, a
child of the run's span like a node's (the node's span has ended by then), so a trace
still shows every routing point of the graph (docs/architecture.md) with its `caller_node`.

A decision may end the graph (`END`): the update then also sets `finished`, as the last
node does, so the checkpoint saver knows the run will never resume.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langgraph.graph import END
from langgraph.runtime import Runtime
from langgraph.types import Command

from roundtable.graph.context import GraphContext
from roundtable.graph.state import ConversationState
from roundtable.telemetry.attributes import run_correlation

Decide = Callable[[ConversationState, GraphContext], Awaitable[str]]
"""A routing decision: the state (with the source node's update) and the run's context
give the name of the next node, or of the next `Route` to ask."""

Node = Callable[[ConversationState, Runtime[GraphContext]], Awaitable[ConversationState]]


class Route:
    """A named routing decision.

    `then` hands the turn to further decisions: when `decide` answers a name in `then`,
    that route decides next (in a span of its own), as route_session hands a turn with no
    plan to classify_directive. `labels` says what each final destination means.
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
        self.decide = decide
        self.labels = {node: f"{name}: {label}" for node, label in (labels or {}).items()}
        self.then = dict(then or {})

    @property
    def destinations(self) -> dict[str, str]:
        """Node -> edge label, for every node this route and those it hands to can pick
        (what `add_node(destinations=...)` takes: `roundtable graph` draws them)."""
        out = dict(self.labels)
        for route in self.then.values():
            out.update(route.destinations)
        return out

    async def __call__(self, state: ConversationState, ctx: GraphContext) -> str:
        """The node the turn goes to next."""
        route: Route = self
        while True:
            if ctx.tracer is None:
                destination = await route.decide(state, ctx)
            else:
                attributes = run_correlation(ctx.request.context, route.name)
                with ctx.tracer.start_as_current_span(route.name, attributes=attributes):
                    destination = await route.decide(state, ctx)
            if destination not in route.then:
                if destination not in route.labels:
                    raise ValueError(f"route {route.name} chose unknown node {destination!r}")
                return destination
            route = route.then[destination]


def routed(node: Node, route: Route) -> Callable[..., Awaitable[Command[Any]]]:
    """`node`, then `route` on the state it leaves; its update goes on with the decision."""

    # `state` is typed Any: LangGraph takes a node's annotation for its input schema, and
    # the graph's own state schema is the one wanted.
    async def run(state: Any, runtime: Runtime[GraphContext]) -> Command[Any]:
        update = await node(state, runtime) or {}
        if not isinstance(update, dict):
            raise TypeError(f"a routed node returns a state update, not {type(update).__name__}")
        after: ConversationState = {**state, **update}
        destination = await route(after, runtime.context)
        if destination == END:
            update = {**update, "finished": True}
        return Command(update=update, goto=destination)

    run.__name__ = getattr(node, "__name__", "node")
    return run
