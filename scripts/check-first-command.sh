#!/usr/bin/env bash
# The README's first command, exactly as written (`make run`), must serve on this checkout:
# it starts it, waits until the health service answers SERVING, then stops it with SIGTERM
# (the graceful stop, which must exit 0). Used by .ci/run on the clean clone CI makes.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
setsid make run >"$log" 2>&1 &
pid=$!
# SIGTERM to what make started (the server), as a supervisor stops it: make then exits
# with the server's own exit code. Anything left in the group goes afterwards.
stop() { pkill -TERM -P "$pid" 2>/dev/null || true; }
trap 'rm -f "$log"; kill -KILL -- "-$pid" 2>/dev/null || true' EXIT
# make run builds the venv first on a fresh clone: allow it the time pip takes.
for _ in $(seq 1 1200); do
  if grep -q "roundtable serving on" "$log"; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "make run exited before serving:"; cat "$log"; exit 1
  fi
  sleep 0.5
done
if ! grep -q "roundtable serving on" "$log"; then
  echo "make run did not serve within 10 minutes:"; cat "$log"; stop; exit 1
fi
status=$(.venv/bin/python - <<'PY'
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

with grpc.insecure_channel("127.0.0.1:50051") as channel:
    answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
print(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
PY
) || { echo "health check failed:"; cat "$log"; stop; exit 1; }
stop
code=0
wait "$pid" || code=$?
echo "make run: health $status; stopped with exit code $code"
[ "$status" = SERVING ] && [ "$code" = 0 ] || { cat "$log"; exit 1; }
