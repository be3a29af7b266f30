"""Batched log output: every record arrives, in order, formatted, and stop() drains; a
deferred record comes out as the line logging would have made."""

from __future__ import annotations

import io
import logging
import threading
import time
from unittest import mock

from roundtable.telemetry.logs import BatchWriter, Deferred, StreamTeardownNoise, direct_handler


class CountingStream(io.StringIO):
    """A text stream that counts its writes (one per batch) and flushes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.writes += 1
            return super().write(text)


def _logger(writer: BatchWriter, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.handlers[:] = [writer.handler()]
    logger.setLevel(logging.INFO)
    return logger


def test_records_are_written_in_order_in_few_writes_and_stop_drains() -> None:
    stream = CountingStream()
    writer = BatchWriter(stream, logging.Formatter("%(levelname)s %(name)s %(message)s"))
    writer.start()
    log = _logger(writer, "rt.test.batch")
    for i in range(200):
        log.info("line %d of %s", i, "many")
    writer.stop()
    lines = stream.getvalue().splitlines()
    assert lines == [f"INFO rt.test.batch line {i} of many" for i in range(200)]
    assert stream.writes < 20, "records that come together are written together"


def test_the_message_is_rendered_when_logged_and_exceptions_are_kept() -> None:
    stream = CountingStream()
    writer = BatchWriter(stream, logging.Formatter("%(message)s"))
    writer.start()
    log = _logger(writer, "rt.test.render")
    state = {"value": "before"}
    log.info("state=%s", state)
    state["value"] = "after"  # a later change must not reach the line already logged
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    writer.stop()
    text = stream.getvalue()
    assert "state={'value': 'before'}" in text
    assert "failed" in text and "ValueError: boom" in text


def _detach_failure(context: BaseException | None) -> logging.LogRecord:
    """The record OpenTelemetry logs when a context token is reset in another Context."""
    error = ValueError("<Token var=...> was created in a different Context")
    error.__context__ = context  # what was being handled when the reset failed
    return logging.LogRecord(
        "opentelemetry.context",
        logging.ERROR,
        __file__,
        1,
        "Failed to detach context",
        None,
        (ValueError, error, None),
    )


def test_only_the_stream_teardown_detach_failure_is_dropped() -> None:
    noise = StreamTeardownNoise()
    assert not noise.filter(_detach_failure(GeneratorExit())), "a dropped stream: not logged"
    assert noise.filter(_detach_failure(None)), "any other detach failure is still logged"
    other = logging.LogRecord("opentelemetry.context", logging.ERROR, __file__, 1, "x", None, None)
    assert noise.filter(other)


def test_a_deferred_record_is_written_as_the_same_line_a_logged_one_gives() -> None:
    stream = CountingStream()
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    writer = BatchWriter(stream, formatter)
    writer.start()
    log = _logger(writer, "rt.test.deferred")
    handler = direct_handler(log, logging.INFO)
    assert handler is not None, "the writer is the logger's only consumer"
    created = 1700872693.238  # an instant where `created * 1000 % 1000` is off by one
    handler.defer(Deferred(log.name, logging.INFO, created, lambda: '{"a":1}'))
    writer.stop()
    # The record logging itself makes at that instant (its clock stopped there), so the
    # expected line does not repeat the writer's own arithmetic.
    with (
        mock.patch.object(time, "time", return_value=created),
        mock.patch.object(time, "time_ns", return_value=int(created * 1e9)),
    ):
        logged = logging.LogRecord(log.name, logging.INFO, "", 0, '{"a":1}', None, None)
    assert logged.created == created
    assert stream.getvalue().splitlines() == [formatter.format(logged)]
    assert stream.getvalue().split(" ", 2)[2].startswith("INFO rt.test.deferred {")


def test_records_are_deferred_only_where_the_writer_is_their_only_consumer() -> None:
    writer = BatchWriter(io.StringIO(), logging.Formatter("%(message)s"))
    parent = logging.getLogger("rt.test.direct")
    parent.propagate = False
    parent.handlers[:] = [writer.handler()]
    parent.setLevel(logging.INFO)
    child = logging.getLogger("rt.test.direct.audit")
    assert direct_handler(child, logging.INFO) is parent.handlers[0], "found up the chain"

    other = logging.StreamHandler(io.StringIO())
    child.addHandler(other)  # a user's handler (or a test's caplog) sees every record
    assert direct_handler(child, logging.INFO) is None
    child.removeHandler(other)

    quiet = logging.StreamHandler(io.StringIO())
    quiet.setLevel(logging.ERROR)  # a handler that takes no INFO record changes nothing
    child.addHandler(quiet)
    assert direct_handler(child, logging.INFO) is parent.handlers[0]
    child.removeHandler(quiet)

    dropping = logging.Filter("elsewhere")
    child.addFilter(dropping)  # a filter may drop or change records: log them as usual
    assert direct_handler(child, logging.INFO) is None
    child.removeFilter(dropping)

    parent.handlers[:] = []
    assert direct_handler(child, logging.INFO) is None, "no writer: nothing to defer to"
