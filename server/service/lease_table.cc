#include "server/service/lease_table.h"

#include <algorithm>
#include <iterator>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace kvmem {

namespace {

// Reclaimed lease ids remembered for late releases.
constexpr size_t kReclaimedMemory = 4096;

}  // namespace

LeaseTable::LeaseTable(uint64_t arena_id, uint64_t bytes)
    : arena_id_(arena_id), bytes_(bytes) {
  free_[0] = bytes;
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> LeaseTable::Allocate(
    uint64_t bytes, uint64_t* reclaimed) {
  const auto now = std::chrono::steady_clock::now();
  kvmem::MutexLock lock(&mu_);
  std::optional<uint64_t> at = FirstFit(bytes);
  if (!at) {
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.expires > now) {
        ++it;
        continue;
      }
      Free(it->second);
      Remember(it->first);
      ++*reclaimed;
      it = leases_.erase(it);
    }
    at = FirstFit(bytes);
  }
  if (!at) {
    uint64_t leased = 0;
    for (const auto& [id, r] : leases_) leased += r.bytes;
    return absl::ResourceExhaustedError(absl::StrCat(
        "shared-memory arena ", arena_id_, " has no free range of ", bytes,
        " bytes: ", leased, " of its ", bytes_, " bytes are held by ",
        leases_.size(),
        " live leases; release them (ReleaseLeases) or attach a larger "
        "arena"));
  }
  const uint64_t lease_id = ++next_lease_;
  leases_[lease_id] = {*at, bytes,
                       std::chrono::steady_clock::time_point::max()};
  return std::make_pair(lease_id, *at);
}

void LeaseTable::Start(uint64_t lease_id, std::chrono::milliseconds lease) {
  kvmem::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it != leases_.end()) {
    it->second.expires = std::chrono::steady_clock::now() + lease;
  }
}

absl::Status LeaseTable::Release(const std::vector<uint64_t>& asked,
                                 uint32_t* released,
                                 std::vector<uint64_t>* expired) {
  // A lease named twice is released once (not reported expired the second
  // time).
  // (A set: a search of the list so far made a call of 320,000 ids take
  // 11 s of a worker.)
  std::vector<uint64_t> ids;
  ids.reserve(asked.size());
  absl::flat_hash_set<uint64_t> named;
  named.reserve(asked.size());
  for (uint64_t id : asked) {
    if (named.insert(id).second) ids.push_back(id);
  }
  kvmem::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    if (leases_.count(id) == 0 && reclaimed_ids_.count(id) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("lease_ids has ", id, ", not a live lease of arena ",
                       arena_id_, " (released already, or never issued)"));
    }
  }
  for (uint64_t id : ids) {
    auto it = leases_.find(id);
    if (it == leases_.end()) {
      reclaimed_ids_.erase(id);
      expired->push_back(id);
      continue;
    }
    Free(it->second);
    leases_.erase(it);
    ++*released;
  }
  return absl::OkStatus();
}

void LeaseTable::Abandon(uint64_t lease_id) {
  kvmem::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return;
  Free(it->second);
  leases_.erase(it);
}

LeaseTable::Totals LeaseTable::Live() const {
  kvmem::MutexLock lock(&mu_);
  Totals t;
  t.leases = leases_.size();
  for (const auto& [id, r] : leases_) t.bytes += r.bytes;
  return t;
}

std::optional<uint64_t> LeaseTable::FirstFit(uint64_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const uint64_t at = it->first, left = it->second - bytes;
    free_.erase(it);
    if (left > 0) free_[at + bytes] = left;
    return at;
  }
  return std::nullopt;
}

void LeaseTable::Free(const Range& r) {
  uint64_t at = r.offset, n = r.bytes;
  auto next = free_.lower_bound(at);
  if (next != free_.end() && at + n == next->first) {
    n += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      at = prev->first;
      n += prev->second;
      free_.erase(prev);
    }
  }
  free_[at] = n;
}

void LeaseTable::Remember(uint64_t id) {
  if (reclaimed_ids_.size() >= kReclaimedMemory) {
    reclaimed_ids_.erase(reclaimed_ids_.begin());
  }
  reclaimed_ids_.insert(id);
}

}  // namespace kvmem
