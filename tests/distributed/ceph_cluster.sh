#!/usr/bin/env bash
# A throw-away single-host Ceph cluster for tests: 1 mon, 1 mgr and 3
# BlueStore OSDs on sparse files, every file (data, logs, sockets, crash
# dumps, pid files) under DIR, the mon on a loopback port. Replicated pools
# default to size 3 / min_size 2 as a real deployment would.
#
#   ceph_cluster.sh start DIR   # prints DIR/ceph.conf's path when all PGs of
#                               # the pool "kvmem" are active+clean
#   ceph_cluster.sh stop DIR    # OSDs first, then mgr and mon
#   ceph_cluster.sh kill-osd DIR N / start-osd DIR N
#
# Exit code 77 when Ceph's daemons are not installed (deploy/bootstrap.sh
# installs them), so callers can skip with that reason.
#
# Settings a one-host cluster needs (each met as a failure otherwise):
# - osd crush chooseleaf type = 0: replicas over OSDs, not hosts.
# - mon osd reporter subtree level = osd, min down reporters = 1: a killed
#   OSD is marked down by its peers on the same host.
# - osd pool default read lease ratio = 0.2: writes stall ~1.6 s, not ~10 s,
#   after an OSD dies.
# - 10 GiB sparse block files: small files fill before the full-ratio guard
#   reacts and every OSD aborts with ENOSPC.
# - bluestore cache autotune off with a fixed cache: osd memory target below
#   896 MiB is ignored.
# - mon data avail thresholds lowered: the mon stops on a nearly full host.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop|kill-osd|start-osd DIR [N]" >&2
  exit 2
fi
dir=$(realpath -m "$dir")
conf="$dir/ceph.conf"
osds=${KVMEM_CEPH_OSDS:-3}

need() {
  for b in ceph-mon ceph-osd ceph-mgr ceph; do
    if ! command -v "$b" >/dev/null 2>&1; then
      echo "ceph_cluster: $b not installed (run deploy/bootstrap.sh)" >&2
      exit 77
    fi
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

cephc() { timeout 30 ceph --conf "$conf" --connect-timeout 10 "$@"; }

start_osd() {
  local n=$1
  ceph-osd --conf "$conf" -i "$n" >>"$dir/log/osd.$n.out" 2>&1
}

wait_clean() {
  local deadline=$((SECONDS + ${1:-90}))
  while [ $SECONDS -lt $deadline ]; do
    local s
    s=$(cephc pg stat 2>/dev/null || true)
    # "N pgs: N active+clean; ..." with nothing else.
    if [[ "$s" =~ ^([0-9]+)\ pgs:\ ([0-9]+)\ active\+clean\; ]] &&
       [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] && [ "${BASH_REMATCH[1]}" != 0 ]; then
      return 0
    fi
    sleep 0.5
  done
  echo "ceph_cluster: PGs not active+clean: $(cephc pg stat 2>&1 || true)" >&2
  return 1
}

case "$cmd" in
start)
  need
  if [ -e "$dir/run/mon.pid" ]; then
    echo "ceph_cluster: $dir holds a running cluster; stop it first" >&2
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir"/{mon,log,run,crash,mgr}
  port=$(free_port)
  cat >"$conf" <<EOF
[global]
fsid = $(uuidgen)
mon host = v2:127.0.0.1:$port
public addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
run dir = $dir/run
crash dir = $dir/crash
admin socket = $dir/run/\$cluster-\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
mon cluster log file = $dir/log/cluster.log
log to stderr = false
err to stderr = true
osd crush chooseleaf type = 0
osd pool default size = 3
osd pool default min size = 2
osd pool default pg autoscale mode = off
osd pool default read lease ratio = 0.2
mon osd reporter subtree level = osd
mon osd min down reporters = 1
mon allow pool delete = true
mon data avail warn = 1
mon data avail crit = 0
mon warn on pool no redundancy = false
mon max pg per osd = 1000
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 10737418240
bluestore cache autotune = false
bluestore cache size = 134217728
osd memory target = 939524096
osd op num threads per shard = 1
osd op num shards = 2
rados osd op timeout = 30
rados mon op timeout = 30
client mount timeout = 30
[client]
admin socket =
log file = $dir/log/client.log
[mon]
mon data = $dir/mon
[mon.a]
public addr = v2:127.0.0.1:$port
[mgr]
mgr data = $dir/mgr
mgr disabled modules = dashboard prometheus restful
[osd]
osd data = $dir/osd\$id
EOF
  monmaptool --create --fsid "$(awk '/^fsid/ {print $3}' "$conf")" \
    --addv a "[v2:127.0.0.1:$port]" "$dir/monmap" >"$dir/log/mkfs.out" 2>&1
  ceph-mon --conf "$conf" -i a --mkfs --monmap "$dir/monmap" --keyring /dev/null \
    >>"$dir/log/mkfs.out" 2>&1
  touch "$dir/mon/keyring"
  ceph-mon --conf "$conf" -i a >>"$dir/log/mon.out" 2>&1
  ceph-mgr --conf "$conf" -i x >>"$dir/log/mgr.out" 2>&1
  for n in $(seq 0 $((osds - 1))); do
    id=$(cephc osd create)
    mkdir -p "$dir/osd$id"
    cephc osd crush add "osd.$id" 1 root=default host=localhost >/dev/null 2>&1
    ceph-osd --conf "$conf" -i "$id" --mkfs >>"$dir/log/mkfs.out" 2>&1 &
  done
  wait
  for n in $(seq 0 $((osds - 1))); do start_osd "$n"; done
  cephc osd pool create kvmem 32 32 >/dev/null 2>&1
  cephc osd pool application enable kvmem kvmem >/dev/null 2>&1
  wait_clean 120
  echo "$conf"
  ;;
stop)
  for f in "$dir"/run/osd.*.pid; do
    [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  for f in "$dir"/run/osd.*.pid; do
    [ -e "$f" ] || continue
    p=$(cat "$f")
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    rm -f "$f"
  done
  for d in mgr.x mon.a; do
    f="$dir/run/$d.pid"
    [ -e "$f" ] || continue
    p=$(cat "$f")
    kill "$p" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    rm -f "$f"
  done
  ;;
kill-osd)
  n=${3:?osd number}
  kill -9 "$(cat "$dir/run/osd.$n.pid")"
  rm -f "$dir/run/osd.$n.pid"
  ;;
start-osd)
  n=${3:?osd number}
  start_osd "$n"
  ;;
wait-clean)
  wait_clean "${3:-90}"
  ;;
*)
  echo "ceph_cluster: unknown command $cmd" >&2
  exit 2
  ;;
esac
