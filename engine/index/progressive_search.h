// ProgressiveIndex: exact top-k inner-product search over summaries in two
// precision stages, the CPU form of V-Rex's bit-level / early-exit scoring.
//
// Stage 1 scores every vector in int8 (vector i = s_i * c_i + e_i with a
// per-vector scale s_i = max|x_i| / 127; the query q = t * d + f with
// t = max|q| / 63, 7 bits, so the AVX2 kernel cannot saturate; from dim 512
// t = max|q| / (63 * 64), 13 bits fed to the kernel as two 7-bit halves in
// the same pass over the codes; see int8_kernels.h) with an integer dot
// product, and bounds the error of
// each score exactly (Cauchy-Schwarz on the two rounding residuals):
//   q.x_i - t s_i (d.c_i) = q.e_i + s_i (f.c_i)
//   |q.x_i - t s_i (d.c_i)| <= |q| |e_i| + |f| s_i |c_i|
// with |e_i| and s_i |c_i| kept per vector and |q|, |f| per query. Let
// theta be the k-th largest lower bound: every vector whose upper bound is
// below theta cannot be in the top-k, so stage 2 rescores only the others
// in fp32 and returns the exact top-k (the same set as a flat exact search,
// ties aside). When more than max_candidates survive, stage 2 keeps the
// max_candidates best upper bounds and the answer is flagged as not
// guaranteed exact.
//
// The codes are packed for the kernel (8 vectors per block, 4 dimensions
// per group); scoring runs on the best kernel the CPU has
// (ActiveInt8Kernel), every kernel giving the same integers.
//
// Thread safety: Search may run concurrently with other Search calls; Add
// and Remove need exclusive access. Grow only reads (it may run beside
// searches, under a reader's lock); Adopt needs exclusive access.
#ifndef KVMEM_ENGINE_INDEX_PROGRESSIVE_SEARCH_H_
#define KVMEM_ENGINE_INDEX_PROGRESSIVE_SEARCH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/index/block_index.h"
#include "engine/index/int8_kernels.h"
#include "engine/index/row_chunks.h"

namespace kvmem {

struct ProgressiveStats {
  uint32_t scanned = 0;     // Vectors scored at int8.
  uint32_t candidates = 0;  // Vectors rescored at fp32.
  bool exact = true;        // The bound held within max_candidates.
};

// Segments (per-head scoring, BlockIndex::ScanSegments): with segment_dim a
// multiple of 4, each segment is a run of whole 4-dimension groups, so the
// segment kernel scores every segment of every vector in the same pass over
// the same codes. The query is quantised per segment (13 bits, its own unit
// t_h), and each vector keeps the norms of its residual and codes per
// segment, so every segment's score has its own proven bound:
//   |q_h.x_ih - t_h s_i (d_h.c_ih)| <= |q_h| |e_ih| + |f_h| s_i |c_ih|.
class ProgressiveIndex {
 public:
  // max_candidates: at most this many vectors rescored at full precision
  // (0: no cap, always exact). segment_dim (0: dim) must divide dim.
  explicit ProgressiveIndex(uint32_t dim, uint32_t max_candidates = 0,
                            uint32_t segment_dim = 0);

  void Add(uint64_t id, const float* vec);
  // Room for n vectors in all, so adds up to n copy nothing already held
  // (a recovery adds every block's summaries at once).
  void Reserve(size_t n);
  bool Remove(uint64_t id);

  // Growth without a copy under the writer's lock. Adding past the arrays'
  // capacity copies every code held (a vector's doubling), and adds run
  // under the stream's exclusive lock, which every recall of it waits for.
  // Grow makes the room for `extra` more vectors while searches go on: new
  // chunks for the fp32 rows (which never move: at 7B's summary width they
  // are four fifths of the index, and copying them at every doubling was a
  // tenth of a two-camera server's time) and, when the codes' arrays are
  // full, copies of them with room (at least twice the size, as a vector
  // grows); Adopt takes them in, O(1), unless the index changed in between
  // (then adds grow in place as before). Null when the room is there
  // already. Either way the pages the next `extra` adds write are faulted
  // in here, not under the lock (a 7B unit is 160 KiB of fresh pages).
  struct Growth;
  std::unique_ptr<Growth> Grow(size_t extra) const;
  // True when *g was made by Grow of this index in its present state: the
  // arrays are swapped, and *g holds the old ones, for the caller to free
  // once it has let go of its lock. False, nothing changed, otherwise.
  bool Adopt(Growth* g);
  // Vectors copied by adds that outgrew the arrays (not by Adopt's grown
  // ones): what a writer's lock was held for beyond the adds themselves.
  uint64_t copied_in_place() const { return copied_in_place_; }
  // RAM the arrays hold (their capacity) and the id map, roughly.
  uint64_t memory_bytes() const;

  std::vector<ScoredId> Search(const float* query, uint32_t k,
                               ProgressiveStats* stats = nullptr) const;
  // Every vector's score per segment (int8 with bounds, or without them
  // and with a one-term query for ScanMode::kRank; exact fp32 when
  // segment_dim is not a multiple of 4).
  void ScanSegments(const float* query, SegmentScan* out,
                    ScanMode mode = ScanMode::kProof) const;
  // The same for `vectors` queries into out[0, vectors), the codes read
  // once for all of them (Int8MultiSegmentKernel): the same values.
  void ScanSegments(const float* queries, size_t vectors, SegmentScan* out,
                    ScanMode mode = ScanMode::kProof) const;

  uint32_t dim() const { return dim_; }
  uint64_t size() const { return ids_.size(); }

 private:
  uint8_t* Lane(size_t row, size_t group) {
    return packed_.data() +
           ((row / kInt8Lanes) * groups_ + group) * 4 * kInt8Lanes +
           (row % kInt8Lanes) * 4;
  }

  uint32_t dim_;
  uint32_t groups_;  // ceil(dim / 4).
  uint32_t max_candidates_;
  uint32_t segment_dim_, segments_;
  std::vector<uint64_t> ids_;
  RowChunks full_;               // [n][dim], rows that never move
  std::vector<uint8_t> packed_;  // Codes + 128, packed (int8_kernels.h).
  std::vector<float> scale_;     // s_i
  std::vector<float> enorm_;     // |e_i|, the rounding residual's norm
  std::vector<float> cnorm_;     // s_i |c_i|
  std::vector<std::vector<float>> seg_enorm_;  // [segment][row] |e_ih|
  std::vector<std::vector<float>> seg_cnorm_;  // [segment][row] s_i |c_ih|
  std::unordered_map<uint64_t, size_t> row_;   // id -> row
  // Bumped by every change of the arrays (Add, Remove, Reserve, Adopt).
  uint64_t version_ = 0;
  uint64_t copied_in_place_ = 0;
};

struct ProgressiveIndex::Growth {
  uint64_t version = 0;  // The index's when grown.
  // The fp32 rows' new chunks (the rows held are not copied).
  std::vector<RowChunks::Chunk> full;
  // The other arrays, copied with room, when `arrays`.
  bool arrays = false;
  std::vector<uint64_t> ids;
  std::vector<uint8_t> packed;
  std::vector<float> scale, enorm, cnorm;
  std::vector<std::vector<float>> seg_enorm, seg_cnorm;
  std::unordered_map<uint64_t, size_t> row;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_PROGRESSIVE_SEARCH_H_
