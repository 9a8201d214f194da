#!/usr/bin/env bash
# The client library is only a client: builds client/cpp/example outside the
# kvmem build, with only client/cpp headers and the generated kvmem.v1 code
# on the include path and only kvmem_client + kvmem_proto + gRPC linked;
# runs it against a real kvmem-server on a unix socket (it checks the fetched
# KV byte for byte); and checks with ldd that it needs neither RocksDB nor
# FAISS (nor any other kvmem library).
# Usage: client_only_test.sh <source-dir> <build-dir> <libkvmem_client.a>
#          <libkvmem_proto.a> [<c++ compiler> [<link flags>]]
set -euo pipefail
src=$1 build=$2 client_lib=$3 proto_lib=$4 cxx=${5:-c++} link_flags=${6:-}
tmp=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Only the client's headers, copied: any include of engine/, storage/,
# server/ or base/ would not compile.
mkdir -p "$tmp/include/client/cpp" "$tmp/project"
cp "$src"/client/cpp/*.h "$tmp/include/client/cpp/"
cat > "$tmp/project/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.22)
project(kvmem_client_only CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
add_executable(client_example "$src/client/cpp/example/client_example.cc")
target_include_directories(client_example PRIVATE "$tmp/include" "$build/proto/gen")
target_link_libraries(client_example PRIVATE "$client_lib" "$proto_lib"
  gRPC::grpc++ protobuf::libprotobuf)
CMAKE
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S "$tmp/project" -B "$tmp/out" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_EXE_LINKER_FLAGS="$link_flags" > "$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; fail "configure"; }
cmake --build "$tmp/out" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build"; }
example="$tmp/out/client_example"
[ -x "$example" ] || fail "no client_example built"

# What it loads: gRPC and protobuf, never RocksDB, FAISS, OpenMP or BLAS.
ldd "$example" > "$tmp/ldd.txt"
grep -q "libgrpc++" "$tmp/ldd.txt" || fail "ldd shows no libgrpc++: $(cat "$tmp/ldd.txt")"
if grep -Ei "rocksdb|faiss|gomp|blas|lapack|kvmem" "$tmp/ldd.txt"; then
  fail "the client-only program loads the libraries above"
fi
echo "ldd client_example: $(wc -l < "$tmp/ldd.txt") libraries, no RocksDB/FAISS"

sock="$tmp/kvmem.sock"
"$build/bin/kvmem-server" --listen= --unix_socket="$sock" --data_dir="$tmp/data" \
  2> "$tmp/server.log" &
server_pid=$!
for _ in $(seq 100); do grep -q "serving on unix:" "$tmp/server.log" && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$tmp/server.log"; fail "server socket did not appear"; }
"$example" "unix:$sock" > "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "client_example failed"; }
cat "$tmp/out.txt"
grep -qE "blocks recalled, [1-9][0-9]* bytes fetched byte-exact" "$tmp/out.txt" ||
  fail "unexpected output"
echo "PASS"
