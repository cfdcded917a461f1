# loopbus build, test and benchmark entry points.
GO       ?= go
BIN      ?= bin/loopbus
PKGS     ?= ./...
GOFLAGS  ?=

.PHONY: build test vet fmt-check bench run-example fuzz clean

build:
	$(GO) build -o $(BIN) ./cmd/loopbus

# test: formatting, vet, then every test with the race detector (the
# end-to-end tests build and drive the real binary).
test: fmt-check vet
	$(GO) test -race -count=1 -timeout 30m $(PKGS)

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# run-example: the writing-kit pipeline on the embedded default.
run-example: build
	$(BIN) run examples/writing-kit/pipeline.yaml --input examples/writing-kit/article.md --data .loopbus

# fuzz: each fuzz target briefly.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 20s ./internal/pipeline/
	$(GO) test -run '^$$' -fuzz FuzzFoldManifest -fuzztime 20s -fuzzminimizetime 3s ./projections/

clean:
	rm -rf bin
