// RadosColdStore's state (storage/rados_cold_store.h), shared by its two
// source files: rados_cold_store.cc (connecting, claims, commits, deletes)
// and rados_store_reads.cc (reads, listing, the acknowledged marks).
#ifndef KVMEM_STORAGE_RADOS_STORE_IMPL_H_
#define KVMEM_STORAGE_RADOS_STORE_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <rados/librados.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/sync.h"
#include "storage/cold_store.h"
#include "storage/rados_cold_store.h"
#include "storage/rados_io.h"

namespace kvmem::rados_store {

using rados_io::Ref;
using LayerId = std::pair<uint64_t, uint32_t>;

// Where every payload record of one stream lives, as its head says.
struct Manifest {
  std::map<uint64_t, Ref> frames;
  std::set<uint64_t> metas;
  std::map<LayerId, Ref> layers;
  std::map<uint64_t, Ref> blocks;               // Block records.
  std::map<std::string, uint64_t> object_refs;  // Records per object.
  uint64_t bytes = 0;

  void Take(const Ref& ref) {
    object_refs[ref.object] += 1;
    bytes += ref.length;
  }
  // Forgets one record's reference; the object's name when none is left.
  void Drop(const Ref& ref, std::vector<std::string>* unused) {
    bytes -= ref.length;
    auto it = object_refs.find(ref.object);
    if (it != object_refs.end() && --it->second == 0) {
      unused->push_back(it->first);
      object_refs.erase(it);
    }
  }
};

struct StreamEntry {
  StreamEntry(const librados::IoCtx& pool, const std::string& ns) {
    io.dup(pool);
    io.set_namespace(ns);
  }
  kvmem::Mutex mu;
  librados::IoCtx io;                       // The stream's namespace; set once.
  bool loaded ABSL_GUARDED_BY(mu) = false;  // m reflects the head.
  bool claimed ABSL_GUARDED_BY(mu) = false;  // epoch is ours.
  bool fenced ABSL_GUARDED_BY(mu) = false;   // A newer owner took it.
  // ReleaseStream detached this entry: calls still holding it are refused.
  bool released ABSL_GUARDED_BY(mu) = false;
  bool indexed ABSL_GUARDED_BY(mu) = false;
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
  uint64_t seq ABSL_GUARDED_BY(mu) = 0;
  uint64_t fenced_by ABSL_GUARDED_BY(mu) = 0;
  // A coordinator's token for this stream (ClaimStream); 0: the options'.
  uint64_t token ABSL_GUARDED_BY(mu) = 0;
  Manifest m ABSL_GUARDED_BY(mu);
};

struct PayloadPlan;

class RadosColdStore final : public ColdStore {
 public:
  explicit RadosColdStore(RadosColdStoreOptions options)
      : options_(std::move(options)) {}
  ~RadosColdStore() override;

  absl::Status Connect();

  absl::Status Commit(const StreamWrite& write) override;
  absl::StatusOr<std::string> GetFrame(absl::string_view stream_id,
                                       uint64_t frame_index) override;
  absl::StatusOr<std::vector<std::string>> GetFrames(
      absl::string_view stream_id, uint64_t first, uint64_t last) override;
  // Byte ranges of the frames' records (a frame is written whole): only
  // the parts asked for are read, all in flight at once.
  absl::StatusOr<std::vector<std::string>> GetFrameParts(
      absl::string_view stream_id, uint64_t part_bytes,
      const std::vector<FramePart>& parts) override;
  absl::StatusOr<std::string> GetFrameMeta(absl::string_view stream_id,
                                           uint64_t frame_index) override;
  absl::StatusOr<std::string> GetBlockLayer(absl::string_view stream_id,
                                            uint64_t block_id,
                                            uint32_t layer) override;
  absl::StatusOr<std::vector<std::string>> GetBlockLayers(
      absl::string_view stream_id, uint64_t block_id,
      const std::vector<uint32_t>& layers) override;
  absl::Status ScanBlocks(
      absl::string_view stream_id,
      const std::function<absl::Status(uint64_t, absl::string_view)>& fn)
      override;
  absl::StatusOr<std::vector<StreamRecord>> ListStreams() override;
  absl::Status DeleteStream(absl::string_view stream_id) override;
  uint64_t ApproximatePayloadBytes() override;
  absl::Status RecordAcknowledged(
      const std::map<std::string, uint64_t>& frames) override;
  absl::StatusOr<std::map<std::string, uint64_t>> Acknowledged() override;
  bool shared() const override { return true; }
  absl::Status ClaimStream(absl::string_view stream_id,
                           uint64_t fencing_token) override;
  void ReleaseStream(absl::string_view stream_id) override;
  absl::StatusOr<StreamRecord> ReadStream(absl::string_view stream_id,
                                          uint64_t* acknowledged) override;

 private:
  std::shared_ptr<StreamEntry> Entry(absl::string_view stream_id);
  // Brings e's manifest up to date; with `write`, claims the stream first
  // (creating its head). Reads of a stream without a head see nothing.
  absl::Status Ready(StreamEntry& e, bool write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.mu);
  absl::Status Claim(StreamEntry& e, bool create)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.mu);
  absl::Status Load(StreamEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.mu);
  absl::Status Fenced(const StreamEntry& e, absl::string_view stream_id) const
      ABSL_SHARED_LOCKS_REQUIRED(e.mu);
  // Runs fn under e's reader lock once e is ready for reads.
  absl::Status ReadLocked(absl::string_view stream_id,
                          const std::function<absl::Status(StreamEntry&)>& fn);
  absl::Status CommitHead(StreamEntry& e, const StreamWrite& w,
                          const PayloadPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.mu);
  absl::Status Index(StreamEntry& e, const std::string& stream_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.mu);
  // Reads the records `pick` names in the manifest (picked under the
  // stream's reader lock, read without it), looking again when a commit
  // replaced one meanwhile.
  absl::StatusOr<std::vector<std::string>> ReadRecords(
      absl::string_view stream_id,
      const std::function<absl::Status(const Manifest&, std::vector<Ref>*)>&
          pick);
  absl::StatusOr<std::vector<std::string>> IndexedStreams();

  const RadosColdStoreOptions options_;
  librados::Rados cluster_;
  librados::IoCtx pool_;  // Default namespace: the stream index.
  kvmem::Mutex mu_;
  std::map<std::string, std::shared_ptr<StreamEntry>, std::less<>> entries_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> acked_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> bytes_{0};
  // Set by the first ClaimStream: from then on only streams claimed with a
  // coordinator's token are touched (a released stream is never claimed
  // again behind the coordinator's back).
  std::atomic<bool> coordinated_{false};
  std::string index_;  // The index object's name.
};

}  // namespace kvmem::rados_store

#endif  // KVMEM_STORAGE_RADOS_STORE_IMPL_H_
