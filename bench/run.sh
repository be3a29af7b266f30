#!/usr/bin/env bash
# `make bench` / `make bench-quick`: the benchmark suite of issue 7.
#
#   bench/run.sh [--quick] [--only B1,B5] [--skip-peer]
#
# B1-B6 run with the product's venv (.venv, made by `make venv`); B7's peer (AutoGen) runs in
# its own venv, bench/.venv-peer, made here from bench/peer-requirements.txt. Results:
# bench/results/latest.{md,json} (plus the raw latest.suite.json / latest.peer.json).
# Exit status: non-zero when a benchmark crashed; an unmet goal is reported, not an error.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${BENCH_PY:-.venv/bin/python}
PEER=bench/.venv-peer
PEER_PYTHON=${PYTHON:-python3}
RESULTS=bench/results
SUITE_ARGS=()
SKIP_PEER=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) SUITE_ARGS+=(--quick); shift ;;
    --only) SUITE_ARGS+=(--only "$2"); shift 2 ;;
    --skip-peer) SKIP_PEER=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
QUICK=()
for a in "${SUITE_ARGS[@]+"${SUITE_ARGS[@]}"}"; do [[ "$a" == --quick ]] && QUICK=(--quick); done

if [[ ! -x "$PY" ]]; then
  echo "bench: $PY not found; run 'make venv' first" >&2
  exit 1
fi
mkdir -p "$RESULTS"
rm -f "$RESULTS"/latest.suite.json "$RESULTS"/latest.peer.json

rc=0
started=$(date +%s)
if [[ $SKIP_PEER -eq 0 ]]; then
  # The peer's venv is (re)made only when its requirements changed.
  if ! cmp -s bench/peer-requirements.txt "$PEER/.installed" 2>/dev/null; then
    echo "[bench] creating $PEER (AutoGen peer, B7)"
    rm -rf "$PEER"
    "$PEER_PYTHON" -m venv "$PEER"
    "$PEER/bin/python" -m pip install -q --disable-pip-version-check -r bench/peer-requirements.txt
    cp bench/peer-requirements.txt "$PEER/.installed"
  fi
fi

# B1's Postgres variant uses BENCH_POSTGRES_DSN, or the tests' Postgres when it is set
# (eval "$(scripts/postgres.sh env)"); without either it is left out.
export BENCH_POSTGRES_DSN=${BENCH_POSTGRES_DSN:-${ROUNDTABLE_TEST_POSTGRES_DSN:-}}

# --skip-peer: B1 leaves out its interleaved AutoGen batches too.
[[ $SKIP_PEER -eq 1 ]] && export BENCH_PEER_PYTHON=""

echo "[bench] suite B1-B6, B8, B9 ${SUITE_ARGS[*]+"${SUITE_ARGS[*]}"}"
"$PY" bench/suite.py "${SUITE_ARGS[@]+"${SUITE_ARGS[@]}"}" --out "$RESULTS/latest.suite.json" || rc=$?

if [[ $SKIP_PEER -eq 0 ]]; then
  echo "[bench] peer B7 (AutoGen, $PEER)"
  "$PEER/bin/python" bench/peer_autogen.py "${QUICK[@]+"${QUICK[@]}"}" --out "$RESULTS/latest.peer.json" >/dev/null || rc=$?
fi

"$PY" bench/report.py --suite "$RESULTS/latest.suite.json" --peer "$RESULTS/latest.peer.json" --out "$RESULTS/latest"
echo "[bench] done in $(( $(date +%s) - started )) s (exit $rc)"
exit $rc
