"""Routing decisions taken at the end of the node before them: no super-step, a span each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from roundtable.domain.snapshot import RunContext
from roundtable.graph.builder import NODES, ROUTES, build_conversation_graph
from roundtable.graph.direct import run_nodes_directly
from roundtable.graph.routing import Route, routed


class State(TypedDict, total=False):
    kind: str
    seen: list[str]


@dataclass
class Request:
    context: RunContext


@dataclass
class Context:
    """The parts of GraphContext a route reads."""

    request: Request
    tracer: Any = None


def context(tracer: Any = None) -> Context:
    run = RunContext(thread_id="th", run_id="run", request_id="req", tenant="t")
    return Context(request=Request(run), tracer=tracer)


async def by_kind(state: Any, ctx: Any) -> str:
    return "open" if state["kind"] == "open" else "det"


async def has_plan(state: Any, ctx: Any) -> str:
    return "run" if state["kind"] == "planned" else "classify"


def graph(checkpointer: Any = None) -> Any:
    def node(name: str) -> Any:
        async def run(state: State) -> State:
            return {"seen": [*state.get("seen", []), name]}

        return run

    async def start(state: State, runtime: Any) -> State:
        return {"seen": ["start"]}

    classify = Route("classify", by_kind, labels={"det": "deterministic", "open": "open"})
    route = Route("route", has_plan, labels={"run": "plan exists"}, then={"classify": classify})
    builder = StateGraph(State, context_schema=Context)
    builder.add_node("start", routed(start, route), destinations=route.destinations)
    for name in ("det", "open", "run"):
        builder.add_node(name, node(name))
        builder.add_edge(name, END)
    builder.add_edge(START, "start")
    return run_nodes_directly(builder.compile(checkpointer=checkpointer))


@pytest.mark.parametrize(
    ("kind", "path"),
    [("planned", ["start", "run"]), ("open", ["start", "open"]), ("x", ["start", "det"])],
)
async def test_a_chain_of_decisions_takes_the_turn_where_the_last_one_says(kind, path) -> None:
    out = await graph().ainvoke({"kind": kind}, context=context())
    assert out["seen"] == path


async def test_a_decision_takes_no_super_step_of_its_own() -> None:
    saver = InMemorySaver()
    config = {"configurable": {"thread_id": "t1"}}
    await graph(saver).ainvoke({"kind": "open"}, config, context=context(), durability="sync")
    steps = [c.metadata["step"] for c in saver.list(config)]
    # The input (-1 and 0), then "start" (1) and "open" (2): both decisions ran inside
    # "start"'s super-step; as nodes they would have added two more.
    assert sorted(steps) == [-1, 0, 1, 2]


async def test_each_decision_taken_is_a_span_of_its_name() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    await graph().ainvoke({"kind": "open"}, context=context(provider.get_tracer("test")))
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["route", "classify"]
    assert {s.attributes["roundtable.caller_node"] for s in spans} == {"route", "classify"}
    assert all(s.attributes["roundtable.run_id"] == "run" for s in spans)


def test_the_conversation_graph_routes_with_decisions_not_nodes() -> None:
    compiled = build_conversation_graph()
    assert set(compiled.nodes) - {"__start__"} == set(NODES)
    assert not set(ROUTES) & set(compiled.nodes)
    drawn = compiled.get_graph().draw_mermaid()
    assert all(f"{name}: " in drawn for name in ROUTES), "edges are labelled by their decision"


async def test_a_decision_for_a_node_it_does_not_name_is_an_error() -> None:
    async def nowhere(state: Any, ctx: Any) -> str:
        return "nowhere"

    with pytest.raises(ValueError, match="unknown node 'nowhere'"):
        await Route("r", nowhere, labels={"det": "deterministic"})({"kind": "x"}, context())


async def test_a_decision_sees_the_update_of_the_node_before_it() -> None:
    seen: list[Any] = []

    async def look(state: Any, ctx: Any) -> str:
        seen.append(dict(state))
        return "det"

    async def node(state: State, runtime: Any) -> State:
        return {"seen": ["node"]}

    command = await routed(node, Route("r", look, labels={"det": "d"}))(
        {"kind": "x"}, type("Runtime", (), {"context": context()})()
    )
    assert seen == [{"kind": "x", "seen": ["node"]}]
    assert command.goto == "det" and command.update == {"seen": ["node"]}


async def test_a_decision_that_ends_the_graph_marks_it_finished() -> None:
    async def nothing_left(state: Any, ctx: Any) -> str:
        return END

    async def node(state: State, runtime: Any) -> State:
        return {"seen": ["node"]}

    command = await routed(node, Route("r", nothing_left, labels={END: "nothing left"}))(
        {"kind": "x"}, type("Runtime", (), {"context": context()})()
    )
    assert command.goto == END and command.update == {"seen": ["node"], "finished": True}
