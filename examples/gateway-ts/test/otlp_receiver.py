"""An OTLP/gRPC receiver for the gateway's trace test: every span received becomes one JSON
line in the file given as the first argument. Prints `listening <port>` once it serves.

Run with the repository's venv (grpcio and opentelemetry-proto are Roundtable's own
dependencies): .venv/bin/python examples/gateway-ts/test/otlp_receiver.py spans.jsonl
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

lock = threading.Lock()


def main(out_path: str) -> None:
    out = open(out_path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life)

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 (the generated name)
            with lock:
                for rs in request.resource_spans:
                    service = next(
                        (a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), ""
                    )
                    for scope in rs.scope_spans:
                        for span in scope.spans:
                            line = {
                                "service": service,
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "attributes": {a.key: a.value.string_value for a in span.attributes},
                            }
                            out.write(json.dumps(line) + "\n")
                out.flush()
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening {port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1).wait()


if __name__ == "__main__":
    main(sys.argv[1])
