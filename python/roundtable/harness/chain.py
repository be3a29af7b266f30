"""Builds the harness: the one way any model is called."""

from __future__ import annotations

from opentelemetry import trace

from roundtable.domain.errors import ModelError, ModelRejected
from roundtable.harness.audit import Auditor
from roundtable.harness.breaker import BreakerBoard, BreakerState
from roundtable.harness.layers import (
    AuditLayer,
    BreakerLayer,
    FailoverLayer,
    RetryLayer,
    TimeoutLayer,
)
from roundtable.harness.policies import HarnessPolicy
from roundtable.harness.request import Handler, ModelRequest
from roundtable.harness.tracing import TelemetryLayer
from roundtable.models.base import ChatResult, ProviderRegistry
from roundtable.telemetry.metrics import Metrics, no_metrics


class ProviderCall:
    """The end of the chain: hands one attempt to the target's provider."""

    def __init__(self, providers: ProviderRegistry) -> None:
        self.providers = providers

    async def __call__(self, request: ModelRequest) -> ChatResult:
        target = request.resolved_target
        provider = self.providers.get(target.provider)
        if provider is None:  # validation at the edge makes this unreachable for requests
            raise ModelRejected(f"unknown provider {target.provider!r}")
        api_key = request.credentials.get(target.credential_ref) if target.credential_ref else None
        try:
            return await provider.complete(
                target, request.call, api_key=api_key, on_text=request.on_text
            )
        except ModelError:
            raise
        except Exception as exc:
            # A provider bug fails this call, not the whole run; the type says enough, and
            # its message could echo the prompt or a key.
            failure = ModelError(f"provider {target.provider!r} raised {type(exc).__name__}")
        raise failure  # outside the handler: the provider's exception is not its context


class Harness:
    """Every model call goes through here: failover, breaker, retry, audit, span, timeout."""

    def __init__(
        self,
        providers: ProviderRegistry,
        *,
        policy: HarnessPolicy | None = None,
        auditor: Auditor | None = None,
        breakers: BreakerBoard | None = None,
        tracer: trace.Tracer | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.policy = policy or HarnessPolicy()
        self.providers = providers
        self.auditor = auditor or Auditor()
        self.metrics = metrics or no_metrics()
        self.breakers = breakers or BreakerBoard(
            self.policy.breaker, listener=self._breaker_changed
        )
        handler: Handler = ProviderCall(providers)
        handler = TimeoutLayer(handler, self.policy.timeout)
        handler = TelemetryLayer(handler, tracer, self.metrics)
        handler = AuditLayer(handler, self.auditor)
        handler = RetryLayer(handler, self.policy.retry)
        handler = BreakerLayer(handler, self.breakers, self.auditor)
        self._chain: Handler = FailoverLayer(handler)

    def _breaker_changed(self, target: str, state: BreakerState) -> None:
        self.metrics.breaker_transitions.add(
            1, {"roundtable.target": target, "roundtable.state": state.value}
        )

    async def call(self, request: ModelRequest) -> ChatResult:
        """Runs one model call through the whole chain.

        Raises:
            ModelError: when every target and retry failed; the last error says why.
        """
        return await self._chain(request)
