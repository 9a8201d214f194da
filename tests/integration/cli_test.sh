#!/usr/bin/env bash
# The kvmem CLI against a real kvmem-server on a unix socket: demo (human and
# JSON), stats and recall (JSON checked with python3), eval (in process and
# through the server), roofline (the source article's arithmetic), and error
# exit codes.
# Usage: cli_test.sh <bin-dir>
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
server_pid=""
sim_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null && wait "$sim_pid" 2>/dev/null
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
# Ready once it says so (the socket appears at bind, 0700 by the umask,
# and is made 0600 just before).
for _ in $(seq 100); do grep -q "serving on unix:" "$tmp/server.log" && break; sleep 0.1; done
[ -S "$sock" ] || fail "server socket did not appear"
[ "$(stat -c %a "$sock")" = 600 ] || fail "socket mode is $(stat -c %a "$sock"), want 600"

# health: what the container's HEALTHCHECK runs; exit 0 and SERVING.
"$bin/kvmem" health --addr="unix:$sock" | grep -qx "kvmem.v1.KvMemory: SERVING" || fail "health is not SERVING"
"$bin/kvmem" health --addr="unix:$tmp/no-such.sock" > /dev/null 2>&1 && fail "health of no server exited 0"
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
assert sum(len(b.get("token_offsets", [])) or b["token_count"] for b in rec["blocks"]) == rec["total_tokens"] <= rec["budget_tokens"], rec
print("cli json checks passed")
PY

# 3. eval on a small workload: in process (with report files) and through the
# running server (same kvmem figures), JSON checked with python3.
small=(--cameras=1 --frames=150 --tokens_per_frame=16 --layers=1 --kv_heads=2
       --head_dim=32 --places=4 --objects=6 --object_tokens=2
       --hot_window_tokens=256 --recall_fractions=0.2,0.3)
"$bin/kvmem" eval "${small[@]}" --out="$tmp/eval" --json > "$tmp/eval.json" 2> "$tmp/eval.err"
grep -q "eval: frame 150/150 (100%)" "$tmp/eval.err" || fail "eval showed no progress"
"$bin/kvmem" eval "${small[@]}" --via=grpc --addr="unix:$sock" --json > "$tmp/eval-grpc.json" 2>/dev/null
"$bin/kvmem" eval "${small[@]}" --out="$tmp/eval-human" > "$tmp/eval.txt" 2>/dev/null
grep -q "| kvmem |" "$tmp/eval.txt" || fail "eval table lacks kvmem"
python3 - "$tmp" "$(command -v gnuplot || true)" <<'PY'
import json, os, sys
d, gnuplot = sys.argv[1], sys.argv[2]
ev = json.load(open(f"{d}/eval.json"))
names = ["full", "streaming_llm", "window_lru", "h2o", "mean_key_topk", "kvmem",
         "kvmem_summed", "kvmem_no_lse", "kvmem_per_head", "kvmem_groups",
         "kvmem_attention_only", "kvmem_mean_query", "oracle_tokens",
         "exact_keys_per_head"]
keys = ["mass_recalled", "cold_mass_recalled", "output_cosine", "reid_success",
        "useless_hit_rate", "resident_bytes_peak", "stored_bytes_peak", "recall_p99_us"]
assert sorted(ev["policies"]) == sorted(names), ev["policies"].keys()
for n in names:
    for k in keys:
        assert k in ev["policies"][n], (n, k)
full = ev["policies"]["full"]
assert abs(full["mass_recalled"] - 1) < 1e-4 and abs(full["output_cosine"] - 1) < 1e-4, full
assert ev["recall_fraction"] == 0.3 and len(ev["sweep"]) == 2, ev["sweep"]
assert ev["kvmem_path"] == "in-process", ev["kvmem_path"]
want = ["summary.csv", "queries.csv", "memory.csv", "latency.csv", "sweep.csv", "report.md"]
if gnuplot:
    want += ["memory_vs_time.png", "mass_vs_budget.png", "latency_vs_time.png"]
for f in want:
    p = os.path.join(d, "eval", f)
    assert os.path.getsize(p) > 0, p
    assert p in ev["files"], (p, ev["files"])
