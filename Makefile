# loopbus build, test and benchmark entry points.
GO       ?= go
BIN      ?= bin/loopbus
PKGS     ?= ./...
# TESTPKGS: the end-to-end package takes longest, so with every package
# it is named first and starts first (go test runs two packages at once
# on two cores; in one measured pair the go test phase took 5 min 24 s
# so, against 5 min 50 s).
TESTPKGS ?= $(if $(filter ./...,$(PKGS)),./e2e/ ./...,$(PKGS))
GOFLAGS  ?=

.PHONY: build docs test test-e2e-race test-cluster vet fmt-check bench bench-quick run-example fuzz clean chromium screenshot

build:
	$(GO) build -o $(BIN) ./cmd/loopbus

# docs: the command line reference in docs/cli, generated from the
# commands themselves (make test fails when it is stale).
docs:
	$(GO) test -count=1 -run '^TestCLIReference$$' ./cmd/loopbus/ -update

# test: formatting, vet, every test with the race detector (the end-to-end
# tests build and drive the real binary). The fuzz targets' checked-in
# seed corpora run as part of these tests; fuzzing itself is make fuzz,
# which .ci/run also runs. The end-to-end tests mostly wait on the
# processes they start, so four run at once even on two cores, and three
# packages are tested at once (go test's default is one per core) so that
# one waiting on its processes or timers leaves no core idle. go test's
# own vet checks are a subset of the vet target's, which ran just before:
# -vet=off spares running them again (24 s of a 5.7-minute build of every
# test from an empty cache). The binary the end-to-end tests drive is
# built without the race detector here: race-built, its services took
# 2.3 times the CPU (194 s against 84 s for the fork, chaos and security
# tests in one measured pair), which kept make test over eight minutes on
# two cores. The tests themselves, and every package's services run in
# process by their own tests, keep -race; test-e2e-race runs the
# end-to-end tests against a race-built binary, and .ci/run runs it too.
test: fmt-check vet chromium
	LOOPBUS_E2E_BINARY_RACE=0 $(GO) test -race -vet=off -count=1 -p 3 -parallel 4 -timeout 30m $(TESTPKGS)

# test-e2e-race: the end-to-end tests against a binary built with the
# race detector, so that a race in how the command wires its services is
# reported by the process it happens in.
test-e2e-race:
	LOOPBUS_E2E_BINARY_RACE=1 $(GO) test -race -count=1 -parallel 4 -timeout 30m ./e2e/

# test-cluster: every test on a three-node cluster (docs/CLUSTER.md),
# kept out of test by the build tag cluster and named TestCluster...:
# first those of the packages, with the race detector, one package at a
# time (three nodes in one process starve on two cores beside other
# tests), then the long trials without it: 300 sessions through a killed
# and a frozen node, and 40 submitted one after another. About ten
# minutes; .ci/run runs it after test. The trials print the figures the
# docs give.
CLUSTER_TRIALS = ^TestCluster(Faults|SessionsAllDecided)$$
test-cluster:
	$(GO) test -race -tags cluster -count=1 -p 1 -timeout 40m -run '^TestCluster' -skip '$(CLUSTER_TRIALS)' ./bus/ ./client/ ./agentworker/ ./orchestrator/ ./e2e/
	$(GO) test -tags cluster -count=1 -timeout 40m -run '$(CLUSTER_TRIALS)' -v ./e2e/

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags cluster $(PKGS)

# chromium: the dashboard's browser tests drive Debian's Chromium; it is
# installed when missing. Only when that is impossible are those tests
# skipped, and this says so loudly.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the dashboard's browser tests"; \
	  sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo -n"; \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 || \
	  echo "WARNING: Chromium could not be installed: the dashboard's BROWSER TESTS WILL BE SKIPPED"; }

# screenshot: the session page's picture in README, made by the browser test.
screenshot:
	LOOPBUS_SCREENSHOT=$(CURDIR)/docs/dashboard.png $(GO) test -count=1 -run '^TestBrowserFollowsASession$$' ./dashboard/

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# bench: the packages' own benchmarks, then the end-to-end suite in bench/
# at full size under both sync modes (docs/PERFORMANCE.md); its last line
# is the summary of the default-sync figures.
bench:
	$(GO) test -run '^$$' -bench . -benchmem $$($(GO) list $(PKGS) | grep -v '/bench$$')
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 120m ./bench/ 2>&1 | $(GO) run ./bench/cmd/benchline

# bench-quick: the bench/ suite at small sizes, default sync only, in under
# a minute; the last line is the summary.
bench-quick:
	LOOPBUS_BENCH_QUICK=1 $(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 5m ./bench/ 2>&1 | $(GO) run ./bench/cmd/benchline

# run-example: the writing-kit pipeline on the embedded default.
run-example: build
	$(BIN) run examples/writing-kit/pipeline.yaml --input examples/writing-kit/article.md --data .loopbus

# fuzz: each fuzz target for FUZZTIME (make fuzz FUZZTIME=10m for a longer
# hunt); new failing inputs are written to the package's testdata/fuzz.
# .ci/run counts executions instead (FUZZTIME=20000x): a duration races
# the fuzzing engine's own deadline on a busy machine and can fail with
# "context deadline exceeded" although nothing was found (a known Go race).
FUZZTIME    ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 3s ./bus/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 3s ./definition/
	$(GO) test -run '^$$' -fuzz '^FuzzParseLoops$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 3s ./definition/
	$(GO) test -run '^$$' -fuzz '^FuzzFoldManifest$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 3s ./projections/
	$(GO) test -run '^$$' -fuzz '^FuzzParseFile$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 3s ./backlog/

clean:
	rm -rf bin
