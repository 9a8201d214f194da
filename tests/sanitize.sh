#!/usr/bin/env bash
# The clang stage (.ci/run calls it after the README's test command): a
# clang build of every target in build-fuzz/ with its lock analysis as an
# error (-Wthread-safety -Werror=thread-safety, top-level CMakeLists.txt),
# ASan + UBSan (UB aborts) and libFuzzer coverage, then the unit,
# integration, crash and fuzz tests in it. The fuzz label there fuzzes each target for KVMEM_FUZZ_SECONDS
# (default 60) from its seeds and regression inputs, besides replaying them.
#   bash tests/sanitize.sh            # everything
#   KVMEM_FUZZ_SECONDS=600 bash tests/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/bootstrap.sh
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DKVMEM_FUZZ=ON \
  -DKVMEM_FUZZ_SECONDS="${KVMEM_FUZZ_SECONDS:-60}"
cmake --build build-fuzz -j2
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-fuzz --output-on-failure -j2 -L 'unit|integration|crash|fuzz'
