# SPDX-License-Identifier: Apache-2.0
# The two commands a newcomer needs: `make demo` and `make test`.
# Both install what they need first (scripts/deps.sh).
SHELL := /bin/bash
export PATH := $(CURDIR)/.tools/go/bin:$(PATH)
# The one place the version is set (the Python package reads it too).
VERSION := $(shell cat python/nvfeed/VERSION)
GOLDFLAGS := -ldflags "-X main.version=$(VERSION)"

.PHONY: demo test deps build bench fuzz venv wheel

deps:
	@bash scripts/deps.sh

build: deps
	@mkdir -p bin
	go build $(GOLDFLAGS) -o bin/ ./cmd/... ./tools/...

# Runs the main job on a generated ImageNet-shaped demo dataset.
demo: build venv
	bash scripts/demo.sh

# Runs every test: vet, staticcheck, mypy --strict on the client (nvfeed,
# and dali_source.py, its DALI external_source shim), the Go
# tests under the race detector, then the Python suite against a real
# loaderd (and real DALI where it installs). Tests that need root or loop
# devices skip with the reason; with NVFEED_REQUIRE_PRIVILEGED=1 (.ci/run)
# such a skip is a failure.
test: deps venv
	go vet ./...
	.tools/bin/staticcheck ./...
	cd python && ../.venv/bin/mypy --strict nvfeed dali_source.py
	go test -race -count=1 ./...
	@mkdir -p bin
	go build $(GOLDFLAGS) -o bin/ ./cmd/...
	go build -tags nvfeed_faults -o bin/loaderd-faults ./cmd/loaderd  # the test build: serve --inject-eio (tests/test_errors.py)
	cd python && ../.venv/bin/pytest -q -rs tests  # not `python -m`: the tests import the installed client

# Benchmarks (not tests): writes bench/RESULTS.md from their output
# (bench/out/). Needs root; about 30 minutes on the development VM at
# the default 5 rounds.
# make bench's before and after (bench/baseline.sh) compares this tree with
# BENCH_BASELINE: by default the last commit before the loader's plan, the
# one backend contract and the client's split.
BENCH_BASELINE ?= cd2fc6a
# Rounds of every measuring step: each round runs every case in turn (the
# rounds interleave), and each figure is their median with its spread
# (bench/rounds.py). wds.sh's rounds apart: its shuffle quality is one
# order per reader, and its throughput feeds no goal.
ROUNDS ?= 5
WDS_ROUNDS ?= 1

# One step of make bench: its output in bench/out/$(1), between a first
# line naming the commit it ran on (+changes: with uncommitted changes
# outside bench/) and a last one saying how long it took; bench/results.py
# shows both.
bench_step = set -o pipefail; { echo "step: commit $$(git rev-parse --short HEAD)$$(git diff --quiet HEAD -- . ':!bench' || echo +changes), started $$(date -u +%FT%TZ)"; $(2); echo "step: took $$SECONDS s"; } | tee bench/out/$(1)

bench: build venv
	@mkdir -p bench/out
	$(call bench_step,go-bench.txt,go test -run XXX -bench . -benchtime 3x ./bmap/ ./loader/)
	$(call bench_step,run.txt,bash bench/run.sh $(ROUNDS))
	$(call bench_step,node.txt,bash bench/node.sh $(ROUNDS))
	$(call bench_step,e2e-ram-output.txt,bash bench/e2e.sh ram $(ROUNDS))
	$(call bench_step,e2e-ram-operator.txt,CONSUME=operator bash bench/e2e.sh ram $(ROUNDS))
	$(call bench_step,e2e-virtio-operator.txt,CONSUME=operator bash bench/e2e.sh virtio $(ROUNDS))
	$(call bench_step,tensors.txt,TOTAL_MB=1024 bash bench/tensors.sh $(ROUNDS))
	$(call bench_step,roi.txt,bash bench/roi.sh $(ROUNDS))
	$(call bench_step,wds.txt,bash bench/wds.sh $(WDS_ROUNDS))
	$(call bench_step,table.txt,bash bench/table.sh $(ROUNDS))
	$(call bench_step,lifetime.txt,bash bench/lifetime_cost.sh 15)
	$(call bench_step,dalipad.txt,bash bench/dali_pad_cost.sh 5)
	$(call bench_step,scale.txt,{ echo "files: $${BENCH_SCALE_N:-1281167}"; N=$${BENCH_SCALE_N:-1281167} bash bench/scale.sh $(ROUNDS); })
	$(call bench_step,baseline.txt,bash bench/baseline.sh $(BENCH_BASELINE) $(ROUNDS))
	python3 bench/results.py bench/out > bench/RESULTS.md

venv:
	@bash scripts/venv.sh

fuzz: deps
	go test -run XXX -fuzz FuzzDecode -fuzztime 60s ./bmap/
	go test -run XXX -fuzz FuzzParse -fuzztime 30s ./bmap/npy/
	go test -run XXX -fuzz FuzzParseConfig -fuzztime 30s ./cmd/loaderd/
	go test -run XXX -fuzz FuzzState -fuzztime 20s ./loader/
	go test -run XXX -fuzz FuzzAppendNextFrame -fuzztime 20s ./cmd/loaderd/internal/wire/
	for f in FuzzOpenRequest FuzzNextRequest FuzzReleaseRequest FuzzStreamRequest FuzzStreamFrames; do \
		go test -run XXX -fuzz "^$$f\$$" -fuzztime 20s ./cmd/loaderd/internal/serve/ || exit 1; \
	done

# One pip install: the client and both binaries (scripts/wheel.sh), as
# dist/nvfeed-$(VERSION)-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl.
# Needs Go, objcopy and python3 only: not the test tools or the venv.
wheel:
	@bash scripts/deps.sh wheel
	bash scripts/wheel.sh
