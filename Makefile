# Build, prepare and test aenv. `make test` is the whole suite (root).
CACHE ?= /var/cache/aenv
BASE_ROOTFS ?= $(CACHE)/base-rootfs
CODE_INTERPRETER_ROOTFS ?= $(CACHE)/code-interpreter-rootfs
GO ?= go

.PHONY: build console-assets deps base code-interpreter bench-interpreter test test-go test-e2e test-e2e-python test-install test-fuzz lint clean bench-cluster bench-migrate cross release manifests check-manifests

build:
	$(GO) build -o bin/aenv ./cmd/aenv
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/envd ./cmd/envd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/interpreter ./cmd/interpreter

deps:
	scripts/install-deps.sh

# The web console's third-party files (uPlot; xterm.js and its fit
# addon), from npm at the versions internal/console/web/package-lock.json
# pins, copied into the embedded assets as the ES modules and styles the
# packages ship. The copies are committed, so `go build` needs no npm;
# run this after changing a version there.
CONSOLE_WEB = internal/console/web
CONSOLE_VENDOR = internal/console/assets/vendor
CONSOLE_NM = $(CONSOLE_WEB)/node_modules
console-assets:
	cd $(CONSOLE_WEB) && npm ci --ignore-scripts --no-audit --no-fund
	rm -rf $(CONSOLE_VENDOR) && mkdir -p $(CONSOLE_VENDOR)/uplot $(CONSOLE_VENDOR)/xterm $(CONSOLE_VENDOR)/xterm-addon-fit
	cp $(CONSOLE_NM)/uplot/dist/uPlot.esm.js $(CONSOLE_NM)/uplot/dist/uPlot.min.css \
		$(CONSOLE_NM)/uplot/LICENSE $(CONSOLE_VENDOR)/uplot/
	cp $(CONSOLE_NM)/@xterm/xterm/lib/xterm.mjs $(CONSOLE_NM)/@xterm/xterm/css/xterm.css \
		$(CONSOLE_NM)/@xterm/xterm/LICENSE $(CONSOLE_VENDOR)/xterm/
	cp $(CONSOLE_NM)/@xterm/addon-fit/lib/addon-fit.mjs $(CONSOLE_NM)/@xterm/addon-fit/LICENSE $(CONSOLE_VENDOR)/xterm-addon-fit/
	@for p in uplot @xterm/xterm @xterm/addon-fit; do \
		echo "$(CONSOLE_VENDOR): $$p $$(node -p "require('./$(CONSOLE_NM)/$$p/package.json').version")"; done

# The CLI alone, for the machines people drive a cluster from: the
# client commands build for every target (the host's commands, which run
# sandboxes, are Linux only and say so elsewhere).
CLI_TARGETS = linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

# Every CLI target compiles (into a scratch directory, thrown away).
cross:
	@start=$$(date +%s); out=$$(mktemp -d); trap 'rm -rf "$$out"' EXIT; \
	for t in $(CLI_TARGETS); do \
		CGO_ENABLED=0 GOOS=$${t%/*} GOARCH=$${t#*/} $(GO) build -trimpath -o "$$out/aenv-$${t%/*}-$${t#*/}" ./cmd/aenv || exit 1; \
	done; \
	echo "cross: the CLI builds for $(CLI_TARGETS) ($$(( $$(date +%s) - start ))s)"

# dist/aenv-<version>-<os>-<arch>.tar.gz (the binary and the README) for
# every CLI target, and their SHA256SUMS.
release:
	rm -rf dist && mkdir -p dist
	@for t in $(CLI_TARGETS); do \
		os=$${t%/*}; arch=$${t#*/}; name=aenv-$(VERSION)-$$os-$$arch; \
		mkdir -p dist/$$name && cp README.md dist/$$name/ && \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '-s -w' -o dist/$$name/aenv ./cmd/aenv && \
		tar -C dist --sort=name --owner=0 --group=0 --numeric-owner -czf dist/$$name.tar.gz $$name && \
		rm -rf dist/$$name || exit 1; \
		echo "dist/$$name.tar.gz"; \
	done
	cd dist && sha256sum *.tar.gz > SHA256SUMS && cat SHA256SUMS

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

# Helm from its module: the first run builds it (minutes), later ones are
# cached. It does not touch go.mod.
HELM ?= $(GO) run helm.sh/helm/v3/cmd/helm@v3.22.0
CHART = deploy/helm/aenv

# helm_render VALUES... DIR renders the chart as release aenv in namespace
# aenv, one file per template, into DIR.
define helm_render
	@rm -rf "$(2)" && mkdir -p "$(2)" && tmp=$$(mktemp -d) && \
	$(HELM) template aenv $(CHART) --namespace aenv $(1) --output-dir "$$tmp" >/dev/null && \
	for f in "$$tmp"/aenv/templates/*.yaml; do \
		{ echo "# Rendered from $(CHART) by make manifests: change the chart, then run it again."; cat "$$f"; } > "$(2)/$${f##*/}"; \
	done; rc=$$?; rm -rf "$$tmp"; exit $$rc
endef

