# Every build, test and benchmark goes through here: giouring reaches into the
# standard library with go:linkname, which current Go only links with
# -checklinkname=0 (see README).
GO       ?= go
LDFLAGS  := -ldflags=-checklinkname=0
GOBUILD  := CGO_ENABLED=0 $(GO) build $(LDFLAGS)
GOTEST   := CGO_ENABLED=1 $(GO) test $(LDFLAGS)
BIN      := bin

.PHONY: all build vet unit integration python-test test module-test demo bench-engine bench-mount gpu-build gpu-test fuzz clean

all: build

build:
	mkdir -p $(BIN)
	$(GOBUILD) -o $(BIN)/ ./cmd/...

vet:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet $(LDFLAGS) ./...

# Tier 1: unit tests with the race detector.
unit:
	$(GOTEST) -race -count=1 $$($(GO) list ./... | grep -v /integration)

# Tier 2: real mounts (root, /dev/fuse).
integration: build
	$(GOTEST) -count=1 -timeout 15m ./integration/...

# The Python client: ABI against the Go encoder's vectors, the safetensors
# planner, and real emulated-device mounts (no torch or GPU needed).
python-test: build
	cd python && PHXMOUNT_BIN=$(CURDIR)/$(BIN)/phxmount python3 -m unittest discover -v -s tests

# Tier 3: the kernel module in a QEMU VM.
module-test:
	bash module/test/run-vm.sh

# The README's test command: tiers 1-3 (tier 4 needs a GPU and skips here).
test: vet unit integration python-test module-test

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
