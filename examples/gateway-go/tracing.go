package main

// tracing.go: OpenTelemetry. The gateway's trace continues inside Roundtable: the
// otelgrpc stats handler injects W3C traceparent and baggage into the gRPC metadata of
// every call, and Roundtable reads them.
//
// Configured by the standard variables: OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), OTEL_EXPORTER_OTLP_INSECURE, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES; OTEL_TRACES_EXPORTER=none turns export off. With no endpoint
// set nothing is exported either, but spans still get real trace ids, so traceparent
// still reaches Roundtable.

import (
	"context"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// serviceName is the default service.name; OTEL_SERVICE_NAME wins.
const serviceName = "roundtable-gateway-go"

// setupTracing installs the global tracer provider and the W3C tracecontext + baggage
// propagators. The returned shutdown flushes pending spans; call it before exit.
func setupTracing(ctx context.Context) (shutdown func(context.Context) error, exporting bool, err error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(serviceName)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		return nil, false, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	if endpoint && os.Getenv("OTEL_TRACES_EXPORTER") != "none" {
		// The exporter reads endpoint, insecure, headers, timeout and compression from
		// the OTEL_EXPORTER_OTLP_* variables itself.
		exporter, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, false, err
		}
		opts = append(opts, sdktrace.WithBatcher(exporter))
		exporting = true
	}
	provider := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(provider)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{},
	))
	return provider.Shutdown, exporting, nil
}

// withBaggage puts the correlation fields (key, value, key, value...) on the context;
// the baggage propagator sends them to Roundtable with every call made under it.
func withBaggage(ctx context.Context, kv ...string) (context.Context, error) {
	var members []baggage.Member
	for i := 0; i+1 < len(kv); i += 2 {
		m, err := baggage.NewMemberRaw(kv[i], kv[i+1])
		if err != nil {
			return ctx, err
		}
		members = append(members, m)
	}
	bag, err := baggage.New(members...)
	if err != nil {
		return ctx, err
	}
	return baggage.ContextWithBaggage(ctx, bag), nil
}
