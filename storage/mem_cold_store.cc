// In-memory ColdStore: ordered maps under one mutex. For tests.
#include <map>

#include "absl/synchronization/mutex.h"
#include "storage/cold_store.h"

namespace kvmem {
namespace {

struct MemStream {
  std::string config;
  std::string state;
  std::map<uint64_t, std::string> frames;
  std::map<uint64_t, std::string> blocks;
};

class MemColdStore final : public ColdStore {
 public:
  absl::Status Commit(const StreamWrite& write) override {
    absl::MutexLock lock(&mu_);
    MemStream& s = streams_[write.stream_id];
    if (write.config) s.config = *write.config;
    if (write.state) s.state = *write.state;
    if (write.frame) {
      s.frames[write.frame->first] = std::string(write.frame->second);
    }
    for (const auto& [id, record] : write.blocks) s.blocks[id] = record;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> GetFrame(absl::string_view stream_id,
                                       uint64_t frame_index) override {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(std::string(stream_id));
    if (it != streams_.end()) {
      auto f = it->second.frames.find(frame_index);
      if (f != it->second.frames.end()) return f->second;
    }
    return absl::NotFoundError("frame not stored");
  }

  absl::Status ScanBlocks(
      absl::string_view stream_id,
      const std::function<absl::Status(uint64_t, absl::string_view)>& fn)
      override {
    std::map<uint64_t, std::string> copy;
    {
      absl::MutexLock lock(&mu_);
      auto it = streams_.find(std::string(stream_id));
      if (it == streams_.end()) return absl::OkStatus();
      copy = it->second.blocks;
    }
    for (const auto& [id, record] : copy) {
      absl::Status s = fn(id, record);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<StreamRecord>> ListStreams() override {
    absl::MutexLock lock(&mu_);
    std::vector<StreamRecord> out;
    for (const auto& [id, s] : streams_) {
      if (!s.config.empty()) out.push_back({id, s.config, s.state});
    }
    return out;
  }

  absl::Status DeleteStream(absl::string_view stream_id) override {
    absl::MutexLock lock(&mu_);
    streams_.erase(std::string(stream_id));
    return absl::OkStatus();
  }

  uint64_t ApproximatePayloadBytes() override {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [id, s] : streams_) {
      for (const auto& [i, f] : s.frames) n += f.size();
    }
    return n;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, MemStream> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ColdStore> NewMemColdStore() {
  return std::make_unique<MemColdStore>();
}

}  // namespace kvmem
