// BlockIndex: the per-stream vector index over block (or token-group)
// summaries, the `cpu` retrieval backend. Its kind comes from the stream's
// index_factory:
//   "Flat"         exact inner product (FAISS IndexFlatIP under IndexIDMap2).
//   "Progressive"  exact: int8 scoring with a proven error bound, fp32
//                  rescoring of the survivors (progressive_search.h).
//   approximate    FAISS indexes with inner-product metric, from an
//                  allow-list (anything else is INVALID_ARGUMENT, because
//                  FAISS accepts descriptions it then crashes on, e.g. NSG
//                  with SIGFPE at its first build):
//                    HNSW<M> or HNSW<M>,Flat   4 <= M <= 64
//                    SQ4, SQ6, SQ8, SQfp16     scalar quantizers
//                    PQ<m>[x<bits>]            m divides every index dim,
//                                              1 <= bits <= 8 (default 8)
//                    IVF<n>,<Flat|SQ..|PQ..>   1 <= n <= 1024
//                  Centroids and codebooks of a stream's indexes are at
//                  most kMaxFixedIndexBytes, and a new config's indexes are
//                  probe-built (64 vectors, as the first build) before it is
//                  accepted, every exception an answer.
//                  Search is exact until 64 vectors are in (or enough to
//                  train on); then the FAISS index is built from a copy of the
//                  vectors and grows by incremental adds. Removed vectors are
//                  tombstones filtered out of its answers (HNSW cannot delete)
//                  until they are an eighth of it, when it is rebuilt; kinds
//                  that train (IVF, SQ) are retrained each time the vectors
//                  double. IVF indexes probe a quarter of their lists.
// Approximate kinds sample their quality: every 16th search is also answered
// exactly and recall@k (overlap of the two top-k) is accumulated.
//
// Thread safety: Search may run concurrently with other Search calls; Add and
// Remove must not run concurrently with anything (the owning Stream's writer
// lock ensures it). FAISS is pinned to one OpenMP thread per calling thread:
// a single-query scan is far below the size where threads pay off, and a
// server must not oversubscribe its cores.
#ifndef KVMEM_ENGINE_INDEX_BLOCK_INDEX_H_
#define KVMEM_ENGINE_INDEX_BLOCK_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvmem {

struct ScoredId {
  uint64_t id;
  float score;
};

// Inner products of one query with every vector of an index, per segment:
// vectors and query split into equal runs of segment_dim floats (one per KV
// head of each indexed layer), the score of a vector per segment. The
// per-head recall scoring (engine/recall/mass_estimate.h) reads these.
struct SegmentScan {
  uint32_t segments = 0;
  std::vector<uint64_t> ids;  // The index's vectors, in its own order.
  // [segment][vector]: head-major, so loops over the vectors vectorise.
  std::vector<float> dots;
  bool exact = true;  // The dots are exact (else int8 estimates).
  // [vector]: every dot of vector i lies within bound[i] of its exact value;
  // empty when the dots are exact or the scan was ScanMode::kRank.
  std::vector<float> bound;
};

// What a scan's caller needs of it ("Progressive"; the exact kinds ignore
// it). kProof: every vector's dots with a proven bound, the query at 13
// bits. kRank: dots to rank and sum by, no bounds, the query at 7 bits (one
// term: half the multiply-adds), for callers that prove nothing from the
// scan (the token stage, whose tokens decide).
enum class ScanMode : uint8_t { kProof = 0, kRank = 1 };

// Recall@k of an approximate index against exact search, sampled.
struct IndexQuality {
  uint64_t samples = 0;  // Searches checked against exact.
  uint64_t hits = 0;     // Exact top-k ids the index also returned.
  uint64_t wanted = 0;   // Exact top-k ids in all.
  double recall() const {
    return wanted == 0 ? 1.0 : static_cast<double>(hits) / wanted;
  }
};

class BlockIndex {
 public:
  // Centroid and codebook bytes a stream's approximate indexes may hold.
  static constexpr uint64_t kMaxFixedIndexBytes = 64ull << 20;

  // INVALID_ARGUMENT naming the factory when it is not "Flat",
  // "Progressive" or an allowed FAISS kind (see above) that builds at every
  // dimension in dims (the dimensions of all of one stream's indexes).
  static absl::Status ValidateFactory(const std::string& factory,
                                      const std::vector<uint32_t>& dims);
  // True for kinds that always return the exact top-k.
  static bool IsExact(const std::string& factory);

  // REQUIRES: dim > 0 and ValidateFactory(factory, {dim, ...}) is OK;
  // segment_dim (0: dim) divides dim.
  explicit BlockIndex(uint32_t dim, const std::string& factory = "Flat",
                      uint32_t segment_dim = 0);
  ~BlockIndex();
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // Adds one summary of dim() floats under id.
  void Add(uint64_t id, const float* summary);
  // Room for n vectors in all (kinds without a use for it ignore it).
  void Reserve(size_t n);
  // Removes id; false when it was not there.
  bool Remove(uint64_t id);
  // Room for `extra` more vectors made beside searches (under a reader's
  // lock) and adopted under the writer's in O(1) ("Progressive":
  // ProgressiveIndex::Grow). Null when there is room already or the kind
  // grows in place ("Flat", FAISS kinds).
  class Growth {
   public:
    virtual ~Growth() = default;
  };
  std::unique_ptr<Growth> Grow(size_t extra) const;
  // True when g, from this index's Grow with nothing changed since, was
  // swapped in: g then holds the old arrays, to be freed off the lock.
  bool Adopt(Growth* g);
  // Vectors copied by adds that outgrew their arrays under the writer's
  // lock (ProgressiveIndex::copied_in_place; 0 for the other kinds).
  uint64_t copied_in_place() const;
  // RAM the index holds: its vectors (and codes), ids; FAISS's built
  // structures beyond its vectors are not counted.
  uint64_t memory_bytes() const;

  // Returns up to k ids with the highest inner product with query (dim()
  // floats), best first.
  std::vector<ScoredId> Search(const float* query, uint32_t k) const;

  // Scores query (dim() floats) against every vector, per segment of
  // segment_dim() floats: exact for "Flat", int8 with a proven bound for
  // "Progressive" (its first stage, run per segment; exact fp32 when
  // segment_dim is not a multiple of 4). Returns false, writing nothing, for
  // FAISS approximate kinds, which cannot score every vector cheaply.
  bool ScanSegments(const float* query, SegmentScan* out,
                    ScanMode mode = ScanMode::kProof) const;
  // The same for `vectors` queries (vectors * dim() floats) into out[0,
  // vectors): the same values as one call per query ("Progressive": one
  // pass over the codes for all of them).
  bool ScanSegments(const float* queries, size_t vectors, SegmentScan* out,
                    ScanMode mode = ScanMode::kProof) const;
  uint32_t segment_dim() const { return segment_dim_; }

  uint32_t dim() const { return dim_; }
  uint64_t size() const;
  const std::string& factory() const { return factory_; }
  IndexQuality quality() const;

  class Impl;

 private:
  uint32_t dim_;
  uint32_t segment_dim_;
  std::string factory_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_BLOCK_INDEX_H_
