# Every build, test and benchmark goes through here. Plain go build, go test
# and go vet work too: giouring's go:linkname is patched out in
# third_party/giouring (third_party/README.md).
GO       ?= go
GOBUILD  := CGO_ENABLED=0 $(GO) build
GOTEST   := CGO_ENABLED=1 $(GO) test
BIN      := bin

# Every tier's run goes through bin/testsummary (internal/testsummary): it
# prints the usual progress, then the tier's skipped tests with their
# reasons, and records them under $(SKIPS); `make test` ends with the
# combined skip summary against internal/testsummary/allowed-skips.txt.
# STRICT=1 (what .ci/run uses): a skip the allow-list does not expect fails
# `make test`, and `make unit` fails rather than run without -race.
SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c
TS          := $(BIN)/testsummary
SKIPS       := $(BIN)/test-skips
STRICT      ?=

.PHONY: all build deps testsummary vet unit integration python-test test stress module-test demo bench-engine bench-mount gpu-build gpu-test fuzz clean

all: build

build:
	mkdir -p $(BIN)
	$(GOBUILD) -o $(BIN)/ ./cmd/...

# The Debian packages the tests and the demo use (idempotent; quick when
# they are there).
deps:
	bash scripts/deps.sh

testsummary:
	@mkdir -p $(BIN) $(SKIPS)
	$(GOBUILD) -o $(TS) ./internal/testsummary

vet:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...

# Tier 1: unit tests with the race detector (which needs cgo: a C
# compiler; scripts/deps.sh installs gcc). Without one it runs without
# -race and says so, unless STRICT=1.
unit: testsummary
	@cgo=1 race=-race cc=$$(CGO_ENABLED=1 $(GO) env CC); \
	if ! command -v "$${cc%% *}" >/dev/null; then \
		echo "unit: no C compiler ($$cc): the race detector needs cgo (scripts/deps.sh installs gcc)"; \
		if [ -n "$(STRICT)" ]; then echo "unit: STRICT=1: not running without -race"; exit 1; fi; \
		echo "unit: running WITHOUT the race detector"; cgo=0 race=; \
	fi; \
	echo "CGO_ENABLED=$$cgo $(GO) test $$race -count=1 -json PACKAGES | $(TS) go -tier unit"; \
	CGO_ENABLED=$$cgo $(GO) test $$race -count=1 -json $$($(GO) list ./... | grep -v /integration) 2>&1 | \
		$(TS) go -tier unit -out $(SKIPS)/unit.jsonl

# Tier 2: real mounts (root, /dev/fuse).
integration: build testsummary
	$(GOTEST) -count=1 -timeout 15m -json ./integration/... 2>&1 | $(TS) go -tier integration -out $(SKIPS)/integration.jsonl

# The Python client: ABI against the Go encoder's vectors (regenerated with
# Go: PHX_GOLDEN_GO=1), the safetensors planner, and real emulated-device
# mounts (no torch or GPU needed).
python-test: build testsummary
	cd python && PHX_GOLDEN_GO=1 PHXMOUNT_BIN=$(CURDIR)/$(BIN)/phxmount python3 -m unittest discover -v -s tests 2>&1 | \
		$(CURDIR)/$(TS) python -tier python -out $(CURDIR)/$(SKIPS)/python.jsonl

# Tier 3: the kernel module in a QEMU VM; the skips of the Go tests that
# ran inside it (go test -v output on its console) are recorded too.
module-test: testsummary
	bash module/test/run-vm.sh
	$(GO) tool test2json -p module-vm <module/test/work/console.log | $(TS) go -q -tier module -out $(SKIPS)/module.jsonl

# The README's test command: tiers 1-3 (tier 4 needs a GPU and skips here),
# after installing the packages they need, then the skip summary.
test: deps testsummary
	rm -f $(SKIPS)/*.jsonl
	$(MAKE) --no-print-directory vet unit integration python-test module-test
	$(TS) check $(if $(STRICT),-strict) $(foreach t,unit integration python module,$(SKIPS)/$(t).jsonl)

# The namespace stress test, for minutes (CI runs it after make test):
# names replaced, unlinked and re-created under readers of three uids, on
# both passthrough modes, every byte checked (integration/namespace_stress_test.go).
STRESS_SECONDS ?= 45
stress: build testsummary
	PHX_STRESS_SECONDS=$(STRESS_SECONDS) $(GOTEST) -count=1 -timeout 20m -run '^TestNamespaceStress$$' -json ./integration/ 2>&1 | \
		$(TS) go -tier integration -out $(SKIPS)/stress.jsonl
	$(TS) check $(if $(STRICT),-strict) $(SKIPS)/stress.jsonl

# scripts/demo.sh installs its packages itself (scripts/deps.sh).
demo:
	bash scripts/demo.sh

bench-engine: build
	bash scripts/bench-engine.sh

bench-mount: build
	bash scripts/bench-mount.sh

# Tier 4: the GPU path (build here; runs where there is a GPU, else SKIP).
gpu-test:
	bash scripts/gpu-test.sh

clean:
	rm -rf $(BIN)
