#!/usr/bin/env bash
# tools/check_layers.py catches what it must: each forbidden edge, planted in
# a copy of the tree, makes it exit 1 naming the file; the real tree passes.
# And tools/check_sizes.py catches a long function and a long file.
# Usage: check_layers_selftest.sh <source-dir>
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 "$src/tools/check_layers.py" "$src" || fail "the tree itself has forbidden includes"

plant() {  # plant <file> <include line> <what the report must say>
  rm -rf "$tmp/tree"
  mkdir -p "$tmp/tree"
  for d in base storage engine server client tools; do cp -r "$src/$d" "$tmp/tree/"; done
  mkdir -p "$(dirname "$tmp/tree/$1")"
  printf '%s\n' "$2" >> "$tmp/tree/$1"
  if python3 "$src/tools/check_layers.py" "$tmp/tree" > "$tmp/out.txt"; then
    fail "not caught: $1 with $2"
  fi
  grep -q "$3" "$tmp/out.txt" || fail "report for $1 lacks '$3': $(cat "$tmp/out.txt")"
  echo "caught: $1: $2"
}
plant client/cpp/kvmem_client.cc '#include "engine/types.h"' "client/cpp/kvmem_client.cc"
plant engine/stream/stream.cc '#include <grpcpp/grpcpp.h>' "engine/ must not include grpcpp/"
plant engine/memory_engine.cc '#include "server/server.h"' "engine/ may include only"
plant engine/recall/recall_planner.cc '#include "kvmem/v1/types.pb.h"' "engine/recall/recall_planner.cc"
plant server/service/reactors.cc '#include "engine/stream/stream.h"' "server/ may include only"
plant storage/mem_cold_store.cc '#include "engine/types.h"' "storage/ may include only"
plant base/executor.cc '#include "engine/types.h"' "base/ may include only"
plant engine/stream/stream.cc '#include <faiss/IndexFlat.h>' "faiss only in"
plant server/server.cc '#include "rocksdb/db.h"' "rocksdb only in"
# The engine's folders are ordered: an include upward (here index/ -> recall/,
# while recall/ includes index/) is refused and the cycle it closes named.
plant engine/index/block_index.cc '#include "engine/recall/mass_estimate.h"' "engine/index/ may not include engine/recall/"
plant engine/index/block_index.cc '#include "engine/recall/mass_estimate.h"' "include cycle between engine folders: index -> recall -> index"
plant engine/codec/dtype.cc '#include "engine/view/recall_view.h"' "engine/codec/ may not include engine/view/"
plant engine/types.h '#include "engine/index/block_index.h"' "engine's value types may include only"

# tools/check_sizes.py: a function of 90 lines and a file of 520 are caught.
python3 "$src/tools/check_sizes.py" "$src" > /dev/null || fail "the tree itself is over the size limits"
rm -rf "$tmp/sizes" && mkdir -p "$tmp/sizes/engine"
{
  echo "namespace kvmem {"
  echo "int Long(int x) {"
  for i in $(seq 88); do echo "  x += $i;"; done
  echo "  return x;"
  echo "}"
  echo "}  // namespace kvmem"
} > "$tmp/sizes/engine/long.cc"
if python3 "$src/tools/check_sizes.py" "$tmp/sizes" > "$tmp/out.txt"; then fail "a 91-line function not caught"; fi
grep -q "engine/long.cc:2: function of 91 lines" "$tmp/out.txt" || fail "size report: $(cat "$tmp/out.txt")"
echo "caught: $(head -1 "$tmp/out.txt")"
{ for i in $(seq 520); do echo "// line $i"; done; } > "$tmp/sizes/engine/big.h"
python3 "$src/tools/check_sizes.py" "$tmp/sizes" > "$tmp/out.txt" || true
grep -q "engine/big.h: 520 lines" "$tmp/out.txt" || fail "a 520-line file not caught: $(cat "$tmp/out.txt")"
echo "caught: $(grep big.h "$tmp/out.txt")"
echo "PASS"
