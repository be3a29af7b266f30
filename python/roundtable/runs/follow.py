"""Following a run another replica executes: its event log, pumped into a stream.

A follower reads the log every `poll_s` and hands new events on, waiting for a slow reader
instead of buffering (the log keeps them). While the run waits for a person's decision it
reads less and less often, up to every `PARKED_POLL_MAX_S` (a person takes minutes; two
queries every 50 ms per stream for all that time would be the store's busiest load). Only the registry says whether the run goes on
(a resumed run's log holds the end of an earlier execution). When the executing replica's
lease runs out (it died), a StartRun follower takes the run over (`takeover` resumes it
here) and a StreamRun follower ends with RunOrphaned (send the same StartRun).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from roundtable.domain.errors import RoundtableError, RunOrphaned
from roundtable.runs.live import Subscription
from roundtable.runs.log import EventLog
from roundtable.store.base import LEASED, RunRecord, RunStatus

Takeover = Callable[[], Awaitable[Subscription]]
"""Starts the followed run here (the same StartRun again), once its replica died."""

PARKED_POLL_MAX_S = 1.0
"""The longest pause between two reads of a run parked for approval elsewhere: its first
resumed events reach the stream at most this late."""


class Follower:
    """Pumps the logs of runs executed elsewhere into streams."""

    def __init__(self, log: EventLog, *, poll_s: float, buffer: int) -> None:
        self.log = log
        self.poll_s = poll_s
        self.buffer = buffer
        """Events buffered per stream (see `live.Subscription`)."""

    def follow(
        self, record: RunRecord, *, after_seq: int, takeover: Takeover | None = None
    ) -> Subscription:
        """A stream of the run's events after `after_seq`, to its end."""
        subscription = Subscription([], ended=False, buffer=self.buffer, thread_id=record.thread_id)
        subscription.follower = asyncio.create_task(
            self._pump(record.tenant, record.run_id, after_seq, subscription, takeover),
            name=f"follow:{record.run_id}",
        )
        return subscription

    async def _pump(
        self,
        tenant: str,
        run_id: str,
        after_seq: int,
        sub: Subscription,
        takeover: Takeover | None,
    ) -> None:
        seen = after_seq
        ended = False  # whether the last event read ends an execution of the run
        store = self.log.store
        pause = self.poll_s
        while True:
            events = await self.log.read(tenant, run_id, seen)
            if events:
                pause = self.poll_s
            for envelope in events:
                while sub.full:  # noqa: ASYNC110 (polling a queue we do not own)
                    await asyncio.sleep(self.poll_s)
                sub.push(envelope)
                seen, ended = envelope.seq, envelope.terminal
            if events and not ended:
                await asyncio.sleep(self.poll_s)
                continue
            record = await store.get_run(tenant, run_id)
            if record is None or record.status not in LEASED:
                if await store.read_events(tenant, run_id, seen):
                    continue  # appended between the two reads: hand them on first
                sub.end()
                return
            if record.lease_until < time.time():
                await self._orphaned(run_id, sub, seen, ended=ended, takeover=takeover)
                return
            await asyncio.sleep(pause)
            parked = record.status is RunStatus.AWAITING_APPROVAL
            pause = min(pause * 2, PARKED_POLL_MAX_S) if parked else self.poll_s

    async def _orphaned(
        self, run_id: str, sub: Subscription, seen: int, *, ended: bool, takeover: Takeover | None
    ) -> None:
        """The executing replica's lease ran out: end, or take the run over."""
        if ended:
            sub.end()  # its replica died after the run's end, before recording it
            return
        if takeover is None:
            sub.end(RunOrphaned(run_id))
            return
        try:
            source = await takeover()
        except RoundtableError as exc:
            sub.end(exc)  # e.g. Draining, TooManyRuns, ThreadBusy: the stream ends with it
            return
        await forward(source, sub, seen)


async def forward(source: Subscription, sink: Subscription, seen: int) -> None:
    """Hands on `source`'s events that `sink` has not had yet, then its end.

    Through `offer`, as a live run hands events to its streams: a slow reader loses deltas
    and, too far behind, gets StreamOverflow (it re-attaches), instead of this process
    buffering for it without bound.
    """
    async for envelope in source:
        if envelope.durable and envelope.seq <= seen:
            continue
        if not sink.offer(envelope):
            return  # the reader fell too far behind: its stream has ended
    sink.end(source.error)
