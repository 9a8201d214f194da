// Accelerator: the pluggable retrieval engine behind recall.
//
// Like faiss::Index, a small required core plus optional extras, with the
// per-call knobs in a parameters struct:
//   Search (required)  the top-k block (or group) summaries for one query.
//   Scan   (optional)  every summary's score per head (per-head recall);
//                      the default runs BlockIndex::ScanSegments on the host.
//   Stage  (optional)  move the chosen blocks' KV into near memory for
//                      injection; the host has no nearer memory, so the
//                      default does nothing and costs nothing.
// Every call reports its cost in a CallCost: the host time it took, and for
// modelled backends the modelled time (queueing included), DRAM bytes and
// energy.
//
// Backends:
//   cpu  BlockIndex on the host (FAISS, or the exact progressive search),
//        measured wall time only.
//   sim  the same results as cpu (it runs the cpu search), plus the cost on
//        a modelled edge SoC (engine/accel/sim_model.h): an ANN engine with
//        precision stages, DRAM bursts, an SRAM split between hot-window
//        cache and staging buffer re-partitioned in granules around each
//        recall, and a priority queue that serves concurrent recalls of all
//        streams one injection (at most max_blocks_per_injection blocks) at a
//        time. The queue is real: a sim call waits for its turn, so the
//        modelled queue time is the modelled work served while it waited.
//
// Thread safety: every method may be called concurrently.
#ifndef KVMEM_ENGINE_ACCEL_ACCELERATOR_H_
#define KVMEM_ENGINE_ACCEL_ACCELERATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/sync.h"
#include "engine/accel/sim_model.h"
#include "engine/index/block_index.h"
#include "engine/types.h"

namespace kvmem {

// Per-call parameters.
struct SearchParams {
  uint32_t k = 16;
  uint32_t priority = 0;  // Higher is served first when calls contend.
  ScanMode mode = ScanMode::kProof;  // Scan: what the caller needs.
};
struct StageParams {
  uint32_t priority = 0;
};

// The backend's own state (engine-wide, all streams).
struct AcceleratorStats {
  std::string backend;
  bool modelled = false;
  CallCost total;  // Sum over all calls.
  // sim: the SRAM split right now and how often it changed.
  uint64_t sram_bytes = 0;
  uint64_t sram_hot_bytes = 0;
  uint64_t sram_staging_bytes = 0;
  uint64_t repartitions = 0;
  double recall_floor = 0;  // 0: none enforced.
};

class Accelerator {
 public:
  virtual ~Accelerator() = default;

  virtual const std::string& name() const = 0;
  // True when calls report modelled cost (modelled_us and the rest).
  virtual bool modelled() const { return false; }
  // Approximate indexes whose sampled recall@k is below this are flagged
  // (stats and log); 0: no floor.
  virtual double recall_floor() const { return 0; }

  // Up to params.k ids of `index` with the highest inner product with
  // query (index.dim() floats), best first; *cost (optional) gets this
  // call's cost added.
  virtual std::vector<ScoredId> Search(const BlockIndex& index,
                                       const float* query,
                                       const SearchParams& params,
                                       CallCost* cost) = 0;

  // Scores query against every summary of `index` per segment (per KV head
  // of each indexed layer) into *out; false when the index cannot
  // (BlockIndex::ScanSegments). params.k: how many candidates the caller
  // expects to refine exactly afterwards (the modelled refinement stage).
  virtual bool Scan(const BlockIndex& index, const float* query,
                    const SearchParams& params, SegmentScan* out,
                    CallCost* cost);
  // The same for `vectors` queries (vectors * index.dim() floats) into
  // out[0, vectors), their costs added to *cost: one Scan per query unless
  // the backend does better (cpu: the codes read once for all of them,
  // BlockIndex::ScanSegments). false when the index cannot scan.
  virtual bool Scan(const BlockIndex& index, const float* queries,
                    size_t vectors, const SearchParams& params,
                    SegmentScan* out, CallCost* cost);

  // Stages the KV of a recall's chosen blocks into near memory.
  virtual void Stage(const std::vector<StageItem>& items,
                     const StageParams& params, CallCost* cost);

  virtual AcceleratorStats Stats() const = 0;
};

// "cpu": BlockIndex::Search, timed.
std::unique_ptr<Accelerator> NewCpuAccelerator();
// "sim": the cpu results with their cost on `hw`.
std::unique_ptr<Accelerator> NewSimAccelerator(const SimHardware& hw);
// A process-wide cpu backend, for streams given none.
Accelerator& SharedCpuAccelerator();

// The sim's recall queue: one holder at a time; waiters are admitted by
// priority (higher first), then in arrival order. It keeps a modelled
// clock: the sum of the modelled service times of every admission so far.
class PriorityGate {
 public:
  struct Ticket {
    double queue_s = 0;  // Modelled work served while this one waited.
  };
  // Blocks until this caller holds the gate.
  Ticket Acquire(uint32_t priority) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases the gate; its holder's service took `modelled_s`.
  void Release(double modelled_s) ABSL_LOCKS_EXCLUDED(mu_);
  // Callers waiting (not holding); for tests.
  size_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiter {
    uint32_t priority;
    uint64_t seq;
  };
  bool IsNext(uint64_t seq) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable kvmem::Mutex mu_;
  kvmem::CondVar cv_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  double clock_s_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_ACCEL_ACCELERATOR_H_
