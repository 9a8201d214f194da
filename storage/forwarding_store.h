// A ColdStore that forwards every call to another (decorators override what
// they change: storage/checksummed_store.cc; tests share one store among
// engines with it: tests/engine_fixture.h).
#ifndef KVMEM_STORAGE_FORWARDING_STORE_H_
#define KVMEM_STORAGE_FORWARDING_STORE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "storage/cold_store.h"

namespace kvmem {

class ForwardingColdStore : public ColdStore {
 public:
  explicit ForwardingColdStore(std::shared_ptr<ColdStore> inner)
      : inner_(std::move(inner)) {}

  absl::Status Commit(const StreamWrite& w) override {
    return inner_->Commit(w);
  }
  absl::StatusOr<std::string> GetFrame(absl::string_view id,
                                       uint64_t f) override {
    return inner_->GetFrame(id, f);
  }
  absl::StatusOr<std::vector<std::string>> GetFrames(absl::string_view id,
                                                     uint64_t first,
                                                     uint64_t last) override {
    return inner_->GetFrames(id, first, last);
  }
  absl::StatusOr<std::vector<std::string>> GetFrameParts(
      absl::string_view id, uint64_t part_bytes,
      const std::vector<FramePart>& parts) override {
    return inner_->GetFrameParts(id, part_bytes, parts);
  }
  absl::StatusOr<std::string> GetFrameMeta(absl::string_view id,
                                           uint64_t f) override {
    return inner_->GetFrameMeta(id, f);
  }
  absl::StatusOr<std::string> GetBlockLayer(absl::string_view id, uint64_t b,
                                            uint32_t l) override {
    return inner_->GetBlockLayer(id, b, l);
  }
  absl::StatusOr<std::vector<std::string>> GetBlockLayers(
      absl::string_view id, uint64_t b,
      const std::vector<uint32_t>& layers) override {
    return inner_->GetBlockLayers(id, b, layers);
  }
  absl::Status ScanBlocks(
      absl::string_view id,
      const std::function<absl::Status(uint64_t, absl::string_view)>& fn)
      override {
    return inner_->ScanBlocks(id, fn);
  }
  absl::StatusOr<std::vector<StreamRecord>> ListStreams() override {
    return inner_->ListStreams();
  }
  absl::Status DeleteStream(absl::string_view id) override {
    return inner_->DeleteStream(id);
  }
  uint64_t ApproximatePayloadBytes() override {
    return inner_->ApproximatePayloadBytes();
  }
  absl::Status RecordAcknowledged(
      const std::map<std::string, uint64_t>& frames) override {
    return inner_->RecordAcknowledged(frames);
  }
  absl::StatusOr<std::map<std::string, uint64_t>> Acknowledged() override {
    return inner_->Acknowledged();
  }
  bool shared() const override { return inner_->shared(); }
  absl::Status ClaimStream(absl::string_view id, uint64_t token) override {
    return inner_->ClaimStream(id, token);
  }
  void ReleaseStream(absl::string_view id) override {
    inner_->ReleaseStream(id);
  }
  absl::StatusOr<StreamRecord> ReadStream(absl::string_view id,
                                          uint64_t* acknowledged) override {
    return inner_->ReadStream(id, acknowledged);
  }

 protected:
  ColdStore& inner() { return *inner_; }

 private:
  std::shared_ptr<ColdStore> inner_;
};

}  // namespace kvmem

#endif  // KVMEM_STORAGE_FORWARDING_STORE_H_
