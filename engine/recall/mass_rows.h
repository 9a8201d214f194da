// Score MASS's scanned rows: every unit the scans returned, with its tokens,
// its role in the estimate and the estimate itself, shared by the recall
// sets of one recall (engine/recall/mass_scorer.cc) and by its identity
// channel (engine/recall/identity_channel.h). Call under the view's lock.
#ifndef KVMEM_ENGINE_RECALL_MASS_ROWS_H_
#define KVMEM_ENGINE_RECALL_MASS_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/index/block_index.h"
#include "engine/index/token_codes.h"
#include "engine/recall/mass_estimate.h"
#include "engine/recall/scorer.h"
#include "engine/view/recall_view.h"

namespace kvmem {

// The token group of a unit id (block << shift | group).
inline uint32_t GroupOf(uint64_t unit, uint32_t shift) {
  return static_cast<uint32_t>(unit & ((uint64_t{1} << shift) - 1));
}

// The scanned candidates, shared by the sets of one recall (per-thread
// scratch: a recall allocates little once warm).
struct MassRows {
  std::vector<SegmentScan> scans;  // One per query vector.
  std::vector<uint32_t> tokens;
  std::vector<CandidateRole> role;
  std::vector<float> counted;     // MassInputs::counted.
  std::vector<float> recallable;  // 1 for kRecall rows, else 0.
  MassEstimate est;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool exact = true;       // The scans' dots are exact.
  TokenQuery token_query;  // The token stage's vectors.
  // The identity channel: the estimate of the query's mean vector (the
  // query as a whole) over every row, recallable or in the window, and the
  // query's tracks' most recent recallable blocks (none when the channel
  // is off).
  MassEstimate mean_est;
  std::vector<uint64_t> anchors;
  // The block whose recallable rows hold only their tokens before the
  // window (ClassifyRows): recalled by token only, never a whole group.
  uint64_t straddle_block = UINT64_MAX;
  const std::vector<uint64_t>& ids() const { return scans[0].ids; }
};

// The recallable rows a set's token pool is chosen from, with their value
// (attention), tokens and unit ids (per-thread scratch of one set).
struct PoolCandidates {
  std::vector<uint32_t> row, tokens;
  std::vector<float> value, other;  // other: a second value (identity).
  std::vector<uint64_t> id;
  void Clear() {
    row.clear();
    tokens.clear();
    value.clear();
    other.clear();
    id.clear();
  }
};

// The estimated cold mass of n rows: the sum of density[i] * tokens[i]
// (in double) over the rows whose recallable[i] > 0. Four sums over
// strided rows (row i adds to sum i % 4, the tail's to sum 0), added as
// (s0 + s1) + (s2 + s3): deterministic, and the row-order sum up to its
// rounding. SSE2 (x86-64's baseline) where there is SSE2: the same double
// as the scalar loop, bit for bit (a NaN's payload aside; MassRowsTest).
double ColdMass(const float* density, const float* recallable,
                const uint32_t* tokens, size_t n);
// The same, the scalar loop (the definition).
double ColdMassScalar(const float* density, const float* recallable,
                      const uint32_t* tokens, size_t n);

// Each scanned unit's tokens and role (recallable, window, ignored). With
// `by_token` (the token stage scores the pool), the groups of the block
// straddling the window's start (ScoreRequest::straddle_tokens) are
// recallable rows of their tokens before the window (rows.straddle_block);
// else that block is the window's.
void ClassifyRows(const RecallView& view, const ScoreRequest& req,
                  bool by_token, MassRows* rows)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// [vector][head]: what attention reads besides the candidates for the
// `vectors` query vectors at `query`: window_lse when the front end sent it
// (non-empty), else the open block as its mean key stands for it (the
// sealed blocks in the window are then kWindow rows).
std::vector<float> WindowLse(const RecallView& view, const float* query,
                             uint32_t vectors,
                             const std::vector<float>& window_lse)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// [head]: the window as whole blocks, for one vector at `query`: each block
// from `first` on by its mean key (its summary) and its tokens in the
// window (the straddling block's after `straddle_tokens`), then the open
// block by its mean. A full block waiting for its seal (seal_after_ack) is
// the same term before and after the seal (its summary is the open block's
// mean, engine/stream/summary_builder.h), so a recall that does not wait
// for the seal gets the floats it would get after it.
std::vector<float> WindowBlocksLse(const RecallView& view, const float* query,
                                   size_t first, uint32_t straddle_tokens)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_MASS_ROWS_H_
