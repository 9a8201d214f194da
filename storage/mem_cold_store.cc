// In-memory ColdStore: ordered maps under one mutex. For tests.
#include <map>

#include "base/sync.h"
#include "storage/cold_store.h"

namespace kvmem {
namespace {

struct MemStream {
  std::string config;
  std::string state;
  std::map<uint64_t, std::string> frames;
  std::map<uint64_t, std::string> frame_meta;
  std::map<uint64_t, std::string> blocks;
  std::map<std::pair<uint64_t, uint32_t>, std::string> layers;
};

absl::StatusOr<std::string> Lookup(
    const std::map<std::string, MemStream>& m, absl::string_view stream_id,
    const std::function<const std::string*(const MemStream&)>& pick) {
  auto it = m.find(std::string(stream_id));
  const std::string* v = it == m.end() ? nullptr : pick(it->second);
  if (v == nullptr) return absl::NotFoundError("record not stored");
  return *v;
}

template <typename Map, typename Key>
const std::string* Find(const Map& m, const Key& k) {
  auto it = m.find(k);
  return it == m.end() ? nullptr : &it->second;
}

class MemColdStore final : public ColdStore {
 public:
  absl::Status Commit(const StreamWrite& write) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    MemStream& s = streams_[write.stream_id];
    for (uint64_t b : write.delete_block_layers) {
      s.layers.erase(s.layers.lower_bound({b, 0}),
                     s.layers.lower_bound({b + 1, 0}));
    }
    for (const auto& [first, last] : write.delete_frames) {
      s.frames.erase(s.frames.lower_bound(first), s.frames.upper_bound(last));
      s.frame_meta.erase(s.frame_meta.lower_bound(first),
                         s.frame_meta.upper_bound(last));
    }
    for (const auto& [first, last] : write.delete_frame_metas) {
      s.frame_meta.erase(s.frame_meta.lower_bound(first),
                         s.frame_meta.upper_bound(last));
    }
    if (write.config) s.config = *write.config;
    if (write.state) s.state = *write.state;
    if (write.frame) {
      s.frames[write.frame->first] = std::string(write.frame->second);
      if (write.frame_meta)
        s.frame_meta[write.frame->first] = *write.frame_meta;
    }
    for (const auto& [id, record] : write.blocks) s.blocks[id] = record;
    for (const auto& l : write.block_layers) {
      s.layers[{l.block_id, l.layer}] = l.bytes;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> GetFrameMeta(absl::string_view stream_id,
                                           uint64_t frame_index) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    return Lookup(streams_, stream_id, [&](const MemStream& s) {
      return Find(s.frame_meta, frame_index);
    });
  }

  absl::StatusOr<std::string> GetBlockLayer(absl::string_view stream_id,
                                            uint64_t block_id,
                                            uint32_t layer) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    return Lookup(streams_, stream_id, [&](const MemStream& s) {
      return Find(s.layers, std::make_pair(block_id, layer));
    });
  }

  absl::StatusOr<std::string> GetFrame(absl::string_view stream_id,
                                       uint64_t frame_index) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    return Lookup(streams_, stream_id, [&](const MemStream& s) {
      return Find(s.frames, frame_index);
    });
  }

  absl::Status ScanBlocks(
      absl::string_view stream_id,
      const std::function<absl::Status(uint64_t, absl::string_view)>& fn)
      override ABSL_LOCKS_EXCLUDED(mu_) {
    std::map<uint64_t, std::string> copy;
    {
      kvmem::MutexLock lock(&mu_);
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

  absl::StatusOr<std::vector<StreamRecord>> ListStreams() override
      ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    std::vector<StreamRecord> out;
    for (const auto& [id, s] : streams_) {
      if (!s.config.empty()) out.push_back({id, s.config, s.state});
    }
    return out;
  }

  absl::Status DeleteStream(absl::string_view stream_id) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    streams_.erase(std::string(stream_id));
    return absl::OkStatus();
  }

  uint64_t ApproximatePayloadBytes() override ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [id, s] : streams_) {
      for (const auto& [i, f] : s.frames) n += f.size();
      for (const auto& [k, l] : s.layers) n += l.size();
    }
    return n;
  }

  absl::Status RecordAcknowledged(const std::map<std::string, uint64_t>& frames)
      override ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    acknowledged_ = frames;
    return absl::OkStatus();
  }
  absl::StatusOr<std::map<std::string, uint64_t>> Acknowledged() override
      ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    return acknowledged_;
  }

 private:
  kvmem::Mutex mu_;
  std::map<std::string, MemStream> streams_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> acknowledged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ColdStore> NewMemColdStore() {
  return std::make_unique<MemColdStore>();
}

}  // namespace kvmem
