"""Log output written from a background thread, in batches.

Every model attempt writes an audit line, so a 4-speaker turn logs at least four lines. A
plain `QueueListener` wakes its thread for every record and its `StreamHandler` flushes
every line with a syscall of its own; on a 2-core machine those wake-ups fight the event
loop for the GIL, which measured ≈0.2 ms of CPU per line (bench: serve with and without
INFO logging: the QueueListener set-up cost ≈1 ms of CPU a turn, this one next to
nothing). Here the writer thread, once woken, lets records gather for `linger_s` (10 ms)
and writes them with one flush.

The whole line is formatted on the caller's thread (≈3 µs a line), and the writer thread
only joins and writes text: whatever Python it runs holds the GIL the event loop may be
waiting for. On an AMD EPYC 2-core host, served count-off turns with the audit lines off
took 4-10 % less time than with them on (six paired runs); formatting in the caller
instead of the writer measured within that host's noise (0.97-1.03). What did pay off is
the exception: an audit record, immutable data, is handed over as it is (`Deferred`,
where this writer is its logger's only consumer: `direct_handler`), and the writer makes
its JSON and its line (loop-thread CPU of a served turn 0.946x).

Nothing waits for the disk on the event loop, and a record is out within `linger_s` (a
process killed in between loses at most that much log).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TextIO

_STOP = None

QUIET = (
    "openai",
    "httpx",
    "httpcore",
    # The openai SDK's own forks of httpx and httpcore: URLs (with their query) at INFO,
    # headers at DEBUG.
    "httpx2",
    "httpcore2",
    "urllib3",
    "langchain",
    "langchain_core",
    "langchain_openai",
    "langgraph",
    "aiosqlite",
    "psycopg",
    # The MCP client logs every message it sends at DEBUG, a tool call's arguments with it,
    # and session ids at INFO (tool calls go over httpx2, above).
    "mcp",
)
"""Client libraries log URLs, headers and request bodies (prompts, keys) at INFO or DEBUG:
kept at WARNING whatever our level."""


def configure(level: str, stream: TextIO) -> BatchWriter:
    """Installs batched, threaded log output on the root logger and starts it.

    Returns the writer; `stop()` it on the way out to write what is still queued.
    """
    writer = BatchWriter(
        stream, logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    logging.basicConfig(level=level.upper(), handlers=[writer.handler()], force=True)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("opentelemetry.context").addFilter(StreamTeardownNoise())
    # The format uses none of a record's caller, thread or process fields: skip computing
    # them (the Logging HOWTO's "Optimization" section). Finding the caller walks the stack,
    # ≈15 µs of every audit line.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    writer.start()
    return writer


class StreamTeardownNoise(logging.Filter):
    """Drops OpenTelemetry's "Failed to detach context" error for an abandoned stream.

    When a client drops a StartRun or StreamRun stream, grpc.aio may leave the handler's
    response generator suspended, and Python then closes it from another asyncio Context.
    The OpenTelemetry gRPC interceptor's span is still ended, but resetting its context
    token there fails, and the library logs ERROR tracebacks for what is a normal
    disconnect (open-telemetry/opentelemetry-python-contrib#2357; the grpc side is
    grpc/grpc#42295). Only that case is dropped: a detach failure whose exception arose
    while a generator was being closed.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) for the generator-teardown detach failure only."""
        if record.msg != "Failed to detach context" or not record.exc_info:
            return True
        error = record.exc_info[1]
        return not (
            isinstance(error, ValueError)
            and "different Context" in str(error)
            and isinstance(error.__context__, GeneratorExit)
        )


class BatchWriter:
    """A `logging.Handler` target: a queue of finished lines drained by a thread that
    writes them in batches."""

    def __init__(
        self,
        stream: TextIO,
        formatter: logging.Formatter,
        *,
        linger_s: float = 0.01,
    ) -> None:
        self.stream = stream
        self.formatter = formatter
        self.linger_s = linger_s
        self.lines: queue.SimpleQueue[str | Deferred | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="roundtable-logs", daemon=True)

    def handler(self) -> logging.Handler:
        """The handler to install: it formats each record and queues the line."""
        handler = _LineHandler(self.lines)
        handler.setFormatter(self.formatter)
        return handler

    def start(self) -> None:
        """Starts the writer thread."""
        self._thread.start()

    def stop(self) -> None:
        """Writes what is queued, then ends the thread."""
        self.lines.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self.lines.get()
            if first is not _STOP:
                time.sleep(self.linger_s)  # let the lines of a busy moment gather
            batch = [first]
            while True:
                try:
                    batch.append(self.lines.get_nowait())
                except queue.Empty:
                    break
            lines = [self._line(item) for item in batch if item is not None]
            if lines:
                try:
                    self.stream.write("\n".join(lines) + "\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass  # a closed or broken stream must not take the process down
            if _STOP in batch:
                return

    def _line(self, item: str | Deferred) -> str:
        if isinstance(item, str):
            return item
        try:
            return item.format(self.formatter)
        except Exception:  # a line that cannot be rendered must not stop the writer
            return f"(a {item.name} line could not be rendered)"


class Deferred:
    """A record whose message is rendered by the writer thread, off the event loop.

    Only for messages built from immutable data (`render` must give the same text whenever
    it is called): the audit records, frozen dataclasses of plain values.
    """

    __slots__ = ("created", "levelno", "name", "render")

    def __init__(self, name: str, levelno: int, created: float, render: Callable[[], str]):
        self.name = name
        self.levelno = levelno
        self.created = created
        self.render = render

    def format(self, formatter: logging.Formatter) -> str:
        """The line `formatter` makes of a record logged at `created` with this message."""
        record = logging.LogRecord(self.name, self.levelno, "", 0, self.render(), None, None)
        record.created = self.created
        # As logging computes it from the time (Python 3.11's LogRecord): `created * 1000 %
        # 1000` is a millisecond off for about one time in 8,000.
        record.msecs = int((self.created - int(self.created)) * 1000) + 0.0
        return formatter.format(record)


def direct_handler(logger: logging.Logger, level: int) -> _LineHandler | None:
    """The batch writer's handler when it is the only place `logger`'s records at `level`
    go (no other handler and no filter on the way): a caller may then hand it a `Deferred`
    instead of logging. None otherwise (tests' caplog, a user's own handlers or filters),
    and the caller logs as usual."""
    found: _LineHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if handler.level > level:
                continue
            if found is not None or not isinstance(handler, _LineHandler) or handler.filters:
                return None
            found = handler
        current = current.parent if current.propagate else None
    return found


class _LineHandler(logging.Handler):
    """Formats the whole line on the caller's thread and queues it (no I/O here).

    The caller's thread is also where the message must be rendered: its arguments may
    change once the call returns.
    """

    def __init__(self, lines: queue.SimpleQueue[str | Deferred | None]) -> None:
        super().__init__()
        self.lines = lines

    def defer(self, item: Deferred) -> None:
        """Queues a record the writer thread renders and formats (see `direct_handler`)."""
        self.lines.put(item)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.put(self.format(record))
        except Exception:
            self.handleError(record)
