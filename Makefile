# metergate — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
GO ?= go
STACK := bash deploy/local/stack.sh
WITH_ENV := set -a && . .run/env && set +a &&

.PHONY: help up up-cluster up-sentinel up-kafka-cluster down down-sentinel down-kafka-cluster status migrate build vet test test-short chaos bench lint fuzz

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

up: ## start Redis, PostgreSQL and Kafka on loopback (installs what is missing; state in .run/)
	$(STACK) up

up-cluster: ## also start a 3-master Redis Cluster on 127.0.0.1:7000-7002
	$(STACK) up-cluster

up-sentinel: ## also start a Redis primary (:6380), two replicas (:6381-6382) and 3 Sentinels (:26380-26382)
	$(STACK) up-sentinel

up-kafka-cluster: ## also start a 3-node Kafka cluster (KRaft) on 127.0.0.1:9192-9194: replication 3, min.insync.replicas 2
	$(STACK) up-kafka-cluster

down: ## stop everything `make up`, `make up-cluster`, `make up-sentinel` and `make up-kafka-cluster` started
	$(STACK) down

down-sentinel: ## stop only what `make up-sentinel` started
	$(STACK) down-sentinel

down-kafka-cluster: ## stop only what `make up-kafka-cluster` started
	$(STACK) down-kafka-cluster

status: ## show what the local stack runs
	$(STACK) status

migrate: up ## apply pending database migrations to the local database
	$(WITH_ENV) $(GO) run ./cmd/reconcile migrate

build: ## build the three binaries into bin/
	$(GO) build -o bin/ ./cmd/admit ./cmd/meter ./cmd/reconcile

vet: ## go vet every package
	$(GO) vet ./...

.PHONY: demo demo-console
demo: up build ## a guided run of the pipeline: 30 s of traffic, reconcile, a period close, a report (DEMO_DURATION=10s: shorter; docs/demo.md)
	$(WITH_ENV) $(GO) run ./cmd/demo

demo-console: up build ## make demo, then serve the console of its data until Ctrl-C (docs/console.md)
	$(WITH_ENV) export DEMO_CONSOLE=1 && $(GO) run ./cmd/demo

test: up up-cluster up-sentinel up-kafka-cluster ## start the stack, then vet and run every test with -race against it
	$(WITH_ENV) export METERGATE_REQUIRE_SERVICES=1 && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 30m ./...
	@# bench/redisrate, the benchmark's peer, is a module of its own (the main one must not depend on it)
	$(WITH_ENV) export METERGATE_REQUIRE_SERVICES=1 && cd bench/redisrate && $(GO) vet ./... && $(GO) test -race -count=1 ./...

chaos: up up-sentinel up-kafka-cluster ## the fault and bad-input suite in its full form, ending with its scoreboard (make test runs the short form)
	$(GO) test -c -race -o bin/chaos.test ./chaos
	$(WITH_ENV) export METERGATE_REQUIRE_SERVICES=1 METERGATE_CHAOS=full && cd chaos && ../bin/chaos.test -test.count=1 -test.timeout=60m

.PHONY: security
security: up ## the black-box security suite in its full form: probes of each finding and a fuzz of /v1/check, ending with "security: N passed, M failed" (docs/security.md; make test runs the short form)
	$(GO) test -c -race -o bin/security.test ./security
	$(WITH_ENV) export METERGATE_REQUIRE_SERVICES=1 METERGATE_SECURITY=full && cd security && ../bin/security.test -test.count=1 -test.timeout=30m

bench: up up-sentinel build ## measure against baselines of the same run: prints a table, writes bench/results.json (BENCH_FLAGS=-duration=5s …; docs/bench.md)
	$(GO) build -o bin/ ./bench/loadgen
	cd bench/redisrate && $(GO) build -o ../../bin/redisrate .
	$(WITH_ENV) $(GO) run ./bench $(BENCH_FLAGS)

test-short: ## unit tests only: integration tests skip when the services are not set
	$(GO) test -race -count=1 ./...

GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(CURDIR)/.cache/bin/golangci-lint-$(GOLANGCI_LINT_VERSION)

$(GOLANGCI_LINT):
	GOBIN=$(CURDIR)/.cache/bin/tmp $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(CURDIR)/.cache/bin/tmp/golangci-lint $@

lint: $(GOLANGCI_LINT) ## golangci-lint v2 (.golangci.yml) on the module and bench/redisrate; installs the pinned version into .cache/bin
	$(GOLANGCI_LINT) run ./...
	cd bench/redisrate && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...

FUZZTIME ?= 15s
FUZZCACHE ?= $(CURDIR)/.cache/fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 15s); corpus kept in .cache/fuzz, crashers saved to testdata/fuzz (docs/fuzz.md)
	@# go test -fuzz takes one package and one target: list the targets of every package
	@# with a func Fuzz in a _test.go file (go test -list, so build tags count), then loop.
	@# -test.fuzzcachedir: the corpus the fuzzer grows stays in .cache/fuzz, not in GOCACHE.
	@set -uo pipefail; targets=0; failed=(); \
	while IFS='=' read -r pkg dir; do \
	  grep -qs '^func Fuzz' "$$dir"/*_test.go || continue; \
	  list=$$($(GO) test -list '^Fuzz' "$$pkg" </dev/null) || { echo "$$list"; exit 1; }; \
	  for t in $$(grep '^Fuzz' <<<"$$list"); do \
	    targets=$$((targets + 1)); \
	    echo "fuzz: $$pkg $$t for $(FUZZTIME)"; \
	    seen=$$(ls "$$dir/testdata/fuzz/$$t" 2>/dev/null); \
	    for try in 1 2; do \
	      out=$$($(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime "$(FUZZTIME)" $(FUZZFLAGS) "$$pkg" \
	        -args -test.fuzzcachedir="$(FUZZCACHE)/$$pkg" </dev/null 2>&1); rc=$$?; echo "$$out"; \
	      new=$$(comm -13 <(echo "$$seen") <(ls "$$dir/testdata/fuzz/$$t" 2>/dev/null) | sed "s|^|$$dir/testdata/fuzz/$$t/|"); \
	      [ $$rc -ne 0 ] && [ $$try = 1 ] && [ -z "$$new" ] && grep -qx '    context deadline exceeded' <<<"$$out" || break; \
	      echo "fuzz: $$t stopped at the fuzztime deadline with no crasher: Go's coordinator race (go.dev/issue/75804, fixed in Go 1.27); once more"; \
	    done; \
	    [ $$rc -eq 0 ] && continue; \
	    failed+=("$$pkg $$t: $${new:-no new crasher written, see the output above}"); \
	  done; \
	done < <($(GO) list -f '{{.ImportPath}}={{.Dir}}' ./...); \
	[ "$$targets" -gt 0 ] || { echo "fuzz: no fuzz target found"; exit 1; }; \
	if [ $${#failed[@]} -gt 0 ]; then \
	  echo "fuzz: $${#failed[@]} of $$targets targets failed (a crasher in testdata/fuzz/ is a regression test from now on: commit it with the fix):"; \
	  printf '  %s\n' "$${failed[@]}"; exit 1; \
	fi; \
	echo "fuzz: $$targets targets fuzzed for $(FUZZTIME) each, no crasher (corpus: $(FUZZCACHE))"
