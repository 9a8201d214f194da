#!/usr/bin/env bash
# The shared durable tier's figures in one run (docs/durable-tier.md):
# on a loopback test cluster (tests/distributed/ceph_cluster.sh), `rados
# bench` write and sequential read with 4 MiB objects, then kvmem's ingest
# of 7B frames into RADOS and its cold fetch from RADOS (kvmem bench with
# --server_store=rados:kvmem; and the cold fetch again through a local read
# cache, --store_cache), then the takeover of a stream holding one
# camera-hour (the bench's default geometry, 10,800 frames): a new
# kvmem-server on the same pool, timed from its start to its first answered
# Recall. KVMEM_TAKEOVER_FRAMES changes the length. Then, where etcd is
# installed, the same stream under ownership through etcd: two servers
# with --etcd (lease TTL KVMEM_OWNERSHIP_TTL_S, default 10; owner probe
# KVMEM_OWNERSHIP_PROBE_MS, default 250), the first takes the stream up, is
# killed -9, and the second is timed from the kill to its first answered
# Recall (the probe finds the dead owner's address refusing and its lease is
# revoked, or with the probe at 0 the lease expires; then the stream is
# taken up).
#
#   bash tools/bench/rados_figures.sh [WORK_DIR]   (default /tmp/kvmem-rados-figures)
#   KVMEM_TAKEOVER_ONLY=1 ...: only the takeover.
#   KVMEM_THROUGHPUT_ONLY=1 ...: only rados bench, ingest and cold fetch.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${KVMEM_BIN:-$root/build/bin}
dir=$(realpath -m "${1:-/tmp/kvmem-rados-figures}")
frames=${KVMEM_TAKEOVER_FRAMES:-10800}
cluster="$root/tests/distributed/ceph_cluster.sh"

bash "$cluster" start "$dir/ceph" >/dev/null
cleanup() {
  for p in ${pid:-} ${pids:-}; do kill -9 "$p" 2>/dev/null || true; done
  bash "$cluster" stop "$dir/ceph"
}
trap cleanup EXIT
export CEPH_CONF="$dir/ceph/ceph.conf"
purge() { rados purge kvmem --yes-i-really-really-mean-it >/dev/null 2>&1; }

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; kernel $(uname -r)"
echo "cluster: 1 mon, 1 mgr, 3 BlueStore OSDs on sparse files in $dir/ceph, pool size 3"
if [ -z "${KVMEM_TAKEOVER_ONLY:-}" ]; then
w=$(rados bench -p kvmem 15 write -b 4194304 --no-cleanup 2>&1 | awk '/^Bandwidth \(MB\/sec\)/ {print $3}')
r=$(rados bench -p kvmem 15 seq 2>&1 | awk '/^Bandwidth \(MB\/sec\)/ {print $3}')
purge
echo "rados bench (4 MiB objects, 16 in flight): write $w MB/s, seq read $r MB/s"

# Ingest and cold fetch with each durable form of a block leaving RAM: its
# frames as appended (--cold_form=frames, the default on RADOS) and its KV
# rewritten per layer (--cold_form=layers), one after the other.
for form in frames layers; do
ingest=$("$bin/kvmem" bench --server_store=rados:kvmem --server_ceph_conf="$CEPH_CONF" \
  --server_flags=--cold_form=$form \
  --streams=4 --frames=30 --layers=32 --kv_heads=8 --head_dim=128 --tokens_per_frame=128 \
  --recalls=20 --loaded_recallers=0 --index_vectors=16 --index_queries=1 2>/dev/null | awk '/^  ingest / {print $2}')
purge
echo "kvmem ingest into RADOS, cold blocks as $form (4 streams of 7B frames, 16 MiB each): $ingest MB/s" \
  "= $(python3 -c "print(f'{$ingest/$w:.2f}')")x rados bench write"

cold=$("$bin/kvmem" bench --fetch --server_store=rados:kvmem --server_ceph_conf="$CEPH_CONF" \
  --server_flags=--cold_form=$form \
  2>/dev/null | awk '/^  7b/ {seven=1} seven && /^        cold / {print $2, $4; exit}')
purge
set -- $cold
echo "kvmem cold fetch from RADOS, cold blocks as $form (7B, 8 blocks = 64 MiB): gRPC $1 MB/s," \
  "shared memory $2 MB/s = $(python3 -c "print(f'{$2/$r:.2f}')")x rados bench seq read"
done

# The same cold fetch (frames) through a local read cache (--store_cache):
# the first of the timed fetches reads RADOS, the others the cache.
cold=$("$bin/kvmem" bench --fetch --server_store=rados:kvmem --server_ceph_conf="$CEPH_CONF" \
  --server_flags=--cold_form=frames,--store_cache="$dir/cache" \
  2>/dev/null | awk '/^  7b/ {seven=1} seven && /^        cold / {print $2, $4; exit}')
