# The two commands of the README: `make run` (the main job) and `make test`.
# Both install the Debian packages they need first (tools/install_deps.sh).
# `make run` builds only the pipeflow executable, `make bench` only it and the
# benchmarks; `make build` and `make test` build everything (every test).
# CI (.ci/run) also runs `make check-sanitizers`: the whole suite under
# ASan + UBSan, every fuzz target for FUZZ_RUNS inputs (one clang build for
# both) and the runtime's tests under TSan.

PRESET ?= release
BUILD_DIR := build/$(PRESET)
PIPEFLOW := $(BUILD_DIR)/pipeflow
JOBS ?= $(shell nproc)

DEBS := cmake g++ ninja-build pkg-config \
        libfmt-dev nlohmann-json3-dev libcli11-dev \
        libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin zlib1g-dev libyaml-cpp-dev \
        libgtest-dev libbenchmark-dev fortunes \
        clang libclang-rt-14-dev chromium-headless-shell

FUZZ_RUNS ?= 30000

.PHONY: all deps configure build test run bench clean test-asan test-tsan fuzz check-sanitizers

all: build

deps:
	@bash tools/install_deps.sh $(DEBS)

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	@ctest --preset $(PRESET)

run: configure
	@cmake --build --preset $(PRESET) -j $(JOBS) --target pipeflow
	$(PIPEFLOW) train --config examples/train_1f1b_2stage.json --overwrite

bench: configure
	@cmake --build --preset $(PRESET) -j $(JOBS) --target pipeflow benchmarks
	@bash bench/run_all.sh $(BUILD_DIR)

test-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	@ctest --preset asan

test-tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS)
	@ctest --preset tsan

# The fuzz targets are built by the asan preset, beside the tests.
fuzz: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS) --target fuzz_targets
	@bash tools/fuzz.sh build/asan $(FUZZ_RUNS)

check-sanitizers: test-asan fuzz test-tsan

clean:
	rm -rf build
