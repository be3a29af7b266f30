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

from roundtable.domain.errors import CircuitOpen, ModelError, ModelTimeout
from roundtable.harness.audit import Auditor, AuditRecord
from roundtable.harness.breaker import BreakerBoard
from roundtable.harness.policies import RetryPolicy, TimeoutPolicy, is_transient
from roundtable.harness.request import Handler, ModelRequest
from roundtable.models.base import ChatResult


class TimeoutLayer:
    """Bounds one attempt; the model ref's own timeout wins over the default."""

    def __init__(self, next_handler: Handler, policy: TimeoutPolicy) -> None:
        self.next = next_handler
        self.policy = policy

    async def __call__(self, request: ModelRequest) -> ChatResult:
        seconds = request.ref.timeout_s or self.policy.default_s
        try:
            async with asyncio.timeout(seconds):
                return await self.next(request)
        except TimeoutError:
            raise ModelTimeout(f"no answer within {seconds:g}s") from None


class AuditLayer:
    """Writes one audit record per attempt: who, which target, how it ended, how long."""

    def __init__(self, next_handler: Handler, auditor: Auditor) -> None:
        self.next = next_handler
        self.auditor = auditor

    async def __call__(self, request: ModelRequest) -> ChatResult:
        started = time.perf_counter()
        try:
            result = await self.next(request)
        except ModelTimeout:
            self.auditor.record(AuditRecord.of(request, "timeout", started))
            raise
        except ModelError as exc:
            self.auditor.record(AuditRecord.of(request, "error", started, error_code=exc.code))
            raise
        self.auditor.record(AuditRecord.of(request, "success", started, usage=result.usage))
        return result


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
        base = min(self.policy.initial_backoff_s * 2.0 ** (retry - 1), self.policy.max_backoff_s)
        spread: float = self.policy.jitter * (2 * self._rng.random() - 1)
        return max(0.0, base * (1 + spread))

    async def __call__(self, request: ModelRequest) -> ChatResult:
        streamed = False
        on_text = request.on_text

        def track(text: str) -> None:
            nonlocal streamed
            streamed = True
            if on_text is not None:
                on_text(text)

        retry = 0
        while True:
            attempt = request.with_attempt(
                target=request.target,
                attempt=request.attempt + retry,
                on_text=track if on_text is not None else None,
            )
            try:
                return await self.next(attempt)
            except ModelError as exc:
                if not is_transient(exc) or retry >= self.policy.max_retries:
                    raise
            retry += 1
            await self._sleep(self.backoff(retry))  # type: ignore[misc]
            if streamed and request.on_restart is not None:
                request.on_restart()
                streamed = False


class BreakerLayer:
    """Refuses calls to a target whose breaker is open; counts system failures."""

    def __init__(self, next_handler: Handler, board: BreakerBoard, auditor: Auditor) -> None:
        self.next = next_handler
        self.board = board
        self.auditor = auditor

    async def __call__(self, request: ModelRequest) -> ChatResult:
        target = request.resolved_target
        breaker = self.board.get(target.name)
        if not breaker.allow():
            self.auditor.record(AuditRecord.of(request, "breaker_open", time.perf_counter()))
            raise CircuitOpen(target.name)
        try:
            result = await self.next(request)
        except ModelError as exc:
            breaker.on_failure(exc)
            raise
        except BaseException:
            breaker.on_abandon()
            raise
        breaker.on_success()
        return result


class FailoverLayer:
    """Tries the model ref's target, then each fallback, on system errors."""

    def __init__(self, next_handler: Handler) -> None:
        self.next = next_handler

    async def __call__(self, request: ModelRequest) -> ChatResult:
        targets = (request.ref.target, *request.ref.fallbacks)
        last: ModelError | None = None
        attempts = 0
        for target in targets:
            try:
                return await self.next(
                    request.with_attempt(
                        target=target, attempt=request.attempt + attempts, on_text=request.on_text
                    )
                )
            except ModelError as exc:
                # A 4xx or an invalid answer is the request's fault: another model won't help.
                if not is_transient(exc):
                    raise
                last = exc
                attempts += 1
        assert last is not None
        raise last
