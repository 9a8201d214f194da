#!/usr/bin/env bash
# The kvmem CLI against a real kvmem-server on a unix socket: demo (human and
# JSON), stats and recall (JSON checked with python3), and error exit codes.
# Usage: cli_test.sh <bin-dir>
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. demo with its own local server, human summary.
"$bin/kvmem" demo --cameras=2 --frames=80 --data_dir="$tmp/demo-data" > "$tmp/demo.txt"
grep -q "top-1 block from that place" "$tmp/demo.txt" || fail "demo summary lacks recall quality"
grep -q "expected" "$tmp/demo.txt" || fail "demo summary lacks the fetch check"
for tier in warm cold degraded; do
  grep -qE "^ +$tier +[0-9]+ blocks" "$tmp/demo.txt" || fail "demo summary lacks the $tier tier"
done
cat "$tmp/demo.txt"

# 2. a long-running server; demo --addr, stats and recall against it.
sock="$tmp/kvmem.sock"
"$bin/kvmem-server" --listen= --unix_socket="$sock" --data_dir="$tmp/data" 2> "$tmp/server.log" &
server_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || fail "server socket did not appear"
[ "$(stat -c %a "$sock")" = 600 ] || fail "socket mode is $(stat -c %a "$sock"), want 600"

"$bin/kvmem" demo --addr="unix:$sock" --cameras=1 --frames=120 --json > "$tmp/demo.json"
"$bin/kvmem" stats --addr="unix:$sock" --stream=demo-cam-0 --json > "$tmp/stats.json"
"$bin/kvmem" recall --addr="unix:$sock" --stream=demo-cam-0 --query_seed=3 --top_k=4 --json > "$tmp/recall.json"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
demo = json.load(open(f"{d}/demo.json"))
assert demo["cameras"] == 1 and demo["frames_per_camera"] == 120, demo
assert demo["fetched_bytes"] == demo["fetched_expected_bytes"], demo
# Each stream reports its tiers; the demo's budgets fill all three.
for st in demo["streams"]:
    for tier in ("warm", "cold", "degraded"):
        assert st["tiers"][tier]["blocks"] > 0 and st["tiers"][tier]["bytes"] > 0, (tier, st)
stats = json.load(open(f"{d}/stats.json"))["streams"][0]
assert stats["stream_id"] == "demo-cam-0", stats
assert int(stats["frames"]) == 120 and int(stats["last_durable_frame"]) == 119, stats
assert int(stats["degraded"]["blocks"]) > 0, stats
rec = json.load(open(f"{d}/recall.json"))
assert rec["top_k"] == 4, rec
assert len(rec["blocks"]) >= 1, rec
assert sum(b["token_count"] for b in rec["blocks"]) == rec["total_tokens"] <= rec["budget_tokens"], rec
print("cli json checks passed")
PY

# 3. errors: exit code 1 and the gRPC code on stderr; usage errors exit 2.
set +e
"$bin/kvmem" recall --addr="unix:$sock" --stream=ghost --query=1 2> "$tmp/err.txt"; rc=$?
set -e
[ "$rc" = 1 ] || fail "recall on an unknown stream exited $rc, want 1"
grep -q "NOT_FOUND" "$tmp/err.txt" || fail "stderr lacks NOT_FOUND: $(cat "$tmp/err.txt")"
set +e
"$bin/kvmem" frobnicate > /dev/null 2>&1; rc=$?
set -e
[ "$rc" = 2 ] || fail "unknown subcommand exited $rc, want 2"
echo "cli test passed"
