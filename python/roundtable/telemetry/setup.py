"""Builds the tracer and meter providers from the standard OTEL_* variables.

Nothing is exported unless an OTLP endpoint is configured; then spans and metrics go out
over OTLP/gRPC. Providers are handed to the parts that need them by the composition root,
never installed as globals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from roundtable._version import __version__


@dataclass(slots=True)
class Telemetry:
    """The process's tracer and meter providers (no-op ones when nothing is configured)."""

    tracer_provider: trace.TracerProvider
    meter_provider: metrics.MeterProvider
    enabled: bool = False

    @property
    def traces(self) -> bool:
        """Whether spans go anywhere (False for the no-op provider of an unconfigured process)."""
        return not isinstance(self.tracer_provider, trace.NoOpTracerProvider)

    def tracer(self, name: str) -> trace.Tracer:
        """A tracer for one instrumentation scope."""
        return self.tracer_provider.get_tracer(name, __version__)

    def active_tracer(self, name: str) -> trace.Tracer | None:
        """The tracer of a scope when spans go somewhere, else None: where nothing is
        traced, components skip spans altogether rather than make no-op ones (≈5 KB of
        open spans and contexts per parked run, and their CPU)."""
        return self.tracer(name) if self.traces else None

    def meter(self, name: str) -> metrics.Meter:
        """A meter for one instrumentation scope."""
        return self.meter_provider.get_meter(name, __version__)

    def force_flush(self) -> None:
        """Exports what is buffered now (tests, and before a process exits)."""
        if isinstance(self.tracer_provider, TracerProvider):
            self.tracer_provider.force_flush()
        if isinstance(self.meter_provider, MeterProvider):
            self.meter_provider.force_flush()

    def shutdown(self) -> None:
        """Flushes and stops the exporters."""
        if isinstance(self.tracer_provider, TracerProvider):
            self.tracer_provider.shutdown()
        if isinstance(self.meter_provider, MeterProvider):
            self.meter_provider.shutdown()


def disabled() -> Telemetry:
    """Telemetry that records nothing."""
    return Telemetry(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())


def _insecure(endpoint: str, environ: Mapping[str, str]) -> bool:
    flag = environ.get("OTEL_EXPORTER_OTLP_INSECURE", "").lower()
    return flag == "true" or endpoint.startswith("http://")


def telemetry_from_env(environ: Mapping[str, str]) -> Telemetry:
    """Reads OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]ENDPOINT, OTEL_SERVICE_NAME, OTEL_SDK_DISABLED,
    OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER (`none` turns one off) and
    OTEL_METRIC_EXPORT_INTERVAL (milliseconds)."""
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return disabled()
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    traces_endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", base)
    metrics_endpoint = environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", base)
    if environ.get("OTEL_TRACES_EXPORTER", "otlp") == "none":
        traces_endpoint = ""
    if environ.get("OTEL_METRICS_EXPORTER", "otlp") == "none":
        metrics_endpoint = ""
    if not traces_endpoint and not metrics_endpoint:
        return disabled()
    resource = Resource.create(
        {
            "service.name": environ.get("OTEL_SERVICE_NAME", "roundtable"),
            "service.version": __version__,
        }
    )
    tracer_provider: trace.TracerProvider = trace.NoOpTracerProvider()
    if traces_endpoint:
        sdk_tracer = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(
            endpoint=traces_endpoint, insecure=_insecure(traces_endpoint, environ)
        )
        sdk_tracer.add_span_processor(BatchSpanProcessor(exporter))
        tracer_provider = sdk_tracer
    meter_provider: metrics.MeterProvider = metrics.NoOpMeterProvider()
    if metrics_endpoint:
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(
                endpoint=metrics_endpoint, insecure=_insecure(metrics_endpoint, environ)
            ),
            export_interval_millis=float(environ.get("OTEL_METRIC_EXPORT_INTERVAL", "60000")),
        )
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    return Telemetry(tracer_provider, meter_provider, enabled=True)
