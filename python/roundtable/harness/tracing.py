"""The telemetry layer: one GenAI client span and one latency measurement per attempt.

Spans follow the OpenTelemetry GenAI client conventions (`chat <model>`), carry the
correlation attributes of the call, and never the prompt or the reply.
"""

from __future__ import annotations

import asyncio
import time

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from roundtable.domain.errors import ModelError
from roundtable.harness.request import Handler, ModelRequest
from roundtable.models.base import ChatResult
from roundtable.telemetry.attributes import correlation
from roundtable.telemetry.metrics import Metrics


class TelemetryLayer:
    """Wraps one attempt in a `chat <model>` span (when traced) and records its latency."""

    def __init__(
        self, next_handler: Handler, tracer: trace.Tracer | None, metrics: Metrics
    ) -> None:
        self.next = next_handler
        self.tracer = tracer
        """None: nothing is traced, and no span is made."""
        self.metrics = metrics

    async def __call__(self, request: ModelRequest) -> ChatResult:
        started = time.perf_counter()
        status = "success"
        try:
            if self.tracer is None:
                return await self.next(request)
            return await self._traced(self.tracer, request)
        except ModelError:
            status = "error"
            raise
        except asyncio.CancelledError:
            status = "cancelled"  # the run was stopped mid-attempt
            raise
        finally:
            target = request.resolved_target
            self.metrics.model_duration.record(
                time.perf_counter() - started,
                {
                    "gen_ai.provider.name": target.provider,
                    "gen_ai.request.model": target.model,
                    "roundtable.target": target.name,
                    "roundtable.status": status,
                },
            )

    async def _traced(self, tracer: trace.Tracer, request: ModelRequest) -> ChatResult:
        target = request.resolved_target
        meta = request.meta
        attributes: dict[str, AttributeValue] = {
            **correlation(
                thread_id=meta.thread_id,
                run_id=meta.run_id,
                request_id=meta.request_id,
                tenant=meta.tenant,
                caller_node=meta.caller_node,
            ),
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": target.provider,
            "gen_ai.request.model": target.model,
            "roundtable.target": target.name,
            "roundtable.attempt": request.attempt,
        }
        if request.call.max_tokens:
            attributes["gen_ai.request.max_tokens"] = request.call.max_tokens
        with tracer.start_as_current_span(
            f"chat {target.model}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                result = await self.next(request)
            except ModelError as exc:
                # The code, never the message: a provider's message may echo the prompt.
                span.set_attribute("error.type", exc.code)
                span.set_status(Status(StatusCode.ERROR, exc.code))
                if exc.spent.input_tokens or exc.spent.output_tokens:
                    # An answer that did not fit, or one that broke off: billed all the same.
                    span.set_attribute("gen_ai.usage.input_tokens", exc.spent.input_tokens)
                    span.set_attribute("gen_ai.usage.output_tokens", exc.spent.output_tokens)
                raise
            except asyncio.CancelledError:
                span.set_attribute("error.type", "cancelled")
                raise
            span.set_attribute("gen_ai.usage.input_tokens", result.usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", result.usage.output_tokens)
            if result.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", [result.finish_reason])
            return result
