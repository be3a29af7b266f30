"""A checkpoint saver that writes at progress boundaries only: a plan made, a round spoken.

The speaker is the unit of resume: a run resumes by set difference against the event log,
where every finished reply is committed before anyone hears of it. So the checkpoint
only has to record where the graph stands after each plan and each round of speakers
(dispatch runs a whole round in one super-step); the checkpoints LangGraph would write
after the other nodes, and the per-task "writes" it keeps for resuming half-finished
parallel super-steps (this graph has none), cost a database round trip each and buy
nothing. Measured on a 4-speaker count-off: 12 checkpoints and 40 writes a turn became 6
checkpoints (start, plan, four speakers) and no writes with a super-step per speaker,
then 2 (plan, round) once dispatch ran the round in one super-step.

Two more reads and writes buy nothing, and cost ≈1.5 ms of a ≈7 ms count-off turn
(a thread hop through aiosqlite and a commit each; bench/README.md):

- the read at a run's start, when the run executes for the first time: checkpoint threads
  are per run (`runs.manager.checkpoint_thread`), so a new run has none. The manager says
  so with `expect_new` and the read answers None without asking the database.
- the checkpoint of a graph that finished (its last node sets `finished` in the state): a
  finished run is never resumed, only replayed, and replays come from the event log. So
  with durability "exit" a completed turn writes no checkpoint at all, while a run that
  stops (a cancel, a drain, an error) still writes the one it will resume from.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

BOUNDARY_CHANNELS = frozenset({"steps", "replies"})
"""State keys that change exactly when a plan is made or a round of speakers finishes."""

FINISHED_CHANNEL = "finished"
"""The state key the graph's last node sets: a graph that reached its end."""


class BoundarySaver(BaseCheckpointSaver[Any]):
    """Wraps a saver; forwards only the checkpoints taken at plan and round boundaries."""

    def __init__(self, inner: BaseCheckpointSaver[Any]) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner
        self._new_threads: set[str] = set()

    def expect_new(self, thread_id: str) -> None:
        """Marks a thread known to have no checkpoint: its next read answers None at once."""
        self._new_threads.add(thread_id)

    def forget_new(self, thread_id: str) -> None:
        """Drops the mark of `expect_new` if no read consumed it (a run stopped before)."""
        self._new_threads.discard(thread_id)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Reads from the wrapped saver, unless the thread is marked new (read once)."""
        thread_id = config.get("configurable", {}).get("thread_id")
        if thread_id in self._new_threads:
            self._new_threads.discard(thread_id)
            return None
        return await self.inner.aget_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Lists from the wrapped saver."""
        async for item in self.inner.alist(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Writes the checkpoint when a plan or a round just finished; skips it otherwise,
        and always once the graph has finished."""
        if BOUNDARY_CHANNELS.isdisjoint(new_versions) or checkpoint["channel_values"].get(
            FINISHED_CHANNEL
        ):
            configurable = dict(config.get("configurable", {}))
            configurable["checkpoint_id"] = checkpoint["id"]
            return {**config, "configurable": configurable}
        # Every channel's value goes with it: savers that store values per version (Postgres)
        # would otherwise miss those changed at a skipped checkpoint.
        return await self.inner.aput(
            config, checkpoint, metadata, dict(checkpoint["channel_versions"])
        )

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Skipped: one task per super-step, and an interrupted node simply runs again."""

    # LangGraph's async loop asks `inspect.signature(checkpointer.aput_writes)` whether it
    # takes `task_path`, at every graph invocation (≈16 µs); a signature computed once makes
    # that a lookup. (Roundtable runs graphs asynchronously only: no sync `put_writes`.)
    aput_writes.__signature__ = inspect.signature(aput_writes)  # type: ignore[attr-defined]

    async def adelete_thread(self, thread_id: str) -> None:
        """Deletes through the wrapped saver."""
        await self.inner.adelete_thread(thread_id)

    def get_next_version(self, current: Any, channel: None) -> Any:
        """The wrapped saver's version scheme."""
        return self.inner.get_next_version(current, channel)
