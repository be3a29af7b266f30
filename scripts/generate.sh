#!/usr/bin/env bash
# Generates the Go and Python code of the contract under OUT (default: the repository root)
# with `buf generate` and the local plugins buf.gen.yaml names (make tools, make venv).
# `make checkgenerate` runs it into a temporary folder and diffs the result against the tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
read -r -a buf <<<"${BUF:-npx --yes @bufbuild/buf@1.75.0}"

mkdir -p "$out/clients/python/roundtable/v1" "$out/clients/go"
rm -f "$out"/clients/python/roundtable/v1/*_pb2*.py "$out"/clients/python/roundtable/v1/*_pb2*.pyi
rm -rf "$out/clients/go/roundtable"

cd "$root" # buf.gen.yaml's plugin paths are relative to the repository root
"${buf[@]}" generate --template buf.gen.yaml -o "$out"
# Generated Python imports itself by proto path (roundtable.v1.*): it is the subpackage v1 of
# the namespace package roundtable, in the distribution clients/python. Never edited.
printf '"""Generated from proto/roundtable/v1 by `make generate`; never edit."""\n' \
  > "$out/clients/python/roundtable/v1/__init__.py"
# PEP 561: the .pyi files are the types (in a namespace package the marker goes in the subpackage).
: > "$out/clients/python/roundtable/v1/py.typed"
