#!/usr/bin/env bash
# make demo: starts a sidecar (offline model, a throwaway database), runs a count-off,
# an @mention, a parallel @all, an open discussion, a stop, and a turn whose member calls
# tools on an MCP server (one call approved on the way), then shuts it down.
# make demo-llm (scripts/demo.sh --llm): the same against the real model of scripts/llm.sh
# (llama-server with SmolLM2-135M-Instruct; built once, started if it is not running),
# but for the tool turns, which keep the offline model (a 135M model calls no tool unshown).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rt=$root/.venv/bin/roundtable
py=$root/.venv/bin/python
work=$(mktemp -d)
port=${DEMO_PORT:-50151}
target=127.0.0.1:$port
model=()
if [ "${1:-}" = --llm ]; then
  base_url=$("$root/scripts/llm.sh")
  # The example snapshot: the demo roster, SmolLM2 as the default model, 64 output tokens a
  # speaker (a 135M model rambles); --base-url points it at the port llama-server got.
  model=(--snapshot "$root/examples/llm-snapshot.json" --model openai:smollm2 --base-url "$base_url")
  echo "== model: openai:smollm2 at $base_url"
fi

"$rt" serve --listen "$target" --store "sqlite:///$work/demo.db" --offline-token-delay-ms 15 \
  --log-level WARNING 2>"$work/serve.log" &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT

"$py" - "$target" <<'PY'
import sys, time, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
deadline = time.time() + 30
while True:
    try:
        with grpc.insecure_channel(sys.argv[1]) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
            if r.status == health_pb2.HealthCheckResponse.SERVING:
                break
    except grpc.RpcError:
        if time.time() > deadline:
            sys.exit("sidecar did not become healthy")
        time.sleep(0.2)
PY

echo "== count-off"; "$rt" chat "${model[@]}" --target "$target" --thread demo-1 "大家报数！"
echo; echo "== @mention"; "$rt" chat "${model[@]}" --target "$target" --thread demo-2 "@Mei @Kai what do you make of this? Remember that I prefer short answers."
echo; echo "== @all, answering at once (--parallel: SPEAKER_CONCURRENCY_PARALLEL)"; "$rt" chat "${model[@]}" --parallel --target "$target" --thread demo-5 "@all what should we cook tonight?"
echo; echo "== open discussion"; "$rt" chat "${model[@]}" --target "$target" --thread demo-3 "Should we learn to brew tea or build a robot this weekend?"
echo; echo "== stop (a second turn on the same thread stops the live one at its next speaker)"
# The two chats run at once; each one's lines are printed whole, the stopped turn's first.
"$rt" chat "${model[@]}" --target "$target" --thread demo-4 "@all tell me about your day" >"$work/talk.out" &
talk=$!
sleep 0.6
"$rt" chat "${model[@]}" --target "$target" --thread demo-4 "停止" >"$work/stop.out"
wait $talk
cat "$work/talk.out"; echo; cat "$work/stop.out"

# Tools: the test MCP server (tests/support/mcp_server.py: weather, read-only; note, a write
# that needs a person's approval), on a free port. --approve always answers the permission
# request as a script would; without it, roundtable chat asks at the terminal (y/n).
(cd "$root" && exec "$py" -m tests.support.mcp_server --port 0) >"$work/mcp.log" 2>&1 &
mcp=$!
trap 'kill -TERM $server $mcp 2>/dev/null; wait $server $mcp 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  mcp_port=$(sed -n 's/^mcp test server listening on port \([0-9]*\)$/\1/p' "$work/mcp.log")
  [ -n "$mcp_port" ] && break
  sleep 0.1
done
[ -n "$mcp_port" ] || { cat "$work/mcp.log"; exit 1; }
tools=(--tools "http://127.0.0.1:$mcp_port/mcp")
if [ ${#model[@]} -gt 0 ]; then
  # A 135M model does not call a tool from its description alone (make test-llm shows
  # SmolLM2 calling one once shown an example call): these turns use the offline model.
  echo; echo "== the tool turns use the offline model: SmolLM2-135M does not call tools unprompted"
fi
echo; echo "== a tool call (weather: read-only, runs at once)"
"$rt" chat --kind single "${tools[@]}" --target "$target" --thread demo-6 "use weather for Paris"
echo; echo "== a tool call that needs approval (note: approved with --approve always)"
"$rt" chat --kind single "${tools[@]}" --approve always --target "$target" --thread demo-7 "用 note 记 买牛奶"
