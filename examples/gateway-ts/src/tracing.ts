/**
 * OpenTelemetry. The gateway's trace continues inside Roundtable: a Connect interceptor
 * makes a client span per RPC and injects W3C `traceparent` and `baggage` into the call's
 * gRPC metadata, and Roundtable reads them.
 *
 * Configured by the standard variables: OTEL_EXPORTER_OTLP_ENDPOINT (or
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTLP/gRPC), OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES;
 * OTEL_TRACES_EXPORTER=none turns export off. With no endpoint nothing is exported, but spans
 * still get real trace ids, so traceparent still reaches Roundtable.
 */

import { context, propagation, SpanKind, SpanStatusCode, trace, type Span, type Tracer } from "@opentelemetry/api";
import { CompositePropagator, W3CBaggagePropagator, W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-grpc";
import { detectResources, envDetector, resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, type SpanProcessor } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import type { Interceptor } from "@roundtable/client";

/** The default service.name; OTEL_SERVICE_NAME wins. */
export const SERVICE_NAME = "roundtable-gateway-ts";

/** The tracer of this gateway. */
export const TRACER_NAME = "github.com/roundtable/roundtable/examples/gateway-ts";

/**
 * Installs the global tracer provider (AsyncLocalStorage context, W3C tracecontext + baggage
 * propagators). The returned shutdown flushes pending spans; call it before exit.
 */
export function setupTracing(): { shutdown: () => Promise<void>; exporting: boolean } {
  const env = process.env;
  const endpoint = (env.OTEL_EXPORTER_OTLP_ENDPOINT ?? env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? "") !== "";
  const exporting = endpoint && env.OTEL_TRACES_EXPORTER !== "none";
  const spanProcessors: SpanProcessor[] = exporting ? [new BatchSpanProcessor(new OTLPTraceExporter())] : [];
  const resource = resourceFromAttributes({ "service.name": SERVICE_NAME }).merge(
    detectResources({ detectors: [envDetector] }), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
  );
  const provider = new NodeTracerProvider({ resource, spanProcessors });
  provider.register({
    propagator: new CompositePropagator({
      propagators: [new W3CTraceContextPropagator(), new W3CBaggagePropagator()],
    }),
  });
  return { shutdown: () => provider.shutdown(), exporting };
}

/**
 * A client span per RPC (`roundtable.v1.OrchestratorService/StartRun`), child of the active
 * span, with `traceparent` and `baggage` injected into the call's metadata. A streaming call's
 * span ends with its stream.
 */
export function tracingInterceptor(tracer: Tracer): Interceptor {
  return (next) => async (req) => {
    const span = tracer.startSpan(`${req.service.typeName}/${req.method.name}`, {
      kind: SpanKind.CLIENT,
      attributes: { "rpc.system": "grpc", "rpc.service": req.service.typeName, "rpc.method": req.method.name },
    });
    propagation.inject(trace.setSpan(context.active(), span), req.header, {
      set: (headers, key, value) => headers.set(key, value),
    });
    let response;
    try {
      response = await next(req);
    } catch (e) {
      fail(span, e);
      span.end();
      throw e;
    }
    if (!response.stream) {
      span.end();
      return response;
    }
    return { ...response, message: ending(response.message, span) };
  };
}

async function* ending<T>(messages: AsyncIterable<T>, span: Span): AsyncIterable<T> {
  try {
    yield* messages;
  } catch (e) {
    fail(span, e);
    throw e;
  } finally {
    span.end();
  }
}

function fail(span: Span, error: unknown): void {
  span.recordException(error instanceof Error ? error : String(error));
  span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
}
