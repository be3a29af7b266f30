# Roundtable: make run (serve with embedded defaults), make test (everything CI tests).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --warn-undefined-variables --no-builtin-rules

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := $(CURDIR)/.tools/bin
BUF := npx --yes @bufbuild/buf@1.75.0
GO_TOOLS := $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc $(TOOLS)/grpcurl
ARGS ?=
# The OpenTelemetry Collector that make collector builds: one release for the builder and
# every module in otelcol/builder.yaml.
OTELCOL_VERSION := 0.161.0
OTELCOL := $(TOOLS)/roundtable-otelcol
OTELCOL_OUT ?= var/otelcol

.PHONY: help run test test-clients-go test-clients-py test-llm test-collector collector lint generate checkgenerate breaking demo demo-llm llm graph tools venv postgres bench bench-quick clean
.PHONY: test-clients-ts generate-ts checkgenerate-ts demo-ts

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

# Two distributions share the namespace package `roundtable`: clients/python (roundtable-client:
# the generated roundtable.v1 and the client library roundtable_client) and python (the server).
$(VENV)/.installed: python/pyproject.toml python/constraints.txt clients/python/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c python/constraints.txt -e "clients/python[test]" -e "python[dev]"
	@touch $@

venv: $(VENV)/.installed ## Create the virtualenv and install the package with dev tools

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0
$(TOOLS)/grpcurl:
	GOBIN=$(TOOLS) go install -ldflags "-X main.version=v1.9.3" github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3

tools: $(GO_TOOLS) ## Install the Go code generators and grpcurl into .tools/bin

# Built once (about 2.5-4 minutes on 2 cores), again only when the manifest changes. The
# builder writes its sources and binary under .tools/otelcol-build; only the binary is kept.
$(OTELCOL): otelcol/builder.yaml
	GOBIN=$(CURDIR)/.tools/otelcol-builder go install go.opentelemetry.io/collector/cmd/builder@v$(OTELCOL_VERSION)
	rm -rf .tools/otelcol-build
	.tools/otelcol-builder/builder --config=otelcol/builder.yaml
	install -m 0755 .tools/otelcol-build/roundtable-otelcol $@
	rm -rf .tools/otelcol-build

collector: $(OTELCOL) ## Build the OTel Collector once (.tools/bin), start it: OTLP on 127.0.0.1:4317/4318, files in var/otelcol
	mkdir -p $(OTELCOL_OUT)
	OTELCOL_OUT=$(OTELCOL_OUT) $(OTELCOL) --config=otelcol/config.yaml

run: venv ## Serve on 127.0.0.1:50051 with a SQLite file under ./var and the offline model
	$(VENV)/bin/roundtable serve $(ARGS)

test: venv tools ## Run the whole test suite (real servers, real ports, SQLite and Postgres)
	eval "$$(scripts/postgres.sh env)"; $(PY) -m pytest $(ARGS)

test-clients-go: venv ## The Go client library's conformance tests (clients/conformance.md) against real sidecars
	cd clients/go && ROUNDTABLE_BIN=$(CURDIR)/$(VENV)/bin/roundtable go test -count=1 $(ARGS) ./...

test-clients-py: venv ## The Python client library's conformance tests (clients/conformance.md) against real sidecars
	cd clients/python && ROUNDTABLE_BIN=$(CURDIR)/$(VENV)/bin/roundtable $(CURDIR)/$(PY) -m pytest $(ARGS) tests

test-llm: venv ## The real-model tests (tests/real_model) against llama-server, built once by make llm
	scripts/llm.sh install
	ROUNDTABLE_TEST_LLM=1 $(PY) -m pytest -m real_model tests/real_model $(ARGS)

test-collector: venv $(OTELCOL) ## The trace tests against the real OTel Collector (builds it first)
	ROUNDTABLE_OTELCOL=$(OTELCOL) $(PY) -m pytest -m collector $(ARGS)

generate: venv tools ## Regenerate the Go, Python (buf.gen.yaml) and TypeScript (clients/ts/buf.gen.yaml) code of proto/
	BUF="$(BUF)" scripts/generate.sh
	$(MAKE) --no-print-directory generate-ts

