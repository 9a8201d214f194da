// MemoryEngine: the registry of streams over one ColdStore. It validates
// stream ids and configs, recovers every stored stream when opened, and
// routes calls to the right Stream. With an ownership (engine/ownership.h:
// several servers sharing one store), it recovers nothing at Open and takes
// each stream up on the first call that names it, when this server may own
// it.
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
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "engine/accel/sim_model.h"
#include "engine/ownership.h"
#include "engine/stream_config.h"
#include "engine/types.h"
#include "storage/cold_store.h"

namespace kvmem {

class Accelerator;
class Executor;
class ForkJoinPool;
class Stream;
struct StreamEnv;

// A stream as the engine lends it to a caller that streams frames in or
// reads blocks out (the server's ingest and FetchBlocks, quota checks):
// nothing of the stream's maintenance. Holding one keeps the stream's
// memory alive; a deleted stream's calls answer NOT_FOUND. Copyable; safe
// to use from any thread.
class StreamHandle {
 public:
  const std::string& id() const;
  const StreamConfig& config() const;
  // Stores a frame durably (see MemoryEngine::Append).
  absl::StatusOr<AppendResult> Append(Frame frame) const;
  // Append's checks of a frame's header, before its payload (see
  // Stream::CheckFrameHeader).
  absl::Status CheckFrameHeader(const Frame& header) const;
  StreamStats Stats() const;
  absl::StatusOr<BlockInfo> GetBlock(uint64_t block_id) const;
  // A block's payload in `layout` (BLOCK_LAYER_MAJOR: the given layers,
  // empty for all); degraded blocks come back dequantised. *info (optional)
  // receives the block's metadata as of the read.
  absl::StatusOr<std::vector<PayloadPiece>> ReadBlockPayload(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& layers, BlockInfo* info = nullptr) const;
  // The same bytes written to dst (capacity bytes; BlockPayloadBytes of the
  // block, else OUT_OF_RANGE) with one copy from RAM or from the store's
  // read (layer-major: streaming stores, for memory another reader reads);
  // returns the bytes written.
  absl::StatusOr<uint64_t> ReadBlockPayloadInto(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
      BlockInfo* info = nullptr) const;
  // BLOCK_LAYER_MAJOR bytes of some of the block's tokens only: per layer
  // (the given ones, empty for all) K then V, each [kv_heads][tokens]
  // [head_dim]. tokens are offsets in the block's append order, strictly
  // increasing and below its token_count (INVALID_ARGUMENT otherwise); empty
  // means all (ReadBlockPayload's bytes in that layout). One piece per layer.
  absl::StatusOr<std::vector<PayloadPiece>> ReadBlockTokens(
      uint64_t block_id, const std::vector<uint32_t>& tokens,
      const std::vector<uint32_t>& layers, BlockInfo* info = nullptr) const;
  // The same bytes written to dst (capacity bytes: BlockPayloadBytes of
  // tokens.size() tokens, else OUT_OF_RANGE), one copy gathering the rows.
  absl::StatusOr<uint64_t> ReadBlockTokensInto(
      uint64_t block_id, const std::vector<uint32_t>& tokens,
      const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
      BlockInfo* info = nullptr) const;
  // What quotas count, O(1): payload bytes of the frames appended and not
  // evicted, at full precision (degradation does not shrink it), and the
  // RAM the kept blocks' signals hold (StreamStats::signal_bytes).
  uint64_t RetainedBytes() const;

