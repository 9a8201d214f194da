#!/usr/bin/env bash
# clang's lock analysis catches what it must. Every build with clang turns
# -Wthread-safety into an error over every target (top-level CMakeLists.txt,
# as LevelDB's does; .ci/run's sanitizer build is such a build). Here the
# real sources compile clean under it, and copies of them with a lock
# planted away (every occurrence of one lock line: guarded state read
# unlocked, a scorer called without the view's shared lock, a tier move's or
# a recall hit's change of a block without the view's exclusive lock,
# staging without the tier manager's lock) fail naming the mutex.
# Usage: thread_safety_selftest.sh <source-dir>
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v clang++ > /dev/null || fail "clang++ is missing (deploy/bootstrap.sh installs clang)"
flags=(-std=c++17 -fsyntax-only -Wthread-safety -Werror=thread-safety "-I$src")

check() {  # check <file>: compiles clean
  clang++ "${flags[@]}" "$src/$1" > "$tmp/out.txt" 2>&1 ||
    fail "$1 does not pass the analysis: $(cat "$tmp/out.txt")"
  echo "clean: $1"
}

plant() {  # plant <file> <line to delete, as a fixed string> <what the error must say>
  local copy="$tmp/$(basename "$1")"
  grep -vF -- "$2" "$src/$1" > "$copy"
  cmp -s "$copy" "$src/$1" && fail "plant in $1: '$2' not found"
  if clang++ "${flags[@]}" "$copy" > "$tmp/out.txt" 2>&1; then
    fail "not caught: $1 without '$2'"
  fi
  grep -q -- "$3" "$tmp/out.txt" || fail "report for $1 lacks '$3': $(cat "$tmp/out.txt")"
  echo "caught: $1 without '$2': $(grep -m1 -o "error: .*" "$tmp/out.txt")"
}

check engine/view/recall_view.cc
check engine/recall/recaller.cc
check engine/tiers/tier_manager.cc
check engine/recall/recall_feedback.cc
check engine/tiers/tier_staging.cc
plant engine/view/recall_view.cc "kvmem::ReaderMutexLock lock(&mu_);" \
  "requires holding mutex 'mu_'"
plant engine/recall/recaller.cc "kvmem::ReaderMutexLock lock(&view.mu());" \
  "calling function 'PlanRecall' requires holding mutex 'view.mu_'"
plant engine/tiers/tier_manager.cc "kvmem::MutexLock lock(&mu_);" \
  "requires holding mutex 'mu_'"
plant engine/recall/recall_feedback.cc "kvmem::MutexLock lock(&mu_);" \
  "requires holding mutex 'mu_'"
plant engine/tiers/tier_staging.cc "kvmem::MutexLock lock(&view_->mu());" \
  "requires holding mutex 'view_->mu_' exclusively"
plant engine/tiers/tier_staging.cc "kvmem::MutexLock moves(&mu_);" \
  "requires holding mutex 'mu_'"
echo "PASS"
