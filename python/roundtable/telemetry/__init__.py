"""OpenTelemetry: providers built from the standard OTEL_* variables, span helpers, metrics."""
