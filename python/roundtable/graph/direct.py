"""Runs each node of a compiled graph in its caller's task when nobody listens to callbacks.

LangGraph invokes a node as a `RunnableSeq` of the node and its channel writers. That
sequence opens a LangChain callback run (a callback manager, `on_chain_start`, a child
manager per step, `on_chain_end`) and starts the node in a new asyncio task, so that a
LangChain tracer sees it as a run of its own. Roundtable traces with OpenTelemetry (a
span per node, `graph.builder.traced`), so when no LangChain callback handler is
configured all of that is work for nobody: measured here, ≈1.0-1.4 ms of a 4-speaker
count-off turn (then 7 nodes) served over gRPC, 13-17 % of the turn.

`DirectNode` runs the same steps with the same config, in order, in the caller's task,
with the node's config set as the current runnable config (so `get_config()`,
`get_runtime()` and LangChain calls inside a node behave as before). When a handler is
configured (LangSmith tracing, `astream_events`, a handler passed in `config`), it hands
the call, streamed or not, to LangGraph's own sequence unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.pregel import Pregel

Graph = TypeVar("Graph", bound=Pregel[Any, Any, Any, Any])


def has_handlers(config: RunnableConfig | None) -> bool:
    """Whether a LangChain callback handler would see this call (no config: maybe)."""
    if config is None:
        return True
    callbacks = config.get("callbacks")
    if callbacks is None:
        return False
    if isinstance(callbacks, BaseCallbackManager):
        return bool(callbacks.handlers)
    return bool(callbacks)


class DirectNode(Runnable[Any, Any]):
    """A node's step sequence, run in the caller's task when no handler is configured.

    The node shares the run task's context (no copy per node): a node must undo any
    context variable it sets, as Roundtable's do (spans are context managers).
    """

    def __init__(self, sequence: Any) -> None:
        """`sequence`: LangGraph's `RunnableSeq` of the node and its writers."""
        self.sequence: Runnable[Any, Any] = sequence
        self.steps: list[Runnable[Any, Any]] = list(sequence.steps)
        self.name = sequence.get_name()

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """The synchronous path is LangGraph's own (Roundtable runs graphs async only)."""
        return self.sequence.invoke(input, config, **kwargs)

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """LangGraph's own path: streaming is asked for by a handler (`astream_events`)."""
        return self.sequence.stream(input, config, **kwargs)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """LangGraph's own streaming path when a handler listens; else one `ainvoke`."""
        if has_handlers(config):
            async for chunk in self.sequence.astream(input, config, **kwargs):
                yield chunk
        else:
            yield await self.ainvoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """The node, then its writers, each given `config`; LangGraph's path if traced."""
        if config is None or has_handlers(config):
            return await self.sequence.ainvoke(input, config, **kwargs)
        if "run_name" in config or "run_id" in config:
            # The task's run name and id belong to the node's own callback run, which
            # RunnableSeq consumes; passed on, a LangChain call inside the node would
            # inherit the node's name.
            config = {k: v for k, v in config.items() if k not in ("run_name", "run_id")}  # type: ignore[assignment]
        token = var_child_runnable_config.set(config)
        try:
            value = await self.steps[0].ainvoke(input, config, **kwargs)
            for step in self.steps[1:]:
                value = await step.ainvoke(value, config)
            return value
        finally:
            var_child_runnable_config.reset(token)


def run_nodes_directly(graph: Graph) -> Graph:
    """Installs a `DirectNode` for every node of `graph` that LangGraph runs as a sequence.

    Works on LangGraph's `PregelNode.node` (a cached property holding the node's runnable)
    and `RunnableSeq.steps`; a node of any other shape is left as it is, so an upgrade that
    changes them loses the shortcut, never the node.
    """
    for pregel_node in graph.nodes.values():
        sequence = pregel_node.node
        if type(sequence).__name__ == "RunnableSeq" and getattr(sequence, "steps", None):
            pregel_node.node = DirectNode(sequence)
    return graph
