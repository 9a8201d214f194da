#!/usr/bin/env bash
# ThreadSanitizer run of the engine and storage tests (kvmem_unit_tests: the
# engine, RocksDB in temp directories, the executor, tiers, recall under
# concurrent appends). A clang build with -fsanitize=thread in build-tsan/,
# where kvmem's locks are std::shared_mutex (base/sync.h): Debian's abseil
# is not built with TSan, so its Mutex hand-offs would all look like races.
# RocksDB, FAISS (OpenMP) and gRPC are not instrumented: races inside them
# are not seen, and their internal synchronisation is invisible (reports
# whose stacks are entirely inside them are suppressed: tests/tsan.supp).
#   bash tests/tsan.sh [gtest filter]
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/bootstrap.sh
CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DKVMEM_TSAN=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-tsan -j2 --target kvmem_unit_tests
export TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp"
# The long runs measure RSS and heap, which TSan's shadow memory swamps.
# ServerTest runs a whole gRPC server in process: its threads are gRPC's
# (uninstrumented), so TSan sees its epoll and abseil internals as races.
build-tsan/bin/kvmem_unit_tests --gtest_filter="${1:--LongRunTest.*:ServerTest.*}" 2>&1 | tee build-tsan/tsan.log
reports=$(grep -c "^WARNING: ThreadSanitizer" build-tsan/tsan.log || true)
echo "tsan: $reports reports (build-tsan/tsan.log)"
[ "$reports" = 0 ]
