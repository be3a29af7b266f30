"""The event sink of a run: numbering, write-ahead, fan-out, and delta coalescing.

A durable event is committed to the event log before any stream sees it. Deltas are never
stored: they are coalesced per reply over a short window and a size cap (a gRPC message
costs the same for one token or a thousand) and carry the seq of the last durable event.

Text still buffered when its reply's `assistant_final` (or `speaker_failed`) is emitted is
dropped, not sent: the final carries the whole reply, so that last delta would only cost a
message. A reply written within one window (a short or cached answer) streams no delta.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from roundtable.codec.events import kind_of, seal
from roundtable.domain.events import AssistantDelta, AssistantFinal, Envelope, Event, SpeakerFailed
from roundtable.runs.coordination import Coordination
from roundtable.runs.live import LiveRun
from roundtable.store.base import (
    CancelMark,
    LeaseLost,
    RunRecord,
    RunStatus,
    RunStore,
    StoredEvent,
)


class _Pending:
    """Text of one reply (and attempt) waiting to go out as a delta."""

    __slots__ = ("attempt", "parts", "size", "timer")

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.parts: list[str] = []
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None


class RunSink:
    """Implements `graph.context.EventSink` for one live run.

    Speakers of a parallel group emit at once: durable events are numbered and appended one
    at a time (a lock keeps seq and the log in step), and each reply's text has a buffer of
    its own.
    """

    def __init__(
        self, live: LiveRun, store: RunStore, coordination: Coordination, *, first_seq: int = 0
    ) -> None:
        self.live = live
        self.store = store
        self.coordination = coordination
        """Appends for this replica: the owner fence and what a cancel mid-append means
        differ between one process and replicas (`Coordination.append`)."""
        self.seq = first_seq
        options = live.request.options
        self._window = options.delta_window_s
        self._max_bytes = options.delta_max_bytes
        self._pending: dict[str, _Pending] = {}
        """reply_id -> its buffered text."""
        self._in_order = asyncio.Lock()
        self._mark: CancelMark | None = None
        self._mark_fresh = False
        self.keeper: asyncio.Task[None] | None = None
        """What keeps the run's lease while it executes (`Coordination.attend`)."""

    def take_cancel_mark(self) -> tuple[bool, CancelMark | None]:
        """Whether a durable event was appended since the last call, and the cancel the
        store saw on the run's row as of that append (a shared store reads it in the
        append's round trip; see `RunStore.append_event`)."""
        fresh, self._mark_fresh = self._mark_fresh, False
        return fresh, self._mark

    async def emit(self, event: Event) -> None:
        """Numbers the event, commits it to the log, then hands it to the streams."""
        await self._commit(event, None)

    async def end(self, event: Event, status: RunStatus) -> None:
        """Commits the execution's terminal event together with the run's final row in
        `status` (`RunStore.end_run`), then hands it to the streams. The lease keeper stops
        first: the row gives the lease up, and a renewal landing after it would find the
        run not this replica's and take that for a takeover."""
        if self.keeper is not None:
            self.keeper.cancel()
        await self._commit(event, status)

    async def _commit(self, event: Event, ending: RunStatus | None) -> None:
        async with self._in_order:
            if isinstance(event, AssistantFinal | SpeakerFailed):
                self.discard(event.reply_id)
            self.flush()
            seq = self.seq + 1
            record = self.live.record
            envelope = seal(record.run_id, seq, time.time(), event)
            stored = StoredEvent(seq, kind_of(event), envelope.wire)
            owner = self.coordination.owner
            final = None
            if ending is None:
                write = self.store.append_event(record.tenant, record.run_id, stored, owner=owner)
            else:
                # The live record (GetRun, CancelRun read it) changes once this is written.
                final = dataclasses.replace(record, status=ending)
                write = self.store.end_run(final, owner, stored)
            try:
                await self.coordination.append(
                    write, lambda mark: self._accepted(envelope, mark, final)
                )
            except LeaseLost:
                self.live.lease_lost = True  # the run is another replica's: write nothing more
                raise

    def _accepted(
        self, envelope: Envelope, mark: CancelMark | None, final: RunRecord | None
    ) -> None:
        """The event is in the log (with the run's `final` row, for its end): it takes its
        seq, and the streams get it."""
        self._mark, self._mark_fresh = mark, True
        self.seq = envelope.seq
        record = self.live.record
        record.last_seq = envelope.seq
        if final is not None:
            record.status, record.updated_at = final.status, final.updated_at
        self.live.progress.observe(envelope.event)
        self.live.publish(envelope)

    def delta(self, reply_id: str, text: str, attempt: int) -> None:
        """Buffers streamed text; sends it when the window passes or the buffer is full."""
        pending = self._pending.get(reply_id)
        if pending is not None and pending.attempt != attempt:
            self._send(reply_id)  # the abandoned attempt's text goes first, as written
            pending = None
        if pending is None:
            pending = self._pending[reply_id] = _Pending(attempt)
        pending.parts.append(text)
        pending.size += len(text)
        if pending.size >= self._max_bytes:
            self._send(reply_id)
        elif pending.timer is None:
            loop = asyncio.get_running_loop()
            pending.timer = loop.call_later(self._window, self._send, reply_id)

    def discard(self, reply_id: str) -> None:
        """Drops a reply's buffered text: the reply is final, and the final carries it."""
        pending = self._pending.pop(reply_id, None)
        if pending is not None and pending.timer is not None:
            pending.timer.cancel()

    def flush(self) -> None:
        """Sends all buffered text now (before any durable event, to keep order)."""
        for reply_id in list(self._pending):
            self._send(reply_id)

    def _send(self, reply_id: str) -> None:
        pending = self._pending.pop(reply_id, None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        if not pending.parts:
            return
        event = AssistantDelta(
            reply_id=reply_id, text="".join(pending.parts), attempt=pending.attempt
        )
        self.live.publish(
            Envelope(
                run_id=self.live.record.run_id, seq=self.seq, emitted_at=time.time(), event=event
            )
        )
