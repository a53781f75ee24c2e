# The two commands of the README: `make run` (the main job) and `make test`.
# Both install the Debian packages they need first (tools/install_deps.sh).

PRESET ?= release
BUILD_DIR := build/$(PRESET)
PIPEFLOW := $(BUILD_DIR)/pipeflow
JOBS ?= $(shell nproc)

DEBS := cmake g++ ninja-build pkg-config \
        libfmt-dev nlohmann-json3-dev libcli11-dev \
        libopenblas-dev libopenmpi-dev openmpi-bin \
        libgtest-dev libbenchmark-dev fortunes

.PHONY: all deps configure build test run bench clean

all: build

deps:
	@bash tools/install_deps.sh $(DEBS)

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	@ctest --preset $(PRESET)

run: build
	$(PIPEFLOW) train --config examples/train_1f1b_2stage.json

bench: build
	@bash bench/run_all.sh $(BUILD_DIR)

clean:
	rm -rf build