purge
set -- $cold
echo "kvmem cold fetch through the local read cache (--store_cache; frames): gRPC $1 MB/s," \
  "shared memory $2 MB/s = $(python3 -c "print(f'{$2/$r:.2f}')")x rados bench seq read"
[ -n "${KVMEM_THROUGHPUT_ONLY:-}" ] && exit 0

fi

# Takeover: a camera-hour ingested by one server, then a new one on the
# pool (its own empty data directory) until it answers a Recall.
sock="$dir/a.sock"
rm -rf "$dir/a" "$dir/b"
"$bin/kvmem-server" --store=rados:kvmem --ceph_conf="$CEPH_CONF" --data_dir="$dir/a" \
  --unix_socket="$sock" --listen= >"$dir/a.log" 2>&1 &
pid=$!
until "$bin/kvmem" health --addr="unix:$sock" >/dev/null 2>&1; do sleep 0.2; done
t0=$(date +%s)
"$bin/kvmem" bench --addr="unix:$sock" --keep_streams --streams=1 --frames="$frames" \
  --recalls=20 --loaded_recallers=0 --index_vectors=16 --index_queries=1 --scratch_dir="$dir/bench" >/dev/null 2>&1
echo "ingested one camera-hour ($frames frames, the bench's geometry) in $(( $(date +%s) - t0 )) s"
"$bin/kvmem" stats --addr="unix:$sock" --stream=bench-cam-0 2>/dev/null | sed -n '4,5p;8,11p'
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
sock="$dir/b.sock"
start=$(date +%s.%N)
"$bin/kvmem-server" --store=rados:kvmem --ceph_conf="$CEPH_CONF" --data_dir="$dir/b" \
  --unix_socket="$sock" --listen= >"$dir/b.log" 2>&1 &
pid=$!
answered() {  # waits until ADDR answers a Recall on the stream
  until "$bin/kvmem" recall --addr="$1" --stream=bench-cam-0 --query_seed=1 \
      >/dev/null 2>&1; do
    sleep 0.05
  done
}
answered "unix:$sock"
end=$(date +%s.%N)
echo "takeover after kill -9: first Recall answered $(python3 -c "print(f'{$end-$start:.2f}')") s after the new server started"
grep -m1 "opened rados" "$dir/b.log" | sed 's/^.*\] //'
kill "$pid"
wait "$pid" 2>/dev/null || true
pid=

command -v etcd >/dev/null || { echo "etcd not installed: no takeover figure with ownership"; exit 0; }
ttl=${KVMEM_OWNERSHIP_TTL_S:-10}
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ep=127.0.0.1:$(port)
rm -rf "$dir/etcd"
peer=http://127.0.0.1:$(port)
etcd --name=bench --data-dir="$dir/etcd" --listen-client-urls="http://$ep" \
  --advertise-client-urls="http://$ep" --listen-peer-urls="$peer" \
  --initial-advertise-peer-urls="$peer" --initial-cluster="bench=$peer" >"$dir/etcd.log" 2>&1 &
pids=$!
server() {  # server NAME PORT
  "$bin/kvmem-server" --store=rados:kvmem --ceph_conf="$CEPH_CONF" --data_dir="$dir/$1" \
    --listen="127.0.0.1:$2" --etcd="$ep" --ownership_ttl_s="$ttl" \
    --ownership_probe_ms="${KVMEM_OWNERSHIP_PROBE_MS:-250}" >"$dir/$1.log" 2>&1 &
  pids="$pids $!"
}
pa=$(port); pb=$(port)
server c "$pa"; a=$!
server d "$pb"
until "$bin/kvmem" health --addr="127.0.0.1:$pa" >/dev/null 2>&1 &&
      "$bin/kvmem" health --addr="127.0.0.1:$pb" >/dev/null 2>&1; do sleep 0.2; done
start=$(date +%s.%N)
"$bin/kvmem" recall --addr="127.0.0.1:$pa" --stream=bench-cam-0 --query_seed=1 >/dev/null
end=$(date +%s.%N)
echo "with etcd (TTL $ttl s): a server took the stream up on its first Recall in $(python3 -c "print(f'{$end-$start:.2f}')") s"
kill -9 "$a"
start=$(date +%s.%N)
answered "127.0.0.1:$pb"
end=$(date +%s.%N)
echo "with etcd (TTL $ttl s, probe ${KVMEM_OWNERSHIP_PROBE_MS:-250} ms): owner killed -9, the other server answered Recall $(python3 -c "print(f'{$end-$start:.2f}')") s after the kill"
