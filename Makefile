# locker: two modules. The root module (the library) has unit tests that need no
# server; the integration module (integration/, its own go.mod) has everything that
# talks to real servers: integration/testserver, each backend's conformance run, fault
# tests and benchmarks (see README "Running the tests"). Every target that needs servers
# goes through scripts/with-servers.sh, which finds or sets up a Docker engine and
# cleans up after. PKGS is a package pattern applied in both modules. The
# examples that need a dependency the library must not have (the Prometheus
# client) are modules of their own too, EXAMPLE_MODULES, tested and vetted
# with the root module.

GO       ?= go
SHELL    := /bin/bash
PKGS     ?= ./...
STATICCHECK_VERSION ?= v0.8.2
COMPOSE  ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)

WITH_SERVERS := LOCKER_REQUIRE_SERVERS=1 $(CURDIR)/scripts/with-servers.sh
# in_root and in_integration run a go command in one module; a PKGS pattern that names
# no package in that module (./memlock/... in integration, ./testserver/... in the
# root) is not an error there.
in_module = cd $(1) && if [ -n "$$($(GO) list -e -f '{{if or .GoFiles .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' $(PKGS) 2>/dev/null)" ]; then $(2); else echo "$(1): no packages match $(PKGS)"; fi
in_root = $(call in_module,.,$(1))
in_integration = $(call in_module,integration,$(1))
EXAMPLE_MODULES := examples/observe-prometheus
in_examples = $(foreach m,$(EXAMPLE_MODULES),($(call in_module,$(m),$(1))) &&) true

.PHONY: build install readme-check soak chaos all test vet lint fmt-check bench cover servers-up servers-down servers-env docker-up docker-down

all: lint test

## test: go vet, then every test with the race detector: the root module's unit
## tests, then the integration module's against real servers. A failed chaos run
## leaves its history and porcupine's visualisation under .artifacts/.
ARTIFACTS := -artifacts -outputdir $(CURDIR)/.artifacts
## INTEGRATION_P: integration packages run at once. Each starts servers of its own
## and spends most of its time waiting on them (leases running out, faults): with
## three at a time the 2 cores were idle half the time (vmstat every 10s over a
## whole run: 49% idle) and the run took the sum of the packages' times over
## three (about 4,060 s / 3), so four run at once; the longest package (sqltable:
## three databases) takes about 18 minutes on its own. scripts/pkg-order.sh names
## the longest packages first, so that they start first.
INTEGRATION_P ?= 4
test: vet readme-check
	mkdir -p .artifacts
	$(call in_root,$(GO) test -race -count=1 $(ARTIFACTS) $(PKGS))
	$(call in_examples,$(GO) test -race -count=1 $(PKGS))
	$(call in_integration,$(WITH_SERVERS) $(GO) test -race -count=1 -p $(INTEGRATION_P) -timeout 25m $(ARTIFACTS) $$(GO=$(GO) $(CURDIR)/scripts/pkg-order.sh $(PKGS)))

## chaos: only the chaos suite (conformance/chaos) on every backend, each run
## CHAOS_DURATION long: a soak (make test runs it for 30s a backend). The full
## log goes to .artifacts/chaos.log; the report line of every run is printed at
## the end.
CHAOS_DURATION ?= 10m
chaos:
	mkdir -p .artifacts
	set -o pipefail; { $(call in_root,LOCKER_CHAOS_DURATION=$(CHAOS_DURATION) $(GO) test -v -race -count=1 -timeout 0 $(ARTIFACTS) -run 'TestChaos' $(PKGS)) && \
	$(call in_integration,LOCKER_CHAOS_DURATION=$(CHAOS_DURATION) $(WITH_SERVERS) $(GO) test -v -race -count=1 -timeout 0 $(ARTIFACTS) -run 'TestChaos' $(PKGS)); } 2>&1 | \
	tee .artifacts/chaos.log | grep -E '^(ok|FAIL|--- FAIL|panic)|chaos report|violations'

## build, install: the locker command (locker and locker-full) as README's
## install line builds it: without cgo (a static binary: no dynamic loader,
## no libc at start; SQLite is pure Go) and without the symbol table and
## DWARF (-s -w: a third smaller on disk). build puts them in bin/, install
## in $(go env GOBIN).
LOCKER_BUILD := CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w'
build:
	mkdir -p bin
	$(LOCKER_BUILD) -o bin/ ./cmd/locker ./cmd/locker/locker-full
install:
	CGO_ENABLED=0 $(GO) install -trimpath -ldflags='-s -w' ./cmd/locker/...

