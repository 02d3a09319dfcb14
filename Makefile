# The two set-up commands (see README.md):
#   make run   — install what is missing, build, run the supervisor on the simulated node
#   make test  — install what is missing, build with ASan+UBSan and -Werror, run every test
# Also: make bench (benchmarks, optimised build), make fuzz (the fuzz tests for FUZZ_SECONDS each
# instead of make test's 5 s), make build, make clean.

# ccache hits across clones (CI builds a fresh clone in another folder): paths under the
# checkout are hashed relative to it, and the build directory itself is not hashed.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

RELEASE_DIR ?= build/release
TEST_DIR    ?= build/asan
JOBS        ?= $(shell nproc)
CTEST_JOBS  ?= $(JOBS)
# Seconds each fuzz test runs in `make fuzz`; under 550 (the fuzz tests' ctest TIMEOUT is 600 s,
# and each first compiles its target with clang).
FUZZ_SECONDS ?= 300

.PHONY: deps build run test fuzz bench clean

deps:
	@tools/install-deps.sh

$(RELEASE_DIR)/build.ninja: | deps
	cmake -S . -B $(RELEASE_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGNS_BUILD_TESTS=OFF -DGNS_BUILD_BENCH=ON -DGNS_STATIC_DEPS=ON

build: deps $(RELEASE_DIR)/build.ninja
	cmake --build $(RELEASE_DIR) -j $(JOBS)

run: build
	tools/sim/run-local.sh $(RELEASE_DIR)

$(TEST_DIR)/build.ninja: | deps
	cmake -S . -B $(TEST_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGNS_SANITIZE=ON -DGNS_WERROR=ON -DGNS_UNITY_BUILD=ON -DGNS_BUILD_BENCH=ON -DGNS_SHARED_LIBS=ON

test: deps $(TEST_DIR)/build.ninja
	cmake --build $(TEST_DIR) -j $(JOBS)
	ctest --test-dir $(TEST_DIR) --output-on-failure -j $(CTEST_JOBS)

# The fuzz tests build their targets with clang themselves; they need only the configured tree.
fuzz: deps $(TEST_DIR)/build.ninja
	GNS_FUZZ_SECONDS=$(FUZZ_SECONDS) ctest --test-dir $(TEST_DIR) -L fuzz --no-tests=error --output-on-failure -j $(CTEST_JOBS)

bench: build
	tools/run-bench.sh $(RELEASE_DIR)

clean:
	rm -rf build .run
