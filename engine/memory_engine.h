// MemoryEngine: the registry of streams over one ColdStore. It validates
// stream ids and configs, recovers every stored stream when opened, and
// routes calls to the right Stream.
//
// Thread safety: all methods are safe to call concurrently; calls on different
// streams do not wait for each other beyond a short map lookup.
#ifndef KVMEM_ENGINE_MEMORY_ENGINE_H_
#define KVMEM_ENGINE_MEMORY_ENGINE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/stream.h"
#include "engine/types.h"
#include "storage/cold_store.h"

namespace kvmem {

struct OpenStreamResult {
  bool created = false;
  StreamStats stats;
};

class MemoryEngine {
 public:
  // Takes ownership of store and recovers every stream it holds. Fails with
  // DATA_LOSS when a stored record cannot be decoded.
  static absl::StatusOr<std::unique_ptr<MemoryEngine>> Open(
      std::unique_ptr<ColdStore> store);

  // Creates a stream, or reopens an existing one whose config (after
  // defaults) is equal; a different config is ALREADY_EXISTS.
  absl::StatusOr<OpenStreamResult> OpenStream(const std::string& id,
                                              const StreamConfig& config);
  absl::StatusOr<StreamStats> CloseStream(const std::string& id);
  absl::Status DeleteStream(const std::string& id);
  std::vector<StreamStats> ListStreams() const;
  absl::StatusOr<StreamStats> GetStats(const std::string& id) const;

  absl::StatusOr<AppendResult> Append(const std::string& id,
                                      const Frame& frame);
  absl::StatusOr<RecallResult> Recall(const std::string& id,
                                      const RecallQuery& query);

  // The stream, for block reads. NOT_FOUND when absent; INVALID_ARGUMENT for
  // a malformed id.
  absl::StatusOr<std::shared_ptr<Stream>> Find(const std::string& id) const;

  size_t stream_count() const;
  ColdStore* store() { return store_.get(); }

 private:
  explicit MemoryEngine(std::unique_ptr<ColdStore> store);

  std::unique_ptr<ColdStore> store_;
  // Serialises OpenStream and DeleteStream (which commit to the store).
  absl::Mutex control_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Guards the map only; never held across storage I/O.
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_MEMORY_ENGINE_H_