report = open(f"{d}/eval/report.md").read()
assert "| kvmem |" in report and "## Targets" in report, report[:400]
g = json.load(open(f"{d}/eval-grpc.json"))
assert g["kvmem_path"].startswith("unix:"), g["kvmem_path"]
for k in ("cold_mass_recalled", "reid_success", "mass_recalled"):
    assert g["policies"]["kvmem"][k] == ev["policies"]["kvmem"][k], (k, g["policies"]["kvmem"], ev["policies"]["kvmem"])
print("cli eval checks passed")
PY

# 4. roofline: the source article's 7B arithmetic, with the issue's dashed
# flag spellings, and a device profile's verdict.
"$bin/kvmem" roofline --layers 32 --kv-heads 8 --head-dim 128 --dtype fp16 \
  --fps 3 --tokens-per-frame 128 --context 10000 --json > "$tmp/roof.json"
"$bin/kvmem" roofline --profile="$(dirname "$0")/../../deploy/profiles/orin-agx-64gb.toml" \
  --json > "$tmp/roof-orin.json"
"$bin/kvmem" roofline --profile="$(dirname "$0")/../../deploy/profiles/orin-agx-64gb.toml" \
  > "$tmp/roof.txt"
grep -q "memory-bound" "$tmp/roof.txt" || fail "roofline summary lacks the verdict"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
r = json.load(open(f"{d}/roof.json"))
assert r["kv_bytes_per_token"] == 131072, r
assert r["kv_growth_bytes_per_s"] == 50331648, r
assert r["full"]["bytes_per_step"] == 1310720000, r
assert r["full"]["verdict"] == "unknown", r  # No device given.
o = json.load(open(f"{d}/roof-orin.json"))
assert o["device"] == "Jetson AGX Orin 64GB", o
assert o["full"]["verdict"] == "memory-bound" and o["kvmem"]["verdict"] == "memory-bound", o
assert abs(o["ridge_flops_per_byte"] - 42.5e12 / 204.8e9) < 1e-3, o
assert o["kvmem"]["bytes_per_step"] < o["full"]["bytes_per_step"], o
print("cli roofline checks passed")
PY

# 5. the sim accelerator backend: a server with a hardware profile answers
# recalls with their modelled cost.
sim_sock="$tmp/sim.sock"
"$bin/kvmem-server" --listen= --unix_socket="$sim_sock" --data_dir="$tmp/sim-data" \
  --accelerator_profile="$(dirname "$0")/../../deploy/profiles/rk3588-npu.toml" > "$tmp/sim.log" 2>&1 &
sim_pid=$!
for _ in $(seq 100); do [ -S "$sim_sock" ] && break; sleep 0.1; done
"$bin/kvmem" demo --addr="unix:$sim_sock" --cameras=1 --frames=40 > /dev/null
"$bin/kvmem" recall --addr="unix:$sim_sock" --stream=demo-cam-0 --query_seed=2 --json > "$tmp/sim-recall.json"
"$bin/kvmem" stats --addr="unix:$sim_sock" --stream=demo-cam-0 --json > "$tmp/sim-stats.json"
"$bin/kvmem" stats --addr="unix:$sim_sock" --stream=demo-cam-0 > "$tmp/sim-stats.txt"
grep -q "accelerator     sim: " "$tmp/sim-stats.txt" || fail "stats do not show the sim accelerator"
kill "$sim_pid"; wait "$sim_pid" || fail "sim server did not exit cleanly"
sim_pid=""
grep -q "accelerator backend: sim: Rockchip RK3588 NPU" "$tmp/sim.log" || fail "sim backend not announced"
python3 - "$tmp" <<'PY'
import json, sys
r = json.load(open(f"{sys.argv[1]}/sim-recall.json"))
t = r["timing"]
assert r["blocks"] and t["modelled_us"] > 0 and int(t["modelled_dram_bytes"]) > 0, r
assert t["injections"] >= 1 and t["modelled_queue_us"] >= 0, t
a = json.load(open(f"{sys.argv[1]}/sim-stats.json"))["streams"][0]["accelerator"]
assert a["backend"] == "sim" and int(a["searches"]) > 0 and int(a["injections"]) > 0, a
assert a["modelled_us"] > 0 and int(a["modelled_dram_bytes"]) > 0, a
# RK3588 profile: 2 MiB of SRAM, split between hot window and staging.
assert int(a["sram_bytes"]) == 2048 * 1024, a
assert int(a["sram_hot_bytes"]) + int(a["sram_staging_bytes"]) == int(a["sram_bytes"]), a
assert a["recall_floor"] == 0.95 and a["warning"] == "", a
print("cli sim checks passed")
PY

