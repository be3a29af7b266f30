"""graph.direct: nodes run in the caller's task unless a LangChain callback handler listens."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, TypedDict

import pytest
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.config import get_config
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime, get_runtime
from roundtable.graph.builder import NODES, build_conversation_graph
from roundtable.graph.direct import DirectNode, run_nodes_directly


class State(TypedDict, total=False):
    count: int
    tasks: list[int]
    seen: list[str]


@dataclass
class Context:
    label: str


async def first(state: State, runtime: Runtime[Context]) -> State:
    # What a node may ask LangGraph for must still be there in the caller's task.
    seen = [get_config()["metadata"]["langgraph_node"], get_runtime().context.label]
    return {"count": state["count"] + 1, "tasks": [id(asyncio.current_task())], "seen": seen}


async def second(state: State) -> State:
    if state["count"] > 5:
        raise ValueError("too many")
    return {"count": state["count"] + 1, "tasks": [*state["tasks"], id(asyncio.current_task())]}


def plain_graph(*, direct: bool) -> Any:
    """The small graph with and without the shortcut, for comparing what users see."""
    graph = StateGraph(State, context_schema=Context)
    graph.add_node("first", first)
    graph.add_node("second", second)
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    graph.add_edge("second", END)
    compiled = graph.compile()
    return run_nodes_directly(compiled) if direct else compiled


class NodeNames(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []

    async def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.names.append(kwargs.get("name", ""))


async def test_nodes_run_in_the_callers_task_with_their_config_and_runtime() -> None:
    async def invoke() -> tuple[dict[str, Any], int]:
        result = await plain_graph(direct=True).ainvoke({"count": 0}, context=Context("ctx"))
        return result, id(asyncio.current_task())

    result, caller = await asyncio.create_task(invoke())
    assert result["count"] == 2
    assert result["tasks"] == [caller, caller]
    assert result["seen"] == ["first", "ctx"]


async def test_a_callback_handler_still_sees_every_node_through_langgraphs_own_path() -> None:
    handler = NodeNames()
    result = await plain_graph(direct=True).ainvoke(
        {"count": 0}, config={"callbacks": [handler]}, context=Context("ctx")
    )
    assert result["count"] == 2 and result["seen"] == ["first", "ctx"]
    assert {"first", "second"} <= set(handler.names)
    # LangGraph's path starts each node in a task of its own.
    assert result["tasks"][0] != id(asyncio.current_task())


async def test_a_failing_node_raises_and_leaves_no_config_behind() -> None:
    with pytest.raises(ValueError, match="too many"):
        await plain_graph(direct=True).ainvoke({"count": 5}, context=Context("ctx"))
    assert var_child_runnable_config.get() is None


async def test_astream_events_sees_what_langgraph_alone_shows() -> None:
    async def node_events(direct: bool) -> list[tuple[str, str]]:
        graph = plain_graph(direct=direct)
        return [
            (e["event"], e["name"])
            async for e in graph.astream_events({"count": 0}, version="v2", context=Context("ctx"))
            if e["name"] in ("first", "second")
        ]

    with_shortcut = await node_events(True)
    assert with_shortcut == await node_events(False)
    assert ("on_chain_stream", "first") in with_shortcut


async def test_a_langchain_call_inside_a_node_keeps_its_own_name() -> None:
    handler = NodeNames()
    inner = RunnableLambda(lambda x: x, name="inner").with_config(callbacks=[handler])

    async def calls_inner(state: State) -> State:
        await inner.ainvoke(1)
        return {"count": state["count"] + 1}

    graph = StateGraph(State)
    graph.add_node("outer", calls_inner)
    graph.add_edge(START, "outer")
    graph.add_edge("outer", END)
    await run_nodes_directly(graph.compile()).ainvoke({"count": 0})
    assert handler.names == ["inner"]


def test_every_node_of_the_conversation_graph_runs_directly() -> None:
    graph = build_conversation_graph()
    assert set(NODES) <= set(graph.nodes)
    assert all(isinstance(graph.nodes[name].node, DirectNode) for name in NODES)