## readme-check: run README's first command exactly as written (no server needed)
readme-check:
	@out="$$($(GO) run ./cmd/locker run demo -- echo hello)"; \
	if [ "$$out" != hello ]; then echo "README's first command printed '$$out', want hello"; exit 1; fi; \
	echo "readme-check: go run ./cmd/locker run demo -- echo hello: ok"

vet:
	$(call in_root,$(GO) vet $(PKGS))
	$(call in_examples,$(GO) vet $(PKGS))
	$(call in_integration,$(GO) vet $(PKGS))

## lint: go vet, gofmt, and staticcheck when the module proxy serves it
lint: vet fmt-check
	@if $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -version >/dev/null 2>&1; then \
		echo "staticcheck $(STATICCHECK_VERSION)"; \
		$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKGS) && \
		(cd integration && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKGS)) && \
		$(call in_examples,$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKGS)); \
	else \
		echo "lint: staticcheck $(STATICCHECK_VERSION) not available from the module proxy; skipped"; \
	fi

fmt-check:
	@out="$$(gofmt -l .)"; \
	if [ -n "$$out" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$out"; exit 1; fi

## soak: the conformance suite SOAK_COUNT times in a row on every backend (memlock and
## the toy in the root, the server backends in integration/), to catch flaky cases;
## not part of test (about 20 minutes a backend at the default count)
SOAK_COUNT ?= 20
soak:
	$(call in_root,$(GO) test -race -count=$(SOAK_COUNT) -failfast -run 'TestConformance|TestToy$$' $(PKGS))
	$(call in_integration,$(WITH_SERVERS) $(GO) test -race -count=$(SOAK_COUNT) -failfast -timeout 0 -run 'TestConformance' $(PKGS))

## bench: benchmarks: memlock's in the root module, the server backends' in the
## integration module against real servers
bench:
	$(call in_root,$(GO) test -run '^$$' -bench . -benchmem $(PKGS))
	$(call in_integration,$(WITH_SERVERS) $(GO) test -run '^$$' -bench . -benchmem $(PKGS))

## cover: tests of both modules with coverage of the library's packages (the
## integration tests count for the backends they exercise); writes coverage.out
## and prints the total
COVERDIR := $(CURDIR)/.coverdata
cover:
	rm -rf $(COVERDIR) && mkdir -p $(COVERDIR)
	$(call in_root,$(GO) test -count=1 -cover -covermode=atomic -coverpkg=github.com/go-locker/locker/... $(PKGS) -args -test.gocoverdir=$(COVERDIR))
	$(call in_integration,$(WITH_SERVERS) $(GO) test -count=1 -cover -covermode=atomic -coverpkg=github.com/go-locker/locker/... $(PKGS) -args -test.gocoverdir=$(COVERDIR))
	$(GO) tool covdata textfmt -i=$(COVERDIR) -pkg=$$($(GO) list ./... | paste -sd, -) -o coverage.out
	$(GO) tool cover -func=coverage.out | tail -1

## servers-up: long-running servers from the official images on their standard ports
## (docker-compose.yml); then `eval "$$(make -s servers-env)"` and run go test
servers-up:
	$(COMPOSE) -f docker-compose.yml up -d --wait
	@$(MAKE) -s servers-env

servers-env:
	@echo "export LOCKER_TEST_REDIS_ADDR=127.0.0.1:6379"
	@echo "export LOCKER_TEST_REDIS_NODES=127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382"
	@echo "export LOCKER_TEST_POSTGRES_DSN='postgres://locker:locker@127.0.0.1:5432/locker?sslmode=disable'"
	@echo "export LOCKER_TEST_MYSQL_DSN='locker:locker@tcp(127.0.0.1:3306)/locker'"
	@echo "export LOCKER_TEST_ZOOKEEPER_ADDR=127.0.0.1:2181"
	@echo "export LOCKER_TEST_ETCD_ADDR=127.0.0.1:2379"

servers-down:
	$(COMPOSE) -f docker-compose.yml down -v

## docker-up / docker-down: the project's own Docker engine and local images (root,
## Debian/Ubuntu; for machines without Docker or without an image registry)
docker-up:
	scripts/docker-up.sh >/dev/null
	@echo "export DOCKER_HOST=unix://$${LOCKER_DOCKER_SOCK:-/run/locker-docker.sock} LOCKER_TEST_IMAGES=local TESTCONTAINERS_RYUK_DISABLED=true"

docker-down:
	scripts/docker-down.sh
