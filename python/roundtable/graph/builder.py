"""Builds the conversation graph; the node list reads like docs/architecture.md's life of a run."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from roundtable.graph.context import GraphContext
from roundtable.graph.direct import run_nodes_directly
from roundtable.graph.nodes import classify_directive as classify
from roundtable.graph.nodes import convergence as converge
from roundtable.graph.nodes import route_session as route
from roundtable.graph.nodes.deterministic_router import deterministic_router
from roundtable.graph.nodes.dispatch import dispatch
from roundtable.graph.nodes.hydrate_context import hydrate_context
from roundtable.graph.nodes.propose_memory import propose_memory
from roundtable.graph.nodes.supervisor import supervisor
from roundtable.graph.routing import Route, routed
from roundtable.graph.state import ConversationState
from roundtable.telemetry.attributes import run_correlation

NODES = (
    "hydrate_context",
    "deterministic_router",
    "supervisor",
    "dispatch",
    "propose_memory",
)
"""The graph's nodes: also the `caller_node` of their spans and audit records."""

ROUTES = ("route_session", "classify_directive", "convergence")
"""The graph's routing decisions (`graph.routing`), traced like nodes."""


def traced(name: str, node: Callable[..., Awaitable[Any]]) -> Any:
    """Wraps a node in a span named after it (`caller_node` = the node's name)."""
    wants_runtime = "runtime" in inspect.signature(node).parameters

    async def run(state: ConversationState, runtime: Runtime[GraphContext]) -> Any:
        ctx = runtime.context
        if ctx.tracer is None:
            return await (node(state, runtime) if wants_runtime else node(state))
        attributes = run_correlation(ctx.request.context, name)
        with ctx.tracer.start_as_current_span(name, attributes=attributes):
            if wants_runtime:
                return await node(state, runtime)
            return await node(state)

    run.__name__ = name
    return run


def build_conversation_graph(checkpointer: Any = None) -> Any:
    """Compiles the ConversationGraph.

    hydrate_context -> route_session: (plan exists) dispatch
                                      | classify_directive: deterministic_router | supervisor
    deterministic_router | supervisor -> dispatch (the round's speakers, one after another)
    dispatch -> convergence: (another round) supervisor | propose_memory -> END
                             | (nothing to remember) END

    The routing points are decided at the end of the node before them (`graph.routing`),
    in its super-step, so a count-off turn is three super-steps (hydrate_context,
    deterministic_router, dispatch) whatever the number of speakers; a turn with memories
    to propose adds propose_memory.
    Nodes run in the run's own task unless a LangChain callback handler listens
    (`graph.direct`).
    """
    classify_directive = Route(
        "classify_directive", classify.classify_directive, labels=classify.LABELS
    )
    route_session = Route(
        "route_session",
        route.route_session,
        labels=route.LABELS,
        then={"classify_directive": classify_directive},
    )
    convergence = Route("convergence", converge.convergence, labels=converge.LABELS)

    graph = StateGraph(ConversationState, context_schema=GraphContext)
    graph.add_node(
        "hydrate_context",
        routed(traced("hydrate_context", hydrate_context), route_session),
        destinations=route_session.destinations,
    )
    graph.add_node("deterministic_router", traced("deterministic_router", deterministic_router))
    graph.add_node("supervisor", traced("supervisor", supervisor))
    graph.add_node(
        "dispatch",
        routed(traced("dispatch", dispatch), convergence),
        destinations=convergence.destinations,
    )
    graph.add_node("propose_memory", traced("propose_memory", propose_memory))

    graph.add_edge(START, "hydrate_context")
    graph.add_edge("deterministic_router", "dispatch")
    graph.add_edge("supervisor", "dispatch")
    graph.add_edge("propose_memory", END)
    compiled = graph.compile(checkpointer=checkpointer, name="ConversationGraph")
    return run_nodes_directly(compiled)