# 6. kvmem bench: a small run against a server it starts reports every
# figure and its references; the in-process kernel is exact.
# Its streams keep blocks out of RAM at int4 (a 1 MiB warm budget each).
"$bin/kvmem" bench --streams=2 --frames=16 --recalls=20 --index_vectors=2000 \
  --index_queries=50 --live_fps=20 --live_seconds=0.5 --scratch_dir="$tmp/bench" \
  --warm_budget_mib=1 --cold_precision=int4 \
  --json > "$tmp/bench.json" 2> "$tmp/bench.err" || fail "bench failed: $(cat "$tmp/bench.err")"
[ ! -e "$tmp/bench/server" ] || fail "bench left its server's data behind"
python3 - "$tmp" <<'PY'
import json, math, sys
b = json.load(open(f"{sys.argv[1]}/bench.json"))
for k in ["ingest_mb_per_s", "raw_stream_mb_per_s", "storage_put_mb_per_s",
          "recall_p50_us", "recall_p99_us", "empty_rpc_p99_us",
          "inproc_recall_p99_us", "flat_faiss_p99_us", "live_recall_p99_us",
          "loaded_ingest_mb_per_s", "loaded_recall_p99_us",
          "loaded_recall_engine_p99_us", "loaded_empty_rpc_p99_us",
          "loaded_recall_p99_vs_empty_rpc_p99"]:
    assert b[k] > 0, (k, b)
# The loaded phase ran: each caller made at least its one recall and empty
# RPC (in so small a run the appends may be over before some of them).
assert b["loaded_recallers"] == 4 and b["loaded_recalls"] >= 4, b
assert b["inproc_recall_at_16"] == 1.0, b
assert b["streams"] == 2 and b["frame_bytes"] == 262144, b
assert b["live_frames_per_s"] > 0 and b["server_rss_mib"] > 0, b
# CPU per GB of the ingest and of the two references, and what those two
# alone take at 0.8x the puts' rate: their own figures' product.
assert b["cpus"] >= 1 and b["ingest_cpu_s_per_gb"] > 0, b
assert b["storage_cpu_s_per_gb"] > 0 and b["transport_cpu_s_per_gb"] > 0, b
cores = 0.8 * b["storage_put_mb_per_s"] / 1e3 * (
    b["storage_cpu_s_per_gb"] + b["transport_cpu_s_per_gb"])
assert math.isclose(b["cores_for_0_8x_storage_at_references_cpu"], cores,
                    rel_tol=0.01, abs_tol=0.002), b
# Blocks left RAM, stored at about a quarter of their appended bytes: less
# than 0.3 of all 32 frames. (RAM holds at most 8 of a stream's 16: 1 MiB
# of warm blocks and the open block, so at full precision the blocks out of
# RAM alone would be over half.)
assert b["cold_precision"] == "int4" and b["cold_tier_blocks"] > 0, b
assert 0 < b["cold_tier_bytes"] < 0.3 * 32 * 262144, b
print("cli bench checks passed")
PY
# kvmem bench --fetch: every tier, path and reference measured over the same
# set (each call's bytes counted; shared-memory bytes compared with gRPC's),
# in JSON and as text.
"$bin/kvmem" bench --fetch --fetch_calls=2 --scratch_dir="$tmp/fetch" --json \
  > "$tmp/fetch.json" 2> "$tmp/fetch.err" || fail "bench --fetch failed: $(cat "$tmp/fetch.err")"
python3 - "$tmp" <<'PY'
import json, sys
f = json.load(open(f"{sys.argv[1]}/fetch.json"))
for p in ["fetch_", "fetch_demo_"]:
    for k in ["memcpy", "unix_socket", "trivial_grpc", "trivial_grpc_strings", "store_get",
              "store_get_rocksdb_crc", "warm_grpc", "warm_grpc_frame_major", "warm_shm",
              "warm_shm_frame_major", "cold", "cold_grpc_frame_major", "cold_shm",
              "cold_shm_frame_major", "degraded", "degraded_grpc_frame_major",
              "degraded_shm", "degraded_shm_frame_major"]:
        assert f[f"{p}{k}_mb_per_s"] > 0, (p, k, f)
