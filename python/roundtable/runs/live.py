"""A run executing in this process, and the streams that follow it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from roundtable.domain.errors import RoundtableError, RunOrphaned, StreamOverflow, TooManyStreams
from roundtable.domain.events import AssistantDelta, Envelope
from roundtable.domain.snapshot import RunRequest
from roundtable.graph.context import StopSignal
from roundtable.runs.progress import Progress
from roundtable.store.base import RunRecord

_END = None
MERGED_DELTA_MAX = 64 * 1024
"""Largest text a merged delta reaches (characters; the proto's delta_max_bytes ceiling)."""


class Subscription:
    """One stream's view of a run: a backlog of durable events, then live ones, then the end.

    A reader that falls behind gets the delta chunks still queued for it merged: a chunk
    offered while the queue's last item is a delta of the same reply and attempt is
    appended to it (up to MERGED_DELTA_MAX). The sink's window and size cap decide when a
    chunk leaves the run; merging only acts on chunks that would otherwise wait in line,
    so a stream that keeps up sees them as sent, and one that does not gets fewer, larger
    messages instead of a growing backlog (gRPC's cost is per message).

    A slow reader cannot make the server buffer without bound: past `buffer` pending events,
    deltas (live-only) are dropped, and a durable event that does not fit ends the stream
    with StreamOverflow. Nothing durable is lost: the reader re-attaches with
    StreamRun(after_seq = the last seq it received).
    """

    def __init__(
        self, backlog: list[Envelope], *, ended: bool, buffer: int = 0, thread_id: str = ""
    ) -> None:
        # A deque and one waiter rather than an asyncio.Queue: one reader, and a parked
        # run keeps a stream per client, so the Queue's three more deques (~2 KB) count.
        self._items: deque[Envelope | _Merged | None] = deque(backlog)
        self._waiter: asyncio.Future[None] | None = None
        if ended:
            self._items.append(_END)
        self.limit = len(backlog) + buffer if buffer else 0
        self.dropped_deltas = 0
        self.reached_end = False
        self.closed = ended
        self.error: RoundtableError | None = None
        """Why the stream ended without its run's end (the servicer turns it into a status)."""
        self.seen = backlog[-1].seq if backlog else 0
        """The last durable seq queued: a live event at or below it is not handed over again
        (a resumed run's events read from the log may be published after the read)."""
        self.follower: asyncio.Task[None] | None = None
        """For a run another replica executes: the task that pumps its event log in."""
        self.thread_id = thread_id
        """The run's thread, for the stream's span."""

    @property
    def full(self) -> bool:
        """Whether the reader is `buffer` events behind."""
        return bool(self.limit) and len(self._items) >= self.limit

    def push(self, envelope: Envelope) -> None:
        """Queues an event whatever the buffer (for feeders that wait while `full`)."""
        self._put(envelope)

    def _put(self, item: Envelope | _Merged | None) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def offer(self, envelope: Envelope) -> bool:
        """Hands a live event over without waiting; False when the stream had to end."""
        if self.closed:
            return False
        durable = envelope.durable
        if durable:
            if envelope.seq <= self.seen:
                return True
            self.seen = envelope.seq
        elif envelope.seq < self.seen:
            return True  # a delta before what the stream asked for (it carries the last seq)
        elif self._merge(envelope):
            return True
        if self.full:
            if not durable:
                self.dropped_deltas += 1
                return True
            self.end(StreamOverflow(f"more than {self.limit} events pending"))
            return False
        self._put(envelope)
        return True

    def _merge(self, envelope: Envelope) -> bool:
        """Appends a delta to the delta waiting at the tail of the queue, if it can."""
        items = self._items
        if not items:
            return False
        tail = items[-1]
        new = envelope.event
        assert isinstance(new, AssistantDelta)
        if isinstance(tail, _Merged):
            return tail.extend(new)
        if tail is None or not isinstance(tail.event, AssistantDelta):
            return False
        # Published envelopes are shared by every stream of the run: merge into our own.
        merged = _Merged(tail)
        if not merged.extend(new):
            return False
        items[-1] = merged
        return True

    def end(self, error: RoundtableError | None = None) -> None:
        """Ends the stream: pending events are discarded when it ends with an error."""
        if self.closed:
            return
        self.closed = True
        if error is not None:
            self.error = error
            self._items.clear()
        self._put(_END)

    async def __aiter__(self) -> AsyncIterator[Envelope]:
        items = self._items
        while True:
            while not items:
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            item = items.popleft()
            if item is _END:
                self.reached_end = self.error is None
                return
            yield item.sealed() if isinstance(item, _Merged) else item


class _Merged:
    """Deltas of one reply and attempt merged while they waited in one stream's queue.

    The text is joined once, when the stream takes it (appending to a str would copy it
    each time).
    """

    __slots__ = ("_first", "_parts", "_size")

    def __init__(self, first: Envelope) -> None:
        assert isinstance(first.event, AssistantDelta)
        self._first = first
        self._parts = [first.event.text]
        self._size = len(first.event.text)

    def extend(self, delta: AssistantDelta) -> bool:
        """Appends a delta of the same reply and attempt, up to MERGED_DELTA_MAX."""
        head = self._first.event
        assert isinstance(head, AssistantDelta)
        if (
            delta.reply_id != head.reply_id
            or delta.attempt != head.attempt
            or self._size + len(delta.text) > MERGED_DELTA_MAX
        ):
            return False
        self._parts.append(delta.text)
        self._size += len(delta.text)
        return True

    def sealed(self) -> Envelope:
        """The merged delta as one envelope (encoded by the edge, like every delta)."""
        head = self._first.event
        assert isinstance(head, AssistantDelta)
        text = "".join(self._parts)
        return dataclasses.replace(
            self._first,
            event=AssistantDelta(reply_id=head.reply_id, text=text, attempt=head.attempt),
            wire=b"",
        )


class Latch:
    """Set once, awaited by few: an `asyncio.Event` without its waiter deque from birth
    (≈0.7 KB a run; a run waiting for approval may wait for days, bench B8)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        """Whether it was set."""
        return self._set

    def set(self) -> None:
        """Sets it and wakes every waiter."""
        self._set = True
        for waiter in self._waiters or ():
            if not waiter.done():
                waiter.set_result(None)
        self._waiters = None

    async def wait(self) -> None:
        """Returns once it is set (at once if it is)."""
        if self._set:
            return
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)


@dataclass(eq=False)
class LiveRun:
    """A run that this process is executing (or about to)."""

    request: RunRequest
    record: RunRecord
    progress: Progress = field(default_factory=Progress)
    stop: StopSignal = field(default_factory=StopSignal)
    backlog: list[Envelope] = field(default_factory=list)
    subscribers: set[Subscription] = field(default_factory=set)
    done: Latch = field(default_factory=Latch)
    task: asyncio.Task[None] | None = None
    in_graph: bool = False
    """Whether the run task is inside the graph now: what `interrupt_graph` may cut short."""
    interrupts: int = 0
    """Cancels `interrupt_graph` sent the run task that it has not taken back yet."""
    lease_lost: bool = False
    ended: bool = False
    """Whether this execution published its terminal event."""
    buffer: int = 0
    """Events buffered per stream (0: unbounded)."""
    max_streams: int = 0
    """Streams attached at once (0: unbounded)."""

    @property
    def key(self) -> tuple[str, str]:
        """(tenant, run_id)."""
        return (self.record.tenant, self.record.run_id)

    @property
    def thread_key(self) -> tuple[str, str]:
        """(tenant, thread_id)."""
        return (self.record.tenant, self.record.thread_id)

    @property
    def first_in_memory(self) -> int:
        """The seq of the first durable event a stream can take from memory (the backlog of
        this execution); those before it are in the log only."""
        return self.backlog[0].seq if self.backlog else self.record.last_seq + 1

    def subscribe(self, after_seq: int, *, head: Sequence[Envelope] = ()) -> Subscription:
        """A stream of the durable events after `after_seq`, then the live ones.

        `head` holds events read from the log that precede what is in memory.

        Raises:
            TooManyStreams: `max_streams` streams already follow the run.
        """
        self.check_room()
        since = head[-1].seq if head else after_seq
        backlog = [*head, *(e for e in self.backlog if e.seq > since)]
        sub = Subscription(
            backlog,
            ended=self.done.is_set(),
            buffer=self.buffer,
            thread_id=self.record.thread_id,
        )
        # Live events are handed over only past what the stream asked for and was given.
        sub.seen = max(sub.seen, since)
        if not self.done.is_set():
            self.subscribers.add(sub)
        return sub

    def check_room(self) -> None:
        """Raises TooManyStreams when one more stream would pass `max_streams`."""
        if self.max_streams and len(self.subscribers) >= self.max_streams:
            raise TooManyStreams(
                f"run {self.record.run_id!r} has {len(self.subscribers)} streams attached"
            )

    def unsubscribe(self, sub: Subscription) -> None:
        """Stops feeding a stream (its client went away)."""
        self.subscribers.discard(sub)

    def publish(self, envelope: Envelope) -> None:
        """Hands an event to every stream; durable ones are kept for late subscribers."""
        if envelope.durable:
            self.backlog.append(envelope)
            self.ended = envelope.terminal
        overflowed = [sub for sub in self.subscribers if not sub.offer(envelope)]
        for sub in overflowed:
            self.subscribers.discard(sub)

    def interrupt_graph(self) -> None:
        """Stops the graph mid-step (an immediate cancel, a lost lease).

        The graph runs in the run's own task (no task of its own: ≈1 KB and a hand-off per
        run), so this cancels the run task, and only while it is inside the graph. Every
        call cancels again (a cancel the graph absorbed must not disarm the next one, e.g.
        a lost lease after an immediate cancel); the run task takes them all back as it
        leaves the graph (`take_back_interrupts`).
        """
        if self.in_graph and self.task is not None:
            self.interrupts += 1
            self.task.cancel()

    def take_back_interrupts(self) -> None:
        """Called by the run task as it leaves the graph: un-counts the cancels
        `interrupt_graph` sent, so that the task's `cancelling()` says only whether the
        process is stopping."""
        task = asyncio.current_task()
        if task is not None:
            for _ in range(self.interrupts):
                task.uncancel()
        self.interrupts = 0

    def finish(self) -> None:
        """Ends every stream: with RunOrphaned (UNAVAILABLE, "send the same StartRun")
        when this execution stops before its terminal event (its lease lost to another
        replica, or the process stopping), so no stream ends OK without the run's end."""
        self.done.set()
        error = None if self.ended else RunOrphaned(self.record.run_id)
        for sub in self.subscribers:
            sub.end(error)
        self.subscribers.clear()
