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
import contextlib
import time

from roundtable.api.convert import event_to_proto
from roundtable.domain.events import AssistantDelta, AssistantFinal, Event, SpeakerFailed
from roundtable.runs.live import LiveRun
from roundtable.store.base import CancelMark, LeaseLost, RunStore, StoredEvent
from roundtable.v1 import events_pb2 as epb


class RunSink:
    """Implements `graph.context.EventSink` for one live run."""

    def __init__(
        self, live: LiveRun, store: RunStore, *, first_seq: int = 0, owner: str | None = None
    ) -> None:
        self.live = live
        self.store = store
        self.owner = owner
        """The replica appending; a shared store refuses its appends once it is not the
        run's owner any more (`RunStore.append_event`)."""
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
        proto = event_to_proto(self.live.record.run_id, seq, time.time(), event)
        body = proto.SerializeToString()
        kind = proto.WhichOneof("payload") or ""
        record = self.live.record
        append = self.store.append_event(
            record.tenant, record.run_id, StoredEvent(seq, kind, body), owner=self.owner
        )
        if not self.store.shared:
            # SQLite's append can only wait before it writes (a WAL checkpoint's last pass):
            # a cancel there leaves nothing written, and the event unnumbered.
            self._accepted(seq, event, proto, await append)
            return
        # Over the network a cancel can land after the row was committed: the statement
        # is let finish, and an event it committed is numbered and streamed before the
        # cancel goes on (else the run's last event would reuse its seq).
        task = asyncio.ensure_future(append)
        try:
            mark = await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # not committed: nothing to number
                self._accepted(seq, event, proto, await task)
            raise
        except LeaseLost:
            self.live.lease_lost = True  # the run is another replica's: write nothing more
            raise
        self._accepted(seq, event, proto, mark)

    def _accepted(
        self, seq: int, event: Event, proto: epb.RunEvent, mark: CancelMark | None
    ) -> None:
        """The event is in the log: it takes its seq, and the streams get it."""
        self._mark, self._mark_fresh = mark, True
        self.seq = seq
        self.live.record.last_seq = seq
        self.live.progress.observe_emitted(event)
        self.live.publish(proto, durable=True)

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
            event_to_proto(self.live.record.run_id, self.seq, time.time(), event), durable=False
        )
