#!/usr/bin/env bash
# Generates the Python and Go code of the contract under OUT (default: the repo root).
# `make checkgenerate` runs it into a temporary folder and diffs the result against the tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
py=${PYTHON:-$root/.venv/bin/python}
bin=$root/.tools/bin
go_module=github.com/roundtable/roundtable/clients/go

mkdir -p "$out/python/roundtable/v1" "$out/clients/go"
rm -f "$out"/python/roundtable/v1/*_pb2*.py "$out"/python/roundtable/v1/*_pb2*.pyi
rm -rf "$out/clients/go/roundtable"

cd "$root/proto"
protos=(roundtable/v1/*.proto)
# Generated Python imports itself by proto path (roundtable.v1.*), so it lands in the
# roundtable package as the subpackage roundtable.v1: never edited, excluded from lint.
"$py" -m grpc_tools.protoc -I. \
  --python_out="$out/python" --pyi_out="$out/python" --grpc_python_out="$out/python" \
  --plugin=protoc-gen-go="$bin/protoc-gen-go" --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
  --go_out="$out/clients/go" --go_opt=module=$go_module \
  --go-grpc_out="$out/clients/go" --go-grpc_opt=module=$go_module \
  "${protos[@]}"
printf '"""Generated from proto/roundtable/v1 by `make generate`; never edit."""\n' \
  > "$out/python/roundtable/v1/__init__.py"
