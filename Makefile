# Build, prepare and test aenv. `make test` is the whole suite (root).
CACHE ?= /var/cache/aenv
BASE_ROOTFS ?= $(CACHE)/base-rootfs
CODE_INTERPRETER_ROOTFS ?= $(CACHE)/code-interpreter-rootfs
GO ?= go

.PHONY: build deps base code-interpreter bench-interpreter test test-go test-e2e test-install test-fuzz lint clean bench-cluster bench-migrate

build:
	$(GO) build -o bin/aenv ./cmd/aenv
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/envd ./cmd/envd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/interpreter ./cmd/interpreter

deps:
	scripts/install-deps.sh

# The base template's root filesystem, built once from Debian packages and
# shared by every test server.
base: build
	@if [ ! -x $(BASE_ROOTFS)/bin/bash ]; then bin/aenv template build-base $(BASE_ROOTFS); fi

# The code-interpreter template's root filesystem (~1.4 GB of Debian
# packages: a Jupyter kernel, numpy, pandas, matplotlib, scipy), built once.
code-interpreter: build
	@if [ ! -d $(CODE_INTERPRETER_ROOTFS)/usr/lib/python3/dist-packages/ipykernel ]; then \
		start=$$(date +%s); bin/aenv template build-code-interpreter $(CODE_INTERPRETER_ROOTFS); \
		echo "code-interpreter root filesystem built in $$(( $$(date +%s) - start ))s"; fi

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Privileged tests fail instead of skipping when AENV_REQUIRE_PRIVILEGED=1.
test-go: build base
	AENV_REQUIRE_PRIVILEGED=1 AENV_BASE_ROOTFS=$(BASE_ROOTFS) AENV_BIN_DIR=$(CURDIR)/bin \
		$(GO) test -race -count=1 -timeout 30m ./...

test-e2e: build base code-interpreter
	cd e2e && AENV_BIN_DIR=$(CURDIR)/bin AENV_BASE_ROOTFS=$(BASE_ROOTFS) AENV_CODE_INTERPRETER_ROOTFS=$(CODE_INTERPRETER_ROOTFS) \
		node --test --test-concurrency=1

# Each fuzz target of a decoder of client input runs briefly (the seed
# corpora also run in test-go); FUZZTIME=1m digs deeper. FuzzUnpackLayer
# unpacks as root: without it the run fails rather than skips.
FUZZTIME ?= 15s
FUZZ_TARGETS = ./internal/build:FuzzParse ./internal/api:FuzzListQuery ./internal/api:FuzzDecodeBody ./internal/image:FuzzCleanPath ./internal/proxy:FuzzConnectStream ./internal/envd:FuzzFilesUpload ./internal/egress:FuzzPeekName \
	./internal/image:FuzzUnpackLayer ./internal/build:FuzzUnpackContext
test-fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; start=$$(date +%s); log=$$(mktemp); \
		AENV_REQUIRE_PRIVILEGED=1 $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg >"$$log" 2>&1 || { cat "$$log"; rm -f "$$log"; exit 1; }; rm -f "$$log"; \
		echo "fuzz $$pkg $$fn: ok ($$(( $$(date +%s) - start ))s)"; \
	done

# scripts/install.sh into scratch paths, checked, then uninstalled (root).
test-install: base
	scripts/test-install.sh

test: lint test-go test-fuzz test-e2e test-install

# Benchmarks stay out of `make test`. Creates at concurrency 30 on one node
# and on three (node agents in their own network namespaces).
bench-cluster: build base
	cd e2e && AENV_BIN_DIR=$(CURDIR)/bin AENV_BASE_ROOTFS=$(BASE_ROOTFS) node bench/cluster.mjs

# Migration downtime of a small sandbox moved between two nodes on this
# host: the median of BENCH_MIGRATIONS moves, which fails over 300 ms (root).
BENCH_MIGRATIONS ?= 10
bench-migrate: build base
	AENV_REQUIRE_PRIVILEGED=1 AENV_BASE_ROOTFS=$(BASE_ROOTFS) AENV_BIN_DIR=$(CURDIR)/bin \
		$(GO) test -count=1 -run '^$$' -bench '^BenchmarkMigrate$$' -benchtime $(BENCH_MIGRATIONS)x ./internal/server/

# runCode round trips and create-to-first-result, beside commands.run.
bench-interpreter: build base code-interpreter
	cd e2e && AENV_BIN_DIR=$(CURDIR)/bin AENV_BASE_ROOTFS=$(BASE_ROOTFS) AENV_CODE_INTERPRETER_ROOTFS=$(CODE_INTERPRETER_ROOTFS) \
		node bench/interpreter.mjs

clean:
	rm -rf bin
