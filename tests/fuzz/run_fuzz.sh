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
"$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 \
  "$work/corpus" "$work/seeds" "$regressions" 2>&1 | tail -n 30
