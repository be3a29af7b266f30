"""The busy-thread policy: what a new run does about the thread's runs still going.

Written once, over `BusyRun`: a run of this process (`LocalRun`, stopped and awaited in
memory), a run on another replica and a run left waiting for approval that no process
holds (`runs.elsewhere`: stopped through the store, awaited by polling it) look the same
to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from roundtable.domain.errors import ThreadBusy
from roundtable.domain.plan import DirectiveKind
from roundtable.domain.snapshot import BusyThreadPolicy, RunRequest
from roundtable.graph.context import StopSignal
from roundtable.graph.directives import Directive
from roundtable.runs.live import LiveRun
from roundtable.store.base import RunRecord, RunStatus

Wait = Callable[[], Awaitable[None]]
"""Waits until the thread's busy runs have ended."""


class BusyRun(Protocol):
    """A run of the thread that has not ended yet."""

    run_id: str

    @property
    def queued(self) -> bool:
        """Whether it waits its turn behind another run (it does not speak yet)."""
        ...

    @property
    def blocks(self) -> bool:
        """Whether a new turn must mind it (a stop turn stops it either way): False for a
        run left waiting for approval past its expiry (`elsewhere.DormantRun`)."""
        ...

    async def stopping(self) -> bool:
        """Whether a stop was asked of it already: it ends at its next speaker boundary."""
        ...

    async def stop(self, reason: str) -> None:
        """Asks it to stop at its next speaker boundary."""
        ...

    async def wait(self) -> None:
        """Returns once it has ended."""
        ...


class LocalRun:
    """A thread's run executing in this process."""

    def __init__(self, live: LiveRun, wake: Callable[[LiveRun], object] | None = None) -> None:
        self._live = live
        self._wake = wake
        """For a run parked for approval: what resumes it (to reach its stop)."""
        self.run_id = live.record.run_id
        self.blocks = True

    @property
    def queued(self) -> bool:
        """Whether it waits its turn behind another run."""
        return self._live.record.status is RunStatus.QUEUED

    async def stopping(self) -> bool:
        """Whether a stop was requested of it (it finishes its speaker, then ends), here or,
        on a shared store, by another replica (review: a stop turn sent to replica B, then
        继续 to A, which runs the run, got THREAD_BUSY until the speaker's end)."""
        with contextlib.suppress(Exception):  # a store that cannot say: not stopping
            await self._live.stop.refresh(now=True)
        return self._live.stop.requested

    async def stop(self, reason: str) -> None:
        """Requests a graceful stop of the live run (a parked one is resumed to stop)."""
        self._live.stop.request(reason)
        if self._wake is not None:
            self._wake(self._live)

    async def wait(self) -> None:
        """Waits for its execution to end (a run stopping gracefully finishes its speaker)."""
        await self._live.done.wait()


async def claim_thread(
    request: RunRequest,
    directive: Directive,
    busy: Sequence[BusyRun],
    *,
    resuming: RunRecord | None = None,
) -> Wait | None:
    """Applies the busy-thread policy; returns what the new run waits for, if anything.
    A run `resuming` that was left waiting for approval when its server stopped goes before
    the turns queued behind it since: they wait for its end (review: such a turn refused
    the run's own StartRun, and each waited for the other).

    Raises:
        ThreadBusy: the thread has a live run and the policy is REJECT.
    """
    if directive.kind is DirectiveKind.STOP:
        # A stop turn always stops the thread's live runs (the running one and any
        # waiting behind it), whatever the policy; nobody speaks.
        for run in busy:
            await run.stop("stop_directive")
        return None
    left_waiting = resuming is not None and resuming.status is RunStatus.AWAITING_APPROVAL
    busy = [run for run in busy if run.blocks and not (left_waiting and run.queued)]
    if not busy:
        return None
    policy = request.options.busy_thread_policy
    if policy is BusyThreadPolicy.REJECT and not await _all_stopping(busy):
        # Runs already stopping end at their next speaker boundary: the turn after a stop
        # turn waits for them (outside testing: the stop turn had ended, and "继续" got
        # THREAD_BUSY while the stopped run finished its speaker).
        thread_id = request.context.thread_id
        raise ThreadBusy(f"thread {thread_id!r} is running run {busy[0].run_id!r}")
    if policy is BusyThreadPolicy.INTERRUPT:
        for run in busy:
            await run.stop("interrupted_by_new_run")

    async def wait() -> None:
        # Every one of them, a stop turn that ended at once included.
        for run in busy:
            await run.wait()

    return wait


async def _all_stopping(busy: Sequence[BusyRun]) -> bool:
    """Whether every run is stopping already (asked one after another: the first that is
    not ends the asking, each may read the store)."""
    for run in busy:
        if not await run.stopping():
            return False
    return True


async def until_stopped(waiting: Awaitable[Any], stop: StopSignal) -> None:
    """Awaits `waiting`, or less: until a stop is requested (then `waiting` is cancelled)."""
    queued = asyncio.ensure_future(waiting)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((queued, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        queued.cancel()
        stopped.cancel()
    if queued.done() and not queued.cancelled():
        queued.result()  # its error, if it failed
