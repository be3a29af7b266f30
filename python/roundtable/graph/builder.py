"""Builds the conversation graph; the node list reads like DESIGN.md's diagram."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from roundtable.graph.context import GraphContext
from roundtable.graph.nodes.classify_directive import classify_directive, next_after_classify
from roundtable.graph.nodes.convergence import convergence, next_after_convergence
from roundtable.graph.nodes.deterministic_router import deterministic_router
from roundtable.graph.nodes.dispatch import dispatch, next_after_dispatch
from roundtable.graph.nodes.hydrate_context import hydrate_context
from roundtable.graph.nodes.propose_memory import propose_memory
from roundtable.graph.nodes.route_session import next_after_route, route_session
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


def traced(name: str, node: Callable[..., Awaitable[ConversationState]]) -> Any:
    """Wraps a node in a span named after it (`caller_node` = the node's name)."""
    wants_runtime = "runtime" in inspect.signature(node).parameters

    async def run(state: ConversationState, runtime: Runtime[GraphContext]) -> ConversationState:
        ctx = runtime.context
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
    -> dispatch (one speaker per super-step, looping) -> convergence -> (another round)
    supervisor | propose_memory -> END
    """
    graph = StateGraph(ConversationState, context_schema=GraphContext)
    graph.add_node("hydrate_context", traced("hydrate_context", hydrate_context))
    graph.add_node("route_session", traced("route_session", route_session))
    graph.add_node("classify_directive", traced("classify_directive", classify_directive))
    graph.add_node("deterministic_router", traced("deterministic_router", deterministic_router))
    graph.add_node("supervisor", traced("supervisor", supervisor))
    graph.add_node("dispatch", traced("dispatch", dispatch))
    graph.add_node("convergence", traced("convergence", convergence))
    graph.add_node("propose_memory", traced("propose_memory", propose_memory))

    graph.add_edge(START, "hydrate_context")
    graph.add_edge("hydrate_context", "route_session")
    graph.add_conditional_edges("route_session", next_after_route)
    graph.add_conditional_edges("classify_directive", next_after_classify)
    graph.add_edge("deterministic_router", "dispatch")
    graph.add_edge("supervisor", "dispatch")
    graph.add_conditional_edges("dispatch", next_after_dispatch)
    graph.add_conditional_edges("convergence", next_after_convergence)
    graph.add_edge("propose_memory", END)
    return graph.compile(checkpointer=checkpointer, name="ConversationGraph")
