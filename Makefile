# Every build, test and benchmark goes through here. Plain go build, go test
# and go vet work too: giouring's go:linkname is patched out in
# third_party/giouring (third_party/README.md).
GO       ?= go
BIN      := bin

# What --version prints (internal/buildinfo), stamped into every binary:
# the tag when HEAD has one (vX.Y.Z), else the version python/pyproject.toml
# says with -dev; the commit and its time. Outside a git checkout: unknown.
BASEVERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' python/pyproject.toml)
VERSION     ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo v$(BASEVERSION)-dev)
COMMIT      ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
DATE        ?= $(shell git log -1 --format=%cI 2>/dev/null)
MODULE      := $(shell $(GO) list -m 2>/dev/null)
LDFLAGS     := -X $(MODULE)/internal/buildinfo.Version=$(VERSION) -X $(MODULE)/internal/buildinfo.Commit=$(COMMIT) -X $(MODULE)/internal/buildinfo.Date=$(DATE)
GOBUILD  := CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)'
GOTEST   := CGO_ENABLED=1 $(GO) test

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

.PHONY: all build install acceptance deps testsummary vet unit integration python-test test stress module-test demo bench-engine bench-mount bench-hook gpu-build gpu-test fuzz clean

all: build

build:
	mkdir -p $(BIN)
	$(GOBUILD) -o $(BIN)/ ./cmd/...

# make install [PREFIX=/usr/local] [DESTDIR=...]: the daemon, the mount
# helper, the systemd units, the udev rule and sysusers group, the kernel
# module's source as a DKMS package, and the docs (docs/install.md). The
# benchmark and demo commands in bin/ are not installed. mount(8) looks for
# helpers in /sbin only, so MOUNTHELPERDIR does not follow PREFIX; systemd
# and udev also read PREFIX's lib/ when PREFIX is /usr/local.
PREFIX         ?= /usr/local
BINDIR         ?= $(PREFIX)/bin
DOCDIR         ?= $(PREFIX)/share/doc/phxmount
MOUNTHELPERDIR ?= /sbin
UNITDIR        ?= $(PREFIX)/lib/systemd/system
UDEVRULESDIR   ?= $(PREFIX)/lib/udev/rules.d
SYSUSERSDIR    ?= $(PREFIX)/lib/sysusers.d
DKMSDIR        ?= /usr/src/phxfs-$(BASEVERSION)
MODULE_SRC     := Makefile LICENSE $(patsubst module/%,%,$(wildcard module/*.[ch] module/include/*.h module/include/uapi/*.h))

install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MOUNTHELPERDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(UDEVRULESDIR) \
		$(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(DOCDIR)/examples $(DESTDIR)$(DKMSDIR)
	install -m 0755 $(BIN)/phxmount $(DESTDIR)$(BINDIR)/phxmount
	ln -sfn $(BINDIR)/phxmount $(DESTDIR)$(MOUNTHELPERDIR)/mount.fuse.phxmount
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' packaging/systemd/phxmount@.service.in \
		>$(DESTDIR)$(UNITDIR)/phxmount@.service
	install -m 0644 packaging/udev/70-phxfs.rules $(DESTDIR)$(UDEVRULESDIR)/
	install -m 0644 packaging/sysusers/phxmount.conf $(DESTDIR)$(SYSUSERSDIR)/
	install -m 0644 packaging/systemd/phxmount.conf.example packaging/systemd/models.mount.example $(DESTDIR)$(DOCDIR)/examples/
	install -m 0644 README.md LICENSE NOTICE docs/*.md $(DESTDIR)$(DOCDIR)/
	cd module && for f in $(MODULE_SRC); do install -D -m 0644 $$f $(DESTDIR)$(DKMSDIR)/$$f; done
	sed 's|@VERSION@|$(BASEVERSION)|g' packaging/dkms/dkms.conf.in >$(DESTDIR)$(DKMSDIR)/dkms.conf
	@echo "installed phxmount $(VERSION) under $(DESTDIR)$(PREFIX) (helper $(DESTDIR)$(MOUNTHELPERDIR)/mount.fuse.phxmount, DKMS source $(DESTDIR)$(DKMSDIR))"

# The install and operation acceptance test (.ci/run runs it after make
# test): scripts/acceptance.sh.
acceptance:
	bash scripts/acceptance.sh

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
# mounts (no torch or GPU needed). Bounded like the Go tiers: a test that
# hangs is killed with SIGABRT after PYTEST_TIMEOUT seconds, and
# faulthandler prints every thread's stack first, so the log says where.
PYTEST_TIMEOUT ?= 900
python-test: build testsummary
	cd python && PHX_GOLDEN_GO=1 PHXMOUNT_BIN=$(CURDIR)/$(BIN)/phxmount timeout -s ABRT -k 30 $(PYTEST_TIMEOUT) \
		python3 -X faulthandler -m unittest discover -v -s tests 2>&1 | \
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

# The hook's engines' loop against the same slices read in bulk (emulated
# device, root).
bench-hook: build
	cd python && PHXMOUNT_BIN=$(CURDIR)/$(BIN)/phxmount python3 tests/bench_hook_loop.py

# Tier 4: the GPU path (build here; runs where there is a GPU, else SKIP).
gpu-test:
	bash scripts/gpu-test.sh

clean:
	rm -rf $(BIN)
