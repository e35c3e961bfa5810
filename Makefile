# kvtier: the two commands a newcomer types are `make demo` and `make test`.
# Both install missing Debian packages first (scripts/deps.sh, as root).
BUILD      ?= build
JOBS       ?= $(shell nproc)
FUZZ_SECS  ?= 10
CMAKE_FLAGS ?=

.PHONY: all deps build demo demo-python test test-fast test-release test-asan test-tsan test-fuzz bench clean install
PREFIX     ?= /usr/local

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/kvtier demo
	$(BUILD)/kvtier demo --server

# The Python binding's example (python/, examples/python/), Debian's python3.
demo-python: build
	KVTIER_LIB=$(BUILD)/libkvtier.so /usr/bin/python3 examples/python/engine_demo.py
	KVTIER_LIB=$(BUILD)/libkvtier.so /usr/bin/python3 examples/python/sglang_hicache_example.py
	KVTIER_LIB=$(BUILD)/libkvtier.so /usr/bin/python3 examples/python/vllm_connector_example.py

# The whole suite: plain build, then a Release (-O3) build of the library
# and CLI, then ASan+UBSan, then TSan on the concurrent tests, then each
# fuzz target briefly.
test: test-fast test-release test-asan test-tsan test-fuzz
	@echo "make test: all suites passed"

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# -O3 turns on GCC checks (format truncation) that -O2 does not, and the
# build treats warnings as errors: a user's Release build must compile.
test-release: deps
	@cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build-release -j $(JOBS) --target kvtier_cli

test-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVT_SANITIZE=address >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

test-tsan: deps
	@cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKVT_SANITIZE=thread >/dev/null
	@cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -L concurrent -j $(JOBS)

test-fuzz: deps
	@CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug \
	  -DKVT_SANITIZE=address -DKVT_FUZZ=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@scripts/run-fuzzers.sh build-fuzz $(FUZZ_SECS)

# PREFIX (default /usr/local) and DESTDIR (staging) as usual; then
# `ldconfig` and, for the service, docs/server.md "Running under systemd".
install: build
	DESTDIR=$(DESTDIR) cmake --install $(BUILD) --prefix $(PREFIX)

bench: build
	$(BUILD)/kvtier bench copy
	$(BUILD)/kvtier bench index

clean:
	rm -rf build build-release build-asan build-tsan build-fuzz