# deploy/kubernetes/*.yaml, the plain manifests, from the chart with
# deploy/helm/kubernetes-values.yaml. deploy's Go tests (make test-go) decode
# them strictly and check what they must hold.
manifests:
	$(call helm_render,-f deploy/helm/kubernetes-values.yaml,$(CURDIR)/.manifests.new)
	@rm -f deploy/kubernetes/*.yaml
	@mv .manifests.new/*.yaml deploy/kubernetes/ && rmdir .manifests.new && ls deploy/kubernetes

# helm lint; the committed manifests equal to a fresh render; the chart
# rendered with its other value sets (deploy/helm/aenv/ci: an external
# etcd, S3 and cert-manager) and all of them decoded strictly against the
# Kubernetes API types. Part of `make test` (not `make lint`: helm's
# first build takes a couple of minutes).
check-manifests:
	$(HELM) lint $(CHART)
	@for v in $(CHART)/ci/*-values.yaml; do $(HELM) lint $(CHART) -f "$$v" --quiet || exit 1; done
	$(call helm_render,-f deploy/helm/kubernetes-values.yaml,$(CURDIR)/.manifests.check/default)
	@for f in .manifests.check/default/*.yaml; do cmp -s "$$f" "deploy/kubernetes/$${f##*/}" || { echo "deploy/kubernetes/$${f##*/} differs from a fresh render: make manifests"; exit 1; }; done
	@n=$$(ls deploy/kubernetes/*.yaml | wc -l); m=$$(ls .manifests.check/default/*.yaml | wc -l); \
		[ "$$n" = "$$m" ] || { echo "deploy/kubernetes holds $$n manifests, a fresh render $$m: make manifests"; exit 1; }
	$(call helm_render,,$(CURDIR)/.manifests.check/chart-defaults)
	$(call helm_render,-f $(CHART)/ci/external-etcd-values.yaml,$(CURDIR)/.manifests.check/external-etcd)
	$(call helm_render,-f $(CHART)/ci/s3-values.yaml,$(CURDIR)/.manifests.check/s3)
	AENV_RENDERED_DIRS=$(CURDIR)/.manifests.check/chart-defaults:$(CURDIR)/.manifests.check/external-etcd:$(CURDIR)/.manifests.check/s3 \
		$(GO) test -count=1 -run 'TestNoSecretOnACommandLine|TestResourceRequests|TestContainerFlags|TestRenderedDecode' ./deploy/
	@rm -rf .manifests.check

# Privileged tests fail instead of skipping when AENV_REQUIRE_PRIVILEGED=1.
# The placement simulation runs scaled down under -race, where timings mean
# nothing; the second run is it at full scale (1,000 nodes, 100,000
# sandboxes, p99 and spread asserted), with its time.
test-go: build base
	AENV_REQUIRE_PRIVILEGED=1 AENV_BASE_ROOTFS=$(BASE_ROOTFS) AENV_BIN_DIR=$(CURDIR)/bin \
		$(GO) test -race -count=1 -timeout 30m ./...
	$(GO) test -count=1 -run '^TestPlacementAtScale$$' ./internal/cluster/

test-e2e: build base code-interpreter
	cd e2e && AENV_BIN_DIR=$(CURDIR)/bin AENV_BASE_ROOTFS=$(BASE_ROOTFS) AENV_CODE_INTERPRETER_ROOTFS=$(CODE_INTERPRETER_ROOTFS) \
		node --test --test-concurrency=1

# The official E2B Python SDK against a real server (e2e/python, one
# server for the suite). AENV_PYTHON_E2B names the SDK: a directory with
# lib/e2b (default ../shared/python-e2b) or `pip` for one installed with
# pip; Debian's Python, with the SDK's dependencies from install-deps.sh.
PYTHON ?= /usr/bin/python3
test-e2e-python: build base code-interpreter
	cd e2e/python && AENV_REQUIRE_PRIVILEGED=1 AENV_BIN_DIR=$(CURDIR)/bin AENV_BASE_ROOTFS=$(BASE_ROOTFS) \
		AENV_CODE_INTERPRETER_ROOTFS=$(CODE_INTERPRETER_ROOTFS) $(PYTHON) -m unittest -v

# Each fuzz target of a decoder of client input runs briefly (the seed
# corpora also run in test-go); FUZZTIME=1m digs deeper. FuzzUnpackLayer
# unpacks as root: without it the run fails rather than skips. A target
# that fuzzes nothing (moved or renamed) fails too. A target whose workers
# overran -fuzztime on a slow input without a failing input (Go's fuzzing
# then fails with "context deadline exceeded"; FuzzUnpackLayer did once
# on this machine) runs once more, saying so; a second overrun fails.
FUZZTIME ?= 15s
FUZZ_TARGETS = ./internal/buildspec:FuzzParse ./internal/api:FuzzListQuery ./internal/api:FuzzDecodeBody ./internal/image:FuzzCleanPath ./internal/proxy:FuzzConnectStream ./internal/envd:FuzzFilesUpload ./internal/egress:FuzzPeekName \
	./internal/image:FuzzUnpackLayer ./internal/buildspec:FuzzUnpackContext
test-fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; start=$$(date +%s); log=$$(mktemp); \
		if ! AENV_REQUIRE_PRIVILEGED=1 $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg >"$$log" 2>&1; then \
			if grep -q 'context deadline exceeded' "$$log" && ! grep -q 'Failing input written' "$$log"; then \
				echo "fuzz $$pkg $$fn: its workers overran -fuzztime on a slow input (no failing input); running it once more:"; tail -5 "$$log"; \
				AENV_REQUIRE_PRIVILEGED=1 $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg >"$$log" 2>&1 || { cat "$$log"; rm -f "$$log"; exit 1; }; \
			else cat "$$log"; rm -f "$$log"; exit 1; fi; \
		fi; \
		if ! grep -q '^fuzz: elapsed' "$$log"; then echo "fuzz $$pkg $$fn: nothing was fuzzed (no such target?)"; cat "$$log"; rm -f "$$log"; exit 1; fi; rm -f "$$log"; \
		echo "fuzz $$pkg $$fn: ok ($$(( $$(date +%s) - start ))s)"; \
	done

# scripts/install.sh into scratch paths, checked, then uninstalled (root).
test-install: base
	scripts/test-install.sh

test: lint cross check-manifests test-go test-fuzz test-e2e test-e2e-python test-install

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
	rm -rf bin dist .manifests.new .manifests.check
