"""The sidecar's metrics (OpenTelemetry instruments), created once per process."""

from __future__ import annotations

from opentelemetry import metrics


class Metrics:
    """Runs by status, run and speaker duration, model latency by target, breaker changes,
    events streamed."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.runs = meter.create_counter(
            "roundtable.runs", unit="{run}", description="Runs ended, by status."
        )
        self.run_duration = meter.create_histogram(
            "roundtable.run.duration", unit="s", description="Wall time of one run execution."
        )
        self.speaker_duration = meter.create_histogram(
            "roundtable.speaker.duration", unit="s", description="Wall time of one speaker's turn."
        )
        self.model_duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Latency of one model attempt, by target and status.",
        )
        self.breaker_transitions = meter.create_counter(
            "roundtable.breaker.transitions",
            unit="{transition}",
            description="Circuit breaker state changes, by target and new state.",
        )
        self.events_streamed = meter.create_counter(
            "roundtable.events.streamed",
            unit="{event}",
            description="Events sent to gateways, by kind.",
        )


def no_metrics() -> Metrics:
    """Instruments that record nothing."""
    return Metrics(metrics.NoOpMeterProvider().get_meter("roundtable"))