assert f["fetch_set_mib"] == 64.0 and f["fetch_demo_set_mib"] == 16.0, f
assert f["crc32c_kernel"] in ("sse4.2", "scalar"), f
for k in ["recall_fetch_7b_p50_ms", "recall_fetch_7b_p99_ms", "recall_fetch_7b_grpc_p50_ms",
          "recall_only_7b_p50_ms", "recall_fetch_7b_mib", "full_recall_mean_mib"]:
    assert f[k] > 0, (k, f)
# Deltas move less than whole sets.
assert f["delta_recall_mean_mib"] < f["full_recall_mean_mib"], f
print("cli bench --fetch checks passed")
PY
# kvmem bench --cameras: a small geometry, paced Sessions with shared-memory
# delivery, steps until one falls behind or the most cameras asked for.
"$bin/kvmem" bench --cameras=2 --camera_seconds=3 --layers=4 --kv_heads=2 \
  --head_dim=64 --hot_window_tokens=512 --scratch_dir="$tmp/cameras" --json \
  > "$tmp/cameras.json" 2> "$tmp/cameras.err" || fail "bench --cameras failed: $(cat "$tmp/cameras.err")"
python3 - "$tmp" <<'PY'
import json, sys
c = json.load(open(f"{sys.argv[1]}/cameras.json"))
assert c["frame_bytes"] == 4 * 2 * 2 * 64 * 2 * 128, c
assert c["storage_put_mb_per_s"] > 0 and c["storage_bound_cameras"] > 0, c
steps = c["steps"]
assert 1 <= len(steps) <= 2 and steps[0]["cameras"] == 1, c
for s in steps:
    assert s["frames"] > 0 and s["append_p50_ms"] > 0, s
    assert s["kept_up"] or s["why"], s
    # History before the step: at least a block's worth (4 frames), at
    # most the default bound.
    assert 4 <= s["history_frames"] <= 256 and s["history_s"] > 0, s
# 3 s at 3 fps: recalls past the 512-token window deliver tokens.
assert steps[0]["delivered_mib_per_recall"] > 0, steps[0]
assert c["cameras_kept_up"] == sum(1 for s in steps if s["kept_up"]), c
print("cli bench --cameras checks passed")
PY
"$bin/kvmem" bench --fetch --fetch_calls=1 --scratch_dir="$tmp/fetch" > "$tmp/fetch.txt" 2>/dev/null ||
  fail "bench --fetch (text) failed"
grep -q "recall + fetch, 7B" "$tmp/fetch.txt" || fail "bench --fetch summary: $(cat "$tmp/fetch.txt")"

