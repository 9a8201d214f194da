#!/usr/bin/env bash
# Fuzzes one target for a bounded time (ctest label fuzz, KVMEM_FUZZ builds):
#   run_fuzz.sh FUZZER REPLAY SECONDS REGRESSIONS_DIR WORK_DIR
# Starts from the target's seeds (REPLAY --write_seeds) and its regression
# inputs; a crash leaves its input in WORK_DIR/artifacts (copy it into
# REGRESSIONS_DIR with the fix) and fails the test.
set -euo pipefail
fuzzer=$1 replay=$2 seconds=$3 regressions=$4 work=$5
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
"$replay" --write_seeds "$work/seeds"
# No allocation stacks: Debian's libraries are built without frame pointers,
# so ASan's fast unwinder records stacks that end in stack garbage, each one
# new to its stack depot, which then grows by ~20 KB per input (and slows
# every malloc) until the RSS limit stops the run. A report still names the
# faulting access; replay the saved input with REPLAY (default options) for
# the allocation's stack.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}malloc_context_size=0"
"$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 \
  "$work/corpus" "$work/seeds" "$regressions" 2>&1 | tail -n 30
