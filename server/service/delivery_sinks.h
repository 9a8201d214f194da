// The two delivery sinks (server/service/delivery.h): inline, into bytes a
// response carries, and shared memory, into one lease of the client's
// arena.
//
// Thread safety: as DeliverySink: one delivery each; Slot from several
// threads for distinct blocks.
#ifndef KVMEM_SERVER_SERVICE_DELIVERY_SINKS_H_
#define KVMEM_SERVER_SERVICE_DELIVERY_SINKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/service/delivery.h"
#include "server/service/shm_arenas.h"

namespace kvmem {

// Into strings the response then owns (Describe moves each into
// DeliveredBlock.data), at most max_bytes in all (RESOURCE_EXHAUSTED
// beyond: a response must stay below the transport's message size).
class InlineSink final : public DeliverySink {
 public:
  explicit InlineSink(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  absl::Status Reserve(const std::vector<uint64_t>& sizes) override;
  uint8_t* Slot(size_t i) override {
    return reinterpret_cast<uint8_t*>(data_[i].data());
  }
  void Finish() override {}
  void Abandon() override { data_.clear(); }
  void Describe(size_t i, v1::DeliveredBlock* out) override {
    *out->mutable_data() = std::move(data_[i]);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  const uint64_t max_bytes_;
  std::vector<std::string> data_;
  uint64_t bytes_ = 0;
};

// Into one lease of the caller's arena (tenant, arena_id), blocks back to
// back (the leases the request releases went back before it ran:
// ReleaseNamedLeases). Finish starts the lease's time (ShmArenas::Written);
// Abandon gives it back.
class ShmSink final : public DeliverySink {
 public:
  // REQUIRES: shm outlives the sink.
  ShmSink(ShmArenas* shm, std::string tenant, uint64_t arena_id)
      : shm_(shm), tenant_(std::move(tenant)), arena_id_(arena_id) {}
  absl::Status Reserve(const std::vector<uint64_t>& sizes) override;
  uint8_t* Slot(size_t i) override { return lease_->data + at_[i]; }
  void Finish() override { shm_->Written(*lease_); }
  void Abandon() override;
  void Describe(size_t i, v1::DeliveredBlock* out) override {
    *out->mutable_shm() = Region(i);
  }
  // Block i's region of the arena. REQUIRES: Reserve succeeded.
  v1::ShmRegion Region(size_t i) const;
  // The lease, once reserved (and not abandoned).
  const std::optional<ShmArenas::Lease>& lease() const { return lease_; }

 private:
  ShmArenas* const shm_;
  const std::string tenant_;
  const uint64_t arena_id_;
  std::optional<ShmArenas::Lease> lease_;
  std::vector<uint64_t> at_, sizes_;  // Each block's offset in the lease.
};

// The leases a delivery request names as done with (its release_lease_ids,
// `field` in the error) of the caller's arena `arena_id`, released at once:
// before the request runs, whether it then succeeds or not (a delivery used
// to release them only once it placed its blocks: a refused one's stayed
// live until --shm_lease_ms). Ids that are not live leases are ignored; no
// shared memory (shm null) or arena 0: nothing is released.
absl::Status ReleaseNamedLeases(ShmArenas* shm, const std::string& tenant,
                                uint64_t arena_id,
                                absl::Span<const uint64_t> lease_ids,
                                absl::string_view field);

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_DELIVERY_SINKS_H_
