"""Builds the conversation graph; the node list reads like DESIGN.md's diagram."""

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
from roundtable.graph.state import ConversationState
from roundtable.telemetry.attributes import run_correlation

NODES = (
    "hydrate_context",
    "route_session",
    "classify_directive",
    "deterministic_router",
    "supervisor",
    "dispatch",
    "convergence",
    "propose_memory",
)
"""Node names: also the `caller_node` of spans and audit records."""


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

    hydrate_context -> route_session -> (plan exists) dispatch
                                     -> classify_directive -> deterministic_router | supervisor
    -> dispatch (the round's speakers, one after another) -> convergence -> (another round)
    supervisor | propose_memory -> END

    A count-off turn is seven super-steps whatever the number of speakers. The three
    routing nodes choose their successor with `Command(goto=...)` (declared here as
    `destinations`, which is what `roundtable graph` draws); see route_session for why.
    Nodes run in the run's own task unless a LangChain callback handler listens
    (`graph.direct`).
    """
    graph = StateGraph(ConversationState, context_schema=GraphContext)
    graph.add_node("hydrate_context", traced("hydrate_context", hydrate_context))
    graph.add_node(
        "route_session",
        traced("route_session", route.route_session),
        destinations=route.DESTINATIONS,
    )
    graph.add_node(
        "classify_directive",
        traced("classify_directive", classify.classify_directive),
        destinations=classify.DESTINATIONS,
    )
    graph.add_node("deterministic_router", traced("deterministic_router", deterministic_router))
    graph.add_node("supervisor", traced("supervisor", supervisor))
    graph.add_node("dispatch", traced("dispatch", dispatch))
    graph.add_node(
        "convergence",
        traced("convergence", converge.convergence),
        destinations=converge.DESTINATIONS,
    )
    graph.add_node("propose_memory", traced("propose_memory", propose_memory))

    graph.add_edge(START, "hydrate_context")
    graph.add_edge("hydrate_context", "route_session")
    graph.add_edge("deterministic_router", "dispatch")
    graph.add_edge("supervisor", "dispatch")
    graph.add_edge("dispatch", "convergence")
    graph.add_edge("propose_memory", END)
    compiled = graph.compile(checkpointer=checkpointer, name="ConversationGraph")
    return run_nodes_directly(compiled)
