#!/usr/bin/env bash
# Installs every Debian 12 package that building, testing and running kvmem needs.
# Idempotent: packages already present are left alone; apt-get update runs only when
# something is missing. Used by README.md, .ci/run and the Dockerfile alike.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev libgrpc-dev
  libabsl-dev
  libfaiss-dev libopenblas-dev libblas-dev liblapack-dev
  librocksdb-dev
  librados-dev libradospp-dev ceph-mon ceph-osd ceph-mgr ceph-common uuid-runtime
  etcd-server golang-etcd-server-dev golang-github-gogo-protobuf-dev
  golang-github-grpc-ecosystem-grpc-gateway-dev
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev libomp-dev openssl
  python3
  gnuplot-nox
  prometheus-cpp-dev libtomlplusplus-dev curl
  nginx
  python3-grpcio python3-grpc-tools python3-protobuf python3-numpy python3-yaml
  python3-torch
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "bootstrap: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "bootstrap: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "bootstrap: done"
