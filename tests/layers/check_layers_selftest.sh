#!/usr/bin/env bash
# tools/check_layers.py catches what it must: each forbidden edge, planted in
# a copy of the tree, makes it exit 1 naming the file; the real tree passes.
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
echo "PASS"