checkgenerate: venv tools ## Fail when generated Go, Python or TypeScript code is not what proto/ generates
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	BUF="$(BUF)" scripts/generate.sh "$$tmp"; \
	diff -r "$$tmp/clients/python/roundtable/v1" clients/python/roundtable/v1 -x __pycache__ && \
	diff -r "$$tmp/clients/go/roundtable" clients/go/roundtable && \
	echo "generated code is current"
	$(MAKE) --no-print-directory checkgenerate-ts

# The TypeScript client (clients/ts) and its example gateway (examples/gateway-ts): npm ci from
# the lock files, protoc-gen-es from clients/ts/node_modules, buf as above.
TS_CLIENT := clients/ts
TS_GATEWAY := examples/gateway-ts
NPM_CI := npm ci --no-audit --no-fund --loglevel=error

generate-ts: ## Regenerate the TypeScript code of proto/ (clients/ts/src/gen)
	cd $(TS_CLIENT) && $(NPM_CI) && $(BUF) generate

checkgenerate-ts: ## Fail when clients/ts/src/gen is not what proto/ generates
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	cd $(TS_CLIENT) && test -x node_modules/.bin/protoc-gen-es || $(NPM_CI); \
	$(BUF) generate -o "$$tmp" && diff -r "$$tmp/src/gen" src/gen && echo "generated TypeScript code is current"

test-clients-ts: venv ## The TypeScript client's conformance tests (C1-C8) and the TS gateway's, against real sidecars
	cd $(TS_CLIENT) && $(NPM_CI)
	$(MAKE) --no-print-directory checkgenerate-ts
	cd $(TS_CLIENT) && npx tsc -p tsconfig.json && npx tsc -p tsconfig.test.json
	cd $(TS_CLIENT) && ROUNDTABLE_BIN=$(CURDIR)/$(VENV)/bin/roundtable node --test --test-concurrency=1 build/test/*.test.js
	cd $(TS_GATEWAY) && $(NPM_CI) && npx tsc -p tsconfig.json
	cd $(TS_GATEWAY) && ROUNDTABLE_BIN=$(CURDIR)/$(VENV)/bin/roundtable node --test --test-concurrency=1 dist/test/*.test.js

demo-ts: ## One count-off through examples/gateway-ts against a sidecar on 127.0.0.1:50051 (make run)
	cd $(TS_CLIENT) && $(NPM_CI) && npx tsc -p tsconfig.json
	cd $(TS_GATEWAY) && $(NPM_CI) && npx tsc -p tsconfig.json && node dist/src/main.js --text "大家报数！"

lint: venv ## buf lint + format, ruff, mypy, go vet + gofmt
	$(BUF) lint
	$(BUF) format --diff --exit-code
	$(VENV)/bin/ruff check python tests bench clients/python
	$(VENV)/bin/ruff format --check python tests bench clients/python
	$(VENV)/bin/mypy
	cd clients/go && go vet ./... && test -z "$$(gofmt -l .)"
	cd examples/gateway-go && go vet ./... && test -z "$$(gofmt -l .)"
	cd bench/goclient && go vet ./... && test -z "$$(gofmt -l .)"

breaking: ## buf breaking check of proto/ against the previous commit
	@if git rev-parse -q --verify HEAD~1 >/dev/null; then \
	  $(BUF) breaking --against '.git#ref=HEAD~1,subdir=proto' && echo "no breaking change against HEAD~1"; \
	else echo "no previous commit to compare with"; fi

bench: venv ## Benchmarks B1-B7 and B9 (~10 min): bench/results/latest.{md,json}
	bench/run.sh $(ARGS)

bench-quick: venv ## Benchmarks, quick mode (CI smoke, ~2 min; figures not asserted)
	bench/run.sh --quick $(ARGS)

graph: venv ## Print the conversation graph as Mermaid
	$(VENV)/bin/roundtable graph

demo: venv ## Start a sidecar, run a count-off, an @mention, an open discussion and a stop
	scripts/demo.sh

llm: ## Start llama-server with SmolLM2-135M on loopback (built once, ~12 min) and print its URL
	scripts/llm.sh $(ARGS)

demo-llm: venv ## The demo against the real model of make llm (starts it if it is not running)
	scripts/demo.sh --llm

postgres: ## Start the test PostgreSQL (installs it from Debian if missing) and print its DSN
	scripts/postgres.sh

clean: ## Remove the venv, tools, databases and caches
	scripts/postgres.sh stop
	rm -rf $(VENV) .tools var .pytest_cache .mypy_cache .ruff_cache bench/.venv-peer