 private:
  friend class MemoryEngine;
  friend class StreamTestPeer;  // tests/engine_fixture.h
  explicit StreamHandle(std::shared_ptr<Stream> s) : stream_(std::move(s)) {}
  std::shared_ptr<Stream> stream_;
};

inline constexpr char kSimProfileError[] = "sim profile ";

struct EngineOptions {
  // RAM all streams' warm blocks may hold together; 0 means no global cap.
  // A stream over it demotes its own coldest warm blocks. Staged copies
  // (tier_policy.prefetch_blocks) are made only into room left under it by
  // the warm blocks and all streams' staged copies.
  uint64_t global_warm_budget_bytes = 0;
  // Threads for tier moves, promotions and index rebuilds.
  int background_threads = 1;
  // Threads one recall may use for its scan of the units (per query vector)
  // and its token stage (slices of the pool): the caller's plus
  // recall_threads - 1 helpers (base/fork_join.h), shared by every
  // stream's recalls. 1 (the default): the caller's alone; 0: the
  // machine's hardware threads, at most 4. A recall does the same work
  // either way; its latency drops where cores are idle (on a 2-vCPU VM,
  // one recall at a time: an 8-vector recall's p50 -21 %, a 7B recall's
  // token stage 1.4 -> 1.0 ms), and helpers step aside when more recalls
  // run at once than there are helpers. Not the default: on that VM the
  // end-to-end 7B recall + delivery did not improve beyond noise, and p99s
  // under concurrent background work (RocksDB's flushes, 16 streams'
  // recalls) were worse (docs/benchmarks.md#recall-helper-threads).
  int recall_threads = 1;
  // While a recall is in progress, an idle helper polls for its next loop
  // for at most this long at a time before it sleeps (base/fork_join.h);
  // with no recall in progress helpers sleep.
  absl::Duration recall_spin = absl::Milliseconds(2);
  // The `sim` accelerator backend: results as on the CPU, plus each
  // recall's modelled cost on this hardware (engine/accel/sim_model.h). Unset:
  // the `cpu` backend alone.
  std::optional<SimHardware> sim;
  // A device profile (deploy/profiles/*.toml) for the `sim` backend's
  // hardware, read at Open (it replaces `sim`); a file that cannot be read
  // or is out of range fails Open with INVALID_ARGUMENT whose message
  // starts with kSimProfileError.
  std::string sim_profile_path;
  // Warnings the engine raises (e.g. an approximate index below the sim's
  // recall floor); may be empty.
  std::function<void(const std::string&)> warn;
  // Policy fields a stream's config leaves zero are taken from here before
  // the built-in defaults (WithServerDefaults; kvmem-server's
  // [stream_defaults]).
  StreamConfig stream_defaults;
  // Recovery (see Open): false salvages (a stream that fails to recover,
  // or recovers fewer frames than were acknowledged, is quarantined and the
  // others serve); true refuses to open instead.
  bool strict_recovery = false;
  // Milliseconds between acknowledgement records (ColdStore::
  // RecordAcknowledged); 0 records only on DeleteStream and shutdown.
  uint32_t acknowledge_interval_ms = 1000;
  // Errors the engine raises (a quarantined stream); may be empty.
  std::function<void(const std::string&)> error;
  // Set when the store is shared by several servers: who may serve each
  // stream (engine/ownership.h). Must outlive the engine.
  std::shared_ptr<StreamOwnership> ownership;
  // A block leaving RAM for the first time keeps its frames as its durable
  // copy (true), or has its KV rewritten per layer and its frames deleted
  // (false). Frames: every appended byte is written once (the ingest a
  // store's write bandwidth carries doubles otherwise); a read of a cold
  // block reads its whole frames, whatever layers it wants. Per layer: a
  // read of a few layers reads just those. A block's form is in its record:
  // either setting reads both, and false rewrites a block kept as frames
  // the next time it demotes it.
  bool demote_keeps_frames = false;
  // New streams store each frame in parts of consecutive tokens
  // (engine/codec/frame_parts.h: a part per token at 7B), so a cold read of
  // a few tokens reads their parts, not whole frames; the store keeps them
  // as separate records where it can (RocksDB; others read whole frames and
  // slice). Costs a copy of each frame at append. A stream keeps the form
  // it was created with.
  bool frame_parts = true;
  // Tokens per part when above 0 (tests, tuning); 0: FramePartTokens of
  // the stream's geometry.
  uint32_t frame_part_tokens = 0;
  // An append that fills its block returns once the frame is durable; the
  // seal (summaries, token groups and codes, the record, the warm copy)
  // follows on the background executor, or at the start of the stream's
  // next append, Close, a read of the block or a recall whose answer
  // depends on it if that comes first (Stream::SealBeforeRecall): answers
  // are those of a sealing append. A front end that sends window_lse, with
  // the block inside its window (the default window holds several blocks),
  // does not wait for the seal.
  // false: the append seals (its ack waits for it). kvmem-server's default
  // is true (--seal_after_ack): at 7B a seal is ~100-200 ms of CPU, which a
  // camera's append and the recall behind it on its Session waited for.
  bool seal_after_ack = false;
  // A stream's index rebuild runs no sooner than 1/this of its indexed
  // blocks have sealed since the last (RebuildSchedule; 0: no floor, the
  // stream's triggers alone, for tests that want rebuilds often).
  uint32_t rebuild_kept_per_sealed = 8;
};

// The threads a recall uses for EngineOptions::recall_threads = `option`
// (0: the hardware threads, at most 4; otherwise the option, at most
// kMaxRecallThreads).
inline constexpr int kMaxRecallThreads = 64;
int RecallThreads(int option);

// A stored stream that could not be served after recovery.
struct QuarantinedStream {
  std::string stream_id;
  // Why: DATA_LOSS (acknowledged frames missing, undecodable records) or
  // FAILED_PRECONDITION (a config or index this build cannot serve).
  absl::Status reason;
};

struct OpenStreamResult {
  bool created = false;
  StreamStats stats;
};

class MemoryEngine {
 public:
  // Takes ownership of store and recovers every stream it holds, checking
  // each against the store's acknowledgement record. A stream that fails to
  // recover (undecodable records, a config or index this build refuses, an
  // exception from FAISS), that recovers fewer frames than were
  // acknowledged, or that was acknowledged and is missing, is quarantined:
  // its calls answer its reason (DATA_LOSS or FAILED_PRECONDITION) and
  // DeleteStream removes it; options.error is told. With
  // options.strict_recovery, any of these fails Open instead.
  static absl::StatusOr<std::unique_ptr<MemoryEngine>> Open(
      std::unique_ptr<ColdStore> store, const EngineOptions& options = {});
  ~MemoryEngine();

