// MemoryEngine: the registry of streams over one ColdStore. It validates
// stream ids and configs, recovers every stored stream when opened, and
// routes calls to the right Stream.
//
// Thread safety: all methods are safe to call concurrently; calls on different
// streams do not wait for each other beyond a short map lookup.
#ifndef KVMEM_ENGINE_MEMORY_ENGINE_H_
#define KVMEM_ENGINE_MEMORY_ENGINE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/accelerator.h"
#include "engine/sim_model.h"
#include "engine/stream.h"
#include "engine/types.h"
#include "storage/cold_store.h"

namespace kvmem {

struct EngineOptions {
  // RAM all streams' warm blocks may hold together; 0 means no global cap.
  // A stream over it demotes its own coldest warm blocks.
  uint64_t global_warm_budget_bytes = 0;
  // Threads for tier moves, promotions and index rebuilds.
  int background_threads = 1;
  // The `sim` accelerator backend: results as on the CPU, plus each
  // recall's modelled cost on this hardware (engine/sim_model.h). Unset:
  // the `cpu` backend alone.
  std::optional<SimHardware> sim;
  // Warnings the engine raises (e.g. an approximate index below the sim's
  // recall floor); may be empty.
  std::function<void(const std::string&)> warn;
  // Policy fields a stream's config leaves zero are taken from here before
  // the built-in defaults (WithServerDefaults; kvmem-server's
  // [stream_defaults]).
  StreamConfig stream_defaults;
};

struct OpenStreamResult {
  bool created = false;
  StreamStats stats;
};

class MemoryEngine {
 public:
  // Takes ownership of store and recovers every stream it holds. Fails with
  // DATA_LOSS when a stored record cannot be decoded.
  static absl::StatusOr<std::unique_ptr<MemoryEngine>> Open(
      std::unique_ptr<ColdStore> store, const EngineOptions& options = {});
  ~MemoryEngine();

  // Creates a stream, or reopens an existing one whose config (after
  // defaults) is equal; a different config is ALREADY_EXISTS.
  absl::StatusOr<OpenStreamResult> OpenStream(const std::string& id,
                                              const StreamConfig& config);
  absl::StatusOr<StreamStats> CloseStream(const std::string& id);
  absl::Status DeleteStream(const std::string& id);
  std::vector<StreamStats> ListStreams() const;
  absl::StatusOr<StreamStats> GetStats(const std::string& id) const;

  absl::StatusOr<AppendResult> Append(const std::string& id, Frame frame);
  absl::StatusOr<RecallResult> Recall(const std::string& id,
                                      const RecallQuery& query);

  // The stream, for block reads. NOT_FOUND when absent; INVALID_ARGUMENT for
  // a malformed id.
  absl::StatusOr<std::shared_ptr<Stream>> Find(const std::string& id) const;

  size_t stream_count() const;
  // The live streams whose id starts with prefix ("" for all), without
  // computing their stats: cheap enough for per-append admission checks.
  std::vector<std::shared_ptr<Stream>> StreamsWithPrefix(
      const std::string& prefix) const;
  uint64_t global_warm_bytes() const { return global_warm_bytes_.load(); }
  const Accelerator& accelerator() const { return *accel_; }

  // Waits until background work queued so far (tier moves after recalls,
  // rebuilds) has run. For tests and orderly shutdown.
  void WaitForBackground();

 private:
  MemoryEngine(std::unique_ptr<ColdStore> store, const EngineOptions& options);
  StreamEnv Env();

  std::unique_ptr<ColdStore> store_;
  const EngineOptions options_;
  // The retrieval backend all streams share (cpu, or sim with options.sim).
  const std::unique_ptr<Accelerator> accel_;
  std::atomic<uint64_t> global_warm_bytes_{0};
  // Declared after the store and before the streams' map, so it is
  // destroyed first: its tasks finish while streams and store still exist.
  std::unique_ptr<Executor> background_;
  // Serialises OpenStream and DeleteStream (which commit to the store).
  absl::Mutex control_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Guards the map only; never held across storage I/O.
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_MEMORY_ENGINE_H_
