// Whole-frame queries: a streaming model prefills each frame's 128-256
// query tokens against the cache (V-Rex's iterative prefill), and a front
// end may send them all in one recall. Scoring costs one pass per vector,
// so a query of more than kMaxScoredVectors vectors is first reduced to
// that many weighted representatives:
//
//   1. clusters: farthest-first seeds (the vector farthest from the mean,
//      then each time the vector farthest from every seed so far), then
//      kReductionRounds rounds of Lloyd's k-means in the vectors' full
//      space (squared Euclidean distance over every indexed layer and head);
//      deterministic, ties to the lower index;
//   2. each cluster's representative is its members' mean (its logit with
//      any key is the mean of theirs: exact for the linear part), its
//      weight its share of the vectors (MassInputs::weight), so the
//      estimated mass stays the mean over the original vectors;
//   3. with window_lse, a representative's is, per head, -ln(mean over its
//      members of exp(-window_lse)): exact where the window dominates each
//      member's normaliser, as it usually does.
//
// Within a cluster the members' logits spread around the mean's, and exp
// is convex, so a representative estimates a little less mass than its
// members would (the same direction of error as a group's mean key). The
// cost is about (kReductionRounds + 1) x n x kMaxScoredVectors x
// summary_dim multiply-adds: 128 vectors of 512 floats, ~3 M, well under
// 1 ms of one core (RecallTiming.reduce_us reports it). The query as a whole
// (engine/recall/identity_channel.h) is the mean of the original vectors.
//
// Pure functions, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_QUERY_REDUCTION_H_
#define KVMEM_ENGINE_RECALL_QUERY_REDUCTION_H_

#include <cstdint>
#include <vector>

namespace kvmem {

// Vectors scored in one recall; a query of more is reduced to this many.
// Measured (kvmem eval, whole-frame queries of 128 tokens per frame): 16
// representatives recall 0.407 of the cold mass where 64 recall 0.411, at
// 13 ms p99 instead of 43 (32-token frames, look-alikes: 0.640 from 16
// against 0.644 from all 32 vectors, at half the time).
inline constexpr uint32_t kMaxScoredVectors = 16;
// Lloyd rounds after seeding.
inline constexpr int kReductionRounds = 2;

struct ReducedQuery {
  std::vector<float> query;       // [representative][dim]
  std::vector<float> window_lse;  // [representative][head], or empty.
  std::vector<float> weight;      // [representative], summing to 1.
  std::vector<uint32_t> cluster;  // [original vector]: its representative.
};

// Reduces the n = query.size() / dim vectors (with window_lse: n x heads
// floats, or empty) to min(n, k) representatives. REQUIRES: k >= 1,
// query.size() a multiple of dim, values finite.
ReducedQuery ReduceQuery(const std::vector<float>& query,
                         const std::vector<float>& window_lse, uint32_t dim,
                         uint32_t heads, uint32_t k);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_QUERY_REDUCTION_H_