  // Creates a stream, or reopens an existing one whose config (after
  // defaults) is equal; a different config is ALREADY_EXISTS.
  absl::StatusOr<OpenStreamResult> OpenStream(const std::string& id,
                                              const StreamConfig& config)
      ABSL_LOCKS_EXCLUDED(control_mu_, mu_);
  absl::StatusOr<StreamStats> CloseStream(const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DeleteStream(const std::string& id)
      ABSL_LOCKS_EXCLUDED(control_mu_, mu_);
  std::vector<StreamStats> ListStreams() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<StreamStats> GetStats(const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<AppendResult> Append(const std::string& id, Frame frame)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<RecallResult> Recall(const std::string& id,
                                      const RecallQuery& query)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The stream, for ingest and block reads. NOT_FOUND when absent;
  // INVALID_ARGUMENT for a malformed id; a quarantined stream's reason.
  absl::StatusOr<StreamHandle> Find(const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Applies a stream's queued recall feedback (heat, stage hits,
  // promotions) and its tier budgets now; the engine does it on its
  // background threads after recalls.
  absl::Status RunMaintenance(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Rebuilds a stream's indexes from its live summaries (Recall keeps
  // serving the old ones meanwhile); returns the blocks indexed. The engine
  // does it as blocks accumulate (tier_policy.rebuild_every_blocks).
  absl::StatusOr<size_t> RebuildIndex(const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu_);

  size_t stream_count() const ABSL_LOCKS_EXCLUDED(mu_);
  // With an ownership: streams are taken up on demand (Find may read the
  // store and rebuild a stream's indexes before it answers).
  bool adopts_streams() const { return ownership_ != nullptr; }
  // True when the stream is held in RAM (live; not quarantined).
  bool Holds(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<QuarantinedStream> Quarantined() const ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the acknowledgement record now (the engine does every
  // options.acknowledge_interval_ms, and at DeleteStream and shutdown).
  absl::Status RecordAcknowledged() ABSL_LOCKS_EXCLUDED(control_mu_, mu_);
  // The live streams whose id starts with prefix ("" for all), without
  // computing their stats: cheap enough for per-append admission checks.
  std::vector<StreamHandle> StreamsWithPrefix(const std::string& prefix) const
      ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t global_warm_bytes() const { return global_warm_bytes_.load(); }
  // RAM held by all streams' staged copies.
  uint64_t global_stage_bytes() const { return global_stage_bytes_.load(); }
  const Accelerator& accelerator() const { return *accel_; }
  // The retrieval backend in a line, for logs: "cpu", or the sim's
  // profile and hardware.
  const std::string& accelerator_description() const {
    return accel_description_;
  }

  // Waits until background work queued so far (tier moves after recalls,
  // rebuilds) has run. For tests and orderly shutdown.
  void WaitForBackground();

 private:
  MemoryEngine(std::unique_ptr<ColdStore> store, const EngineOptions& options);
  StreamEnv Env();
  // The live stream; NOT_FOUND, INVALID_ARGUMENT or a quarantine reason.
  // With an ownership, a stream not held yet is taken up (Adopt).
  absl::StatusOr<std::shared_ptr<Stream>> FindStream(const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The held stream (taken up first with an ownership), its quarantine
  // reason, or nullptr when it does not exist; keep_absent as Adopt's.
  absl::StatusOr<std::shared_ptr<Stream>> Lookup(const std::string& id,
                                                 bool keep_absent)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Open without an ownership: recovers every stored stream, checking each
  // against the acknowledgement record (see Open).
  absl::Status RecoverAll() ABSL_LOCKS_EXCLUDED(control_mu_, mu_);
  // The held stream or its quarantine reason; nullptr when neither.
  absl::StatusOr<std::shared_ptr<Stream>> Held(const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ownership: takes the stream up (acquire, claim with the fencing token,
  // read, recover). NOT_FOUND when it has no records; with keep_absent the
  // ownership is kept for the stream about to be created.
  absl::StatusOr<std::shared_ptr<Stream>> Adopt(const std::string& id,
                                                bool keep_absent)
      ABSL_LOCKS_EXCLUDED(adopt_mu_, mu_);
  // Drops a stream another server took over (or all of them when this
  // server's ownership lapsed): calls holding it answer `why`.
  void Disown(const std::string& id, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DisownAll(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Serves a recovered stream, or quarantines it when recovery failed or it
  // holds fewer frames than the `want` acknowledged.
  void Install(const std::string& id, uint64_t want,
               absl::StatusOr<std::unique_ptr<Stream>> stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recovers one stored stream; any failure (or exception) is the status.
  absl::StatusOr<std::unique_ptr<Stream>> RecoverOne(const StreamRecord& r);
  void Quarantine(const std::string& id, absl::Status reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record as it should be now; without `except`.
  std::map<std::string, uint64_t> AcknowledgedNow(
      const std::string* except) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WriteAcknowledged(const std::string* except)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mu_);
  void AcknowledgeLoop() ABSL_LOCKS_EXCLUDED(ack_mu_, control_mu_, mu_);

  std::unique_ptr<ColdStore> store_;
  const EngineOptions options_;
  // The retrieval backend all streams share (cpu, or sim with options.sim).
  const std::unique_ptr<Accelerator> accel_;
  std::atomic<uint64_t> global_warm_bytes_{0};
  std::atomic<uint64_t> global_stage_bytes_{0};
  // Declared after the store and before the streams' map, so it is
  // destroyed first: its tasks finish while streams and store still exist.
  std::unique_ptr<Executor> background_;
  // Helpers of recalls (options.recall_threads - 1 threads); null: none.
  std::unique_ptr<ForkJoinPool> recall_helpers_;
  // Serialises OpenStream and DeleteStream (which commit to the store).
  kvmem::Mutex control_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Serialises taking streams up (Adopt); held across their recovery.
  kvmem::Mutex adopt_mu_ ABSL_ACQUIRED_AFTER(control_mu_)
      ABSL_ACQUIRED_BEFORE(mu_);
  StreamOwnership* const ownership_;  // options_.ownership; may be null.
  // Set before background_ goes: moves found later are not queued.
  std::atomic<bool> stopping_moves_{false};
  // Bumped each time this server's ownership lapses: a stream whose taking
  // up began before is not installed.
  std::atomic<uint64_t> ownership_generation_{0};
  // Guards the map only; never held across storage I/O.
  mutable kvmem::Mutex mu_;
  std::map<std::string, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> quarantined_ ABSL_GUARDED_BY(mu_);
  // Acknowledged frames of quarantined streams, kept in the record so the
  // loss stays visible until the stream is deleted.
  std::map<std::string, uint64_t> quarantined_acks_ ABSL_GUARDED_BY(mu_);
  // The last record written (control_mu_): unchanged maps are not rewritten.
  std::map<std::string, uint64_t> last_record_ ABSL_GUARDED_BY(control_mu_);
  kvmem::Mutex ack_mu_;
  bool stopping_ ABSL_GUARDED_BY(ack_mu_) = false;
  std::thread ack_thread_;
  bool opened_ = false;  // Open succeeded: the record may be rewritten.
  std::string accel_description_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_MEMORY_ENGINE_H_
