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
import time

from roundtable.codec.events import kind_of, seal
from roundtable.domain.events import AssistantDelta, AssistantFinal, Envelope, Event, SpeakerFailed
from roundtable.runs.coordination import Coordination
from roundtable.runs.live import LiveRun
from roundtable.store.base import CancelMark, LeaseLost, RunStore, StoredEvent


class RunSink:
    """Implements `graph.context.EventSink` for one live run."""

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
        self._parts: list[str] = []
        self._size = 0
        self._reply = ""
        self._attempt = 0
        self._timer: asyncio.TimerHandle | None = None
        self._mark: CancelMark | None = None
        self._mark_fresh = False

    def take_cancel_mark(self) -> tuple[bool, CancelMark | None]:
        """Whether a durable event was appended since the last call, and the cancel the
        store saw on the run's row as of that append (a shared store reads it in the
        append's round trip; see `RunStore.append_event`)."""
        fresh, self._mark_fresh = self._mark_fresh, False
        return fresh, self._mark

    async def emit(self, event: Event) -> None:
        """Numbers the event, commits it to the log, then hands it to the streams."""
        if isinstance(event, AssistantFinal | SpeakerFailed) and event.reply_id == self._reply:
            self.discard()
        else:
            self.flush()
        seq = self.seq + 1
        record = self.live.record
        envelope = seal(record.run_id, seq, time.time(), event)
        stored = StoredEvent(seq, kind_of(event), envelope.wire)
        try:
            await self.coordination.append(
                self.store.append_event(
                    record.tenant, record.run_id, stored, owner=self.coordination.owner
                ),
                lambda mark: self._accepted(envelope, mark),
            )
        except LeaseLost:
            self.live.lease_lost = True  # the run is another replica's: write nothing more
            raise

    def _accepted(self, envelope: Envelope, mark: CancelMark | None) -> None:
        """The event is in the log: it takes its seq, and the streams get it."""
        self._mark, self._mark_fresh = mark, True
        self.seq = envelope.seq
        self.live.record.last_seq = envelope.seq
        self.live.progress.observe(envelope.event)
        self.live.publish(envelope)

    def delta(self, reply_id: str, text: str, attempt: int) -> None:
        """Buffers streamed text; sends it when the window passes or the buffer is full."""
        if self._parts and (reply_id != self._reply or attempt != self._attempt):
            self.flush()
        self._reply, self._attempt = reply_id, attempt
        self._parts.append(text)
        self._size += len(text)
        if self._size >= self._max_bytes:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._window, self.flush)

    def discard(self) -> None:
        """Drops the buffered text: its reply is final, and the final carries it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._parts.clear()
        self._size = 0

    def flush(self) -> None:
        """Sends the buffered text now (before any durable event, to keep order)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._parts:
            return
        text = "".join(self._parts)
        self._parts.clear()
        self._size = 0
        event = AssistantDelta(reply_id=self._reply, text=text, attempt=self._attempt)
        self.live.publish(
            Envelope(
                run_id=self.live.record.run_id, seq=self.seq, emitted_at=time.time(), event=event
            )
        )