# 7. errors: exit code 1 and the gRPC code on stderr; usage errors exit 2.
set +e
"$bin/kvmem" recall --addr="unix:$sock" --stream=ghost --query=1 2> "$tmp/err.txt"; rc=$?
set -e
[ "$rc" = 1 ] || fail "recall on an unknown stream exited $rc, want 1"
grep -q "NOT_FOUND" "$tmp/err.txt" || fail "stderr lacks NOT_FOUND: $(cat "$tmp/err.txt")"
grep -q "hint: .kvmem stats. lists the streams" "$tmp/err.txt" || fail "NOT_FOUND without a hint"
set +e
"$bin/kvmem" frobnicate > /dev/null 2>&1; rc=$?
set -e
[ "$rc" = 2 ] || fail "unknown subcommand exited $rc, want 2"
set +e
"$bin/kvmem" eval --frames=1 > /dev/null 2> "$tmp/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] || fail "eval --frames=1 exited $rc, want 2"
grep -q "frames must be at least 2" "$tmp/err.txt" || fail "eval usage error unclear: $(cat "$tmp/err.txt")"
set +e
"$bin/kvmem" roofline --dtype=int3 > /dev/null 2> "$tmp/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] || fail "roofline --dtype=int3 exited $rc, want 2"
grep -q 'dtype is "int3"' "$tmp/err.txt" || fail "roofline usage error unclear: $(cat "$tmp/err.txt")"
set +e
"$bin/kvmem" bench --cameras=0 > /dev/null 2> "$tmp/err.txt"; rc=$?
[ "$rc" = 2 ] || fail "bench --cameras=0 exited $rc, want 2"
grep -q -- "--cameras must be 1..256" "$tmp/err.txt" || fail "bench --cameras usage error unclear: $(cat "$tmp/err.txt")"
"$bin/kvmem" bench --streams=0 > /dev/null 2> "$tmp/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] || fail "bench --streams=0 exited $rc, want 2"
grep -q "1..1024 --streams" "$tmp/err.txt" || fail "bench usage error unclear: $(cat "$tmp/err.txt")"
set +e
"$bin/kvmem" bench --cold_precision=int2 > /dev/null 2> "$tmp/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] || fail "bench --cold_precision=int2 exited $rc, want 2"
grep -q 'cold_precision is "int2"' "$tmp/err.txt" || fail "bench --cold_precision error unclear: $(cat "$tmp/err.txt")"
set +e
"$bin/kvmem" demo --camers=2 > /dev/null 2> "$tmp/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] || fail "unknown flag exited $rc, want 2"
grep -q "unknown flag --camers (did you mean --cameras?)" "$tmp/err.txt" || fail "unknown flag message: $(cat "$tmp/err.txt")"
# A flag's value as the next argument may start with '-' (a negative seed
# asks for an explicit query): not mistaken for a flag.
set +e
"$bin/kvmem" recall --addr="unix:$sock" --stream ghost --query_seed -1 --query 1 2> "$tmp/err.txt"; rc=$?
set -e
[ "$rc" = 1 ] || fail "recall with separate values exited $rc, want 1: $(cat "$tmp/err.txt")"
grep -q "NOT_FOUND" "$tmp/err.txt" || fail "recall with separate values: $(cat "$tmp/err.txt")"
set +e
"$bin/kvmem" stats --addr=unix:$tmp/nobody.sock > /dev/null 2> "$tmp/err.txt"; rc=$?
set -e
[ "$rc" = 1 ] || fail "stats against no server exited $rc, want 1"
grep -q "UNAVAILABLE" "$tmp/err.txt" && grep -q "hint: is kvmem-server running" "$tmp/err.txt" || fail "no server: $(cat "$tmp/err.txt")"

# 8. help: each subcommand lists its own flags (and the workload flags it
# shares), not the others'; every client flag is some subcommand's.
for sub in demo recall stats eval roofline bench; do
  "$bin/kvmem" "$sub" --help > "$tmp/help-$sub.txt" || fail "kvmem $sub --help failed"
  head -1 "$tmp/help-$sub.txt" | grep -q "^kvmem $sub " || fail "kvmem $sub --help: $(head -1 "$tmp/help-$sub.txt")"
  grep -q -- "--addr " "$tmp/help-$sub.txt" || fail "kvmem $sub --help lacks the common flags"
done
"$bin/kvmem" help bench | cmp -s - "$tmp/help-bench.txt" || fail "kvmem help bench differs from kvmem bench --help"
grep -q -- "--cameras " "$tmp/help-demo.txt" || fail "demo --help lacks --cameras"
grep -q -- "--live_fps " "$tmp/help-demo.txt" && fail "demo --help lists bench's --live_fps"
grep -q -- "--layers " "$tmp/help-bench.txt" || fail "bench --help lacks the shared --layers"
grep -q -- "--query_seed " "$tmp/help-recall.txt" || fail "recall --help lacks --query_seed"
{ "$bin/kvmem" --helpfull || true; } | awk '/Flags from/ {mine = /tools\/cli\//} mine' | grep -o -- '^    --[a-z0-9_]*' | sed 's/^ *//' | sort -u > "$tmp/all-flags.txt"
[ "$(wc -l < "$tmp/all-flags.txt")" -gt 40 ] || fail "helpfull lists $(wc -l < "$tmp/all-flags.txt") flags"
cat "$tmp"/help-*.txt | grep -o -- '^  --[a-z0-9_]*' | sed 's/^ *//' | sort -u > "$tmp/sub-flags.txt"
missing=$(comm -23 "$tmp/all-flags.txt" "$tmp/sub-flags.txt")
[ -z "$missing" ] || fail "flags in no subcommand's --help: $missing"
"$bin/kvmem" --help | grep -q "Exit codes: 0 success" || fail "kvmem --help lacks the exit codes"
echo "cli test passed"
