"""The harness layers. Each holds the next handler and takes one `ModelRequest`.

Outermost first: Failover -> Breaker -> Retry -> Audit -> Telemetry -> Timeout -> provider.
So a breaker is consulted per target, retries stay on one target, every attempt (even one
that times out) gets exactly one audit record and one span, and the timeout bounds one
attempt.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from roundtable.domain.errors import CircuitOpen, ModelError, ModelRateLimited, ModelTimeout
from roundtable.domain.events import TokenUsage
from roundtable.harness.audit import Auditor, AuditRecord
from roundtable.harness.breaker import BreakerBoard
from roundtable.harness.policies import RetryPolicy, TimeoutPolicy, backoff_s, is_transient
from roundtable.harness.request import Handler, ModelRequest
from roundtable.models.base import ChatResult, TextSink


class TimeoutLayer:
    """Bounds one attempt by the model's silence: a streamed call times out when nothing
    comes for the timeout, before its first chunk or between two, so a long answer at a
    steady pace is never cut (review: a CPU-served model writing 512 tokens at 8 a second
    was cut at 60 s, asked again from the start twice, and counted by the breaker); a call
    given no text sink (none in Roundtable: a plan's text goes to `unheard`) by the whole
    attempt. The model ref's own timeout wins over the default; the run's deadline bounds
    it all."""

    def __init__(self, next_handler: Handler, policy: TimeoutPolicy) -> None:
        self.next = next_handler
        self.policy = policy

    async def __call__(self, request: ModelRequest) -> ChatResult:
        seconds = request.ref.timeout_s or self.policy.default_s
        try:
            if request.on_text is None:
                async with asyncio.timeout(seconds):
                    return await self.next(request)
            async with asyncio.timeout(None) as deadline:
                silence = _Silence(request.on_text, seconds, deadline)
                try:
                    return await self.next(
                        request.with_attempt(
                            target=request.target, attempt=request.attempt, on_text=silence
                        )
                    )
                except ModelError as exc:
                    silence.charge(exc)
                    raise
                finally:
                    silence.stop()
        except TimeoutError:
            error = ModelTimeout(f"no answer within {seconds:g}s")
            error.callers_deadline = seconds < self.policy.default_s
            if request.on_text is not None:
                silence.charge(error)
            raise error from None


class _Silence:
    """Passes a streamed attempt's text on, noting when each chunk came and how many came;
    its timer ends the attempt once the model has been silent for `seconds` (one clock
    read a chunk: the timer is moved only when it fires, not on every chunk)."""

    __slots__ = ("_deadline", "_loop", "_seconds", "_sink", "_timer", "chunks", "last")

    def __init__(self, sink: TextSink, seconds: float, deadline: asyncio.Timeout) -> None:
        self._sink = sink
        self._seconds = seconds
        self._deadline = deadline
        self._loop = asyncio.get_running_loop()
        self.last = self._loop.time()
        self.chunks = 0
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(
            self.last + seconds, self._check
        )

    def __call__(self, text: str) -> None:
        self.last = self._loop.time()
        self.chunks += 1
        self._sink(text)

    def heard(self) -> None:
        """A chunk without text (a piece of a tool call, `models.base.heard`)."""
        self.last = self._loop.time()
        self.chunks += 1

    def charge(self, error: ModelError) -> None:
        """What the attempt streamed before it broke was generated, and billed: its chunks
        are its output tokens (`TokenUsage.counted`), unless its server reported them."""
        if self.chunks and not error.spent.output_tokens:
            error.spent = TokenUsage(error.spent.input_tokens, self.chunks, counted=True)

    def _check(self) -> None:
        due = self.last + self._seconds
        if self._loop.time() >= due:
            self._timer = None
            self._deadline.reschedule(self._loop.time())  # expires now: TimeoutError
        else:
            self._timer = self._loop.call_at(due, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class AuditLayer:
    """Writes one audit record per attempt: who, which target, how it ended, how long."""

    def __init__(self, next_handler: Handler, auditor: Auditor) -> None:
        self.next = next_handler
        self.auditor = auditor

    async def __call__(self, request: ModelRequest) -> ChatResult:
        started = time.perf_counter()
        try:
            result = await self.next(request)
        except ModelError as exc:
            status = "timeout" if isinstance(exc, ModelTimeout) else "error"
            record = AuditRecord.of(
                request,
                status,
                started,
                usage=exc.spent if exc.spent != _NOTHING else None,
                error_code=exc.code,
                error=exc.detail,
            )
            self.auditor.record(record)
            raise
        except asyncio.CancelledError:
            # The run was stopped (CancelRun, its deadline) mid-attempt: the model was
            # called and may have spent tokens, so the attempt is on record too.
            self.auditor.record(AuditRecord.of(request, "cancelled", started))
            raise
        self.auditor.record(AuditRecord.of(request, "success", started, usage=result.usage))
        return result


_NOTHING = TokenUsage()
_TARGETS_OWN = frozenset({401, 403, 404})
"""Statuses that say the target cannot serve anyone's request: failed over, never retried."""


class RetryLayer:
    """Retries transient errors on the same target with exponential backoff and jitter."""

    def __init__(
        self,
        next_handler: Handler,
        policy: RetryPolicy,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], object] = asyncio.sleep,
    ) -> None:
        self.next = next_handler
        self.policy = policy
        self._rng = rng or random.Random()
        self._sleep = sleep

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (from 1)."""
        return backoff_s(self.policy, retry, self._rng)

    def wait_before_retry(self, error: ModelError, retry: int) -> float | None:
        """Seconds to wait before retry number `retry` after `error`; None: no retry.

        A 429 that says how long to wait is waited out (at least), unless that is longer
        than the policy allows, when hammering the same target is pointless anyway.
        """
        if not is_transient(error) or retry > self.policy.max_retries:
            return None
        wait = self.backoff(retry)
        asked = error.retry_after_s if isinstance(error, ModelRateLimited) else None
        if asked is not None:
            if asked > self.policy.max_retry_after_s:
                return None
            wait = max(wait, asked)
        return wait

    async def __call__(self, request: ModelRequest) -> ChatResult:
        retry = 0
        spent = _NOTHING
        while True:
            attempt = request.with_attempt(
                target=request.target, attempt=request.attempt + retry, on_text=request.on_text
            )
            try:
                result = await self.next(attempt)
                return result if not retry else _with_attempts(result, retry + 1, spent)
            except ModelError as exc:
                spent = spent + exc.spent
                wait = self.wait_before_retry(exc, retry + 1)
                if wait is None:
                    exc.attempts = retry + 1
                    exc.spent = spent
                    raise
            retry += 1
            await self._sleep(wait)  # type: ignore[misc]
            if request.on_restart is not None:
                request.on_restart()


class BreakerLayer:
    """Refuses calls to a target whose breaker is open; counts system failures."""

    def __init__(self, next_handler: Handler, board: BreakerBoard, auditor: Auditor) -> None:
        self.next = next_handler
        self.board = board
        self.auditor = auditor

    async def __call__(self, request: ModelRequest) -> ChatResult:
        target = request.resolved_target
        breaker = self.board.get(target.breaker_key)
        if not breaker.allow():
            self.auditor.record(AuditRecord.of(request, "breaker_open", time.perf_counter()))
            raise CircuitOpen(target.name)
        probe = breaker.probe_id
        try:
            result = await self.next(request)
        except ModelError as exc:
            breaker.on_failure(exc, probe=probe)
            raise
        except BaseException:
            breaker.on_abandon(probe=probe)
            raise
        breaker.on_success()
        return result


class _Restarts:
    """Tells the caller to drop a reply's streamed text before the attempt that follows
    one which streamed some, whether that next attempt is a retry or another target."""

    __slots__ = ("_restart", "_sink", "_streamed")

    def __init__(self, sink: TextSink | None, restart: Callable[[], None] | None) -> None:
        self._sink = sink
        self._restart = restart
        self._streamed = False

    def text(self, text: str) -> None:
        self._streamed = True
        if self._sink is not None:
            self._sink(text)

    def before_next_attempt(self) -> None:
        if self._streamed:
            self._streamed = False
            if self._restart is not None:
                self._restart()


class FailoverLayer:
    """Tries the model ref's target, then each fallback, on system errors."""

    def __init__(self, next_handler: Handler) -> None:
        self.next = next_handler

    async def __call__(self, request: ModelRequest) -> ChatResult:
        # A target named twice is tried once: it failed the first time (same model, server
        # and key), and its breaker has counted that already.
        targets = tuple(dict.fromkeys((request.ref.target, *request.ref.fallbacks)))
        restarts = _Restarts(request.on_text, request.on_restart)
        inner = request.with_attempt(
            target=request.target,
            attempt=request.attempt,
            on_text=restarts.text if request.on_text is not None else None,
            on_restart=restarts.before_next_attempt,
        )
        last: ModelError | None = None
        attempt = request.attempt
        spent = _NOTHING
        for index, target in enumerate(targets):
            if index:
                # The target before may have streamed half a reply: the next one's text
                # must not be appended to it.
                restarts.before_next_attempt()
            try:
                result = await self.next(
                    inner.with_attempt(target=target, attempt=attempt, on_text=inner.on_text)
                )
            except ModelError as exc:
                # Attempt numbers stay unique across targets; the error counts them all,
                # and the tokens of every target's failed attempts.
                exc.attempts += attempt - request.attempt
                exc.spent = spent = spent + exc.spent
                # A 4xx or an invalid answer is the request's fault: another model won't
                # help. But a 401, 403 or 404 is this target's own (its key revoked, its
                # model retired): the next target has a key and a model of its own (review).
                if not (is_transient(exc) or exc.http_status in _TARGETS_OWN):
                    raise
                last = exc
                attempt = request.attempt + exc.attempts
                continue
            earlier = attempt - request.attempt
            return _with_attempts(result, result.attempts + earlier, spent) if earlier else result
        assert last is not None
        raise last


def _with_attempts(result: ChatResult, attempts: int, spent: TokenUsage) -> ChatResult:
    """`result`, counting `attempts` and the tokens `spent` by the failed ones before it
    (spelled out: `dataclasses.replace` introspects)."""
    return ChatResult(
        text=result.text,
        parsed=result.parsed,
        usage=result.usage + spent if spent != _NOTHING else result.usage,
        finish_reason=result.finish_reason,
        model=result.model,
        attempts=attempts,
        tool_calls=result.tool_calls,
    )
