#include "server/service/delivery_sinks.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvmem {

absl::Status InlineSink::Reserve(const std::vector<uint64_t>& sizes) {
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  if (total > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "inline delivery of ", sizes.size(), " blocks is ", total,
        " bytes; a response may carry at most ", max_bytes_,
        ": deliver through shared memory, or fetch with FetchBlocks"));
  }
  data_.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) data_[i].resize(sizes[i]);
  bytes_ = total;
  return absl::OkStatus();
}

absl::Status ShmSink::Reserve(const std::vector<uint64_t>& sizes) {
  sizes_ = sizes;
  at_.assign(sizes.size(), 0);
  uint64_t total = sizes.empty() ? 0 : sizes[0];
  for (size_t i = 1; i < sizes.size(); ++i) {
    at_[i] = at_[i - 1] + sizes[i - 1];
    total += sizes[i];
  }
  KVMEM_ASSIGN_OR_RETURN(ShmArenas::Lease lease,
                         shm_->Reserve(tenant_, arena_id_, total));
  lease_ = std::move(lease);
  return absl::OkStatus();
}

void ShmSink::Abandon() {
  if (lease_) shm_->Abandon(*lease_);
  lease_.reset();
}

v1::ShmRegion ShmSink::Region(size_t i) const {
  v1::ShmRegion r;
  r.set_lease_id(lease_->lease_id);
  r.set_offset(lease_->offset + at_[i]);
  r.set_length(sizes_[i]);
  return r;
}

absl::Status ReleaseNamedLeases(ShmArenas* shm, const std::string& tenant,
                                uint64_t arena_id,
                                absl::Span<const uint64_t> lease_ids,
                                absl::string_view field) {
  KVMEM_RETURN_IF_ERROR(
      CheckLeaseIds(static_cast<int>(lease_ids.size()), field));
  if (shm != nullptr && arena_id != 0 && !lease_ids.empty()) {
    shm->ReleaseLive(tenant, arena_id, lease_ids);
  }
  return absl::OkStatus();
}

}  // namespace kvmem
