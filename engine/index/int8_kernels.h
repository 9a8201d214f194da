// Int8 scoring kernels for the progressive search's first stage.
//
// Layout ("packed"): vectors in blocks of kLanes = 8; a block stores, for
// each group of 4 dimensions, the 8 vectors' 4 codes (32 bytes), so one AVX2
// multiply-add scores 4 dimensions of 8 vectors and the 8 sums stay in the 8
// lanes of one register (no horizontal sums). Codes are stored offset by
// 128 (uint8 = int8 code + 128, codes in [-127, 127]).
//
// The query is a 13-bit integer vector d = 64 * hi + lo split into two int8
// vectors, hi in [-63, 63] and lo in [-32, 32] (a u8 x s7 pair of products,
// <= 2 * 255 * 63 = 32130, never saturates the 16-bit multiply-add), or
// d = hi alone (lo null: summaries wider than kMaxTwoTermDim, where the
// 13-bit sums could overflow int32). The kernel returns
//   raw[i] = sum_j (c_ij + 128) * d_j   (exact, int32)
// and the caller subtracts 128 * sum_j d_j. A selector then turns the sums
// into error bounds and keeps the vectors that can still reach the top-k,
// in one pass that rarely leaves SIMD registers.
//
// Kernels: "avx512vnni" (vpdpbusd: two groups of 8 vectors per 64-byte
// load, the query's terms accumulated apart) when the CPU has AVX-512 VNNI,
// "avx2" (vpmaddubsw + vpmaddwd) when it has AVX2, and "scalar" everywhere;
// all return the same integers (tests/engine/index/int8_kernels_test.cc
// checks every kernel the CPU can run). The selector is AVX2's in both.
#ifndef KVMEM_ENGINE_INDEX_INT8_KERNELS_H_
#define KVMEM_ENGINE_INDEX_INT8_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvmem {

constexpr size_t kInt8Lanes = 8;
constexpr int kQueryHiWeight = 64;
// 255 * (64 * 63 + 32) * 2056 < 2^31.
constexpr size_t kMaxTwoTermDim = 2056;
// Below this, searches use d = hi alone (progressive_search.cc says why).
constexpr size_t kTwoTermMinDim = 512;

// Scores nblocks packed blocks of `groups` 4-dimension groups against the
// query d = 64 * hi + lo (or hi alone when lo is null; each groups * 4
// int8 values); writes nblocks * 8 raw sums to out.
using Int8BlockKernel = void (*)(const uint8_t* packed, size_t nblocks,
                                 size_t groups, const int8_t* hi,
                                 const int8_t* lo, int32_t* out);

// The first stage's bounds (progressive_search.h), per vector i < n:
//   approx = (t * scale[i]) * float(raw[i] - offset)
//   bound = qnorm * enorm[i] + fnorm * cnorm[i] + 1e-4 * |approx|
//   lower = approx - bound;  upper = approx + bound
struct BoundInputs {
  const int32_t* raw = nullptr;
  const float* scale = nullptr;
  const float* enorm = nullptr;
  const float* cnorm = nullptr;
  size_t n = 0;
  float t = 0, qnorm = 0, fnorm = 0;
  int32_t offset = 0;
};
struct Survivor {
  uint32_t row;
  float upper;
};
// Per-thread scratch of a selector.
struct SelectScratch {
  std::vector<uint32_t> row;
  std::vector<float> lower, upper, tmp;
};
// One pass over the bounds: theta = the k-th largest lower bound (1 <= k
// <= n) is returned, and *out receives every row whose upper bound is >=
// theta (in row order). Vectors whose upper bound reaches the running
// threshold are appended to a pending list without branches (AVX2:
// left-packed through a permutation table); when the list grows, theta is
// recomputed from it (the k-th largest pending lower bound) and the list
// pruned. theta only rises, and every dropped vector was below it.
using SurvivorSelector = float (*)(const BoundInputs& in, uint32_t k,
                                   SelectScratch* scratch,
                                   std::vector<Survivor>* out);

// Per-segment scores (per-head recall, progressive_search.h): the groups of
// each packed block split into `segments` runs of seg_groups groups (one per
// KV head of each indexed layer); writes nblocks * segments * 8 raw sums,
// out[(block * segments + s) * 8 + lane], each the raw sum of Int8BlockKernel
// restricted to segment s, against the query d = 64 * hi + lo (or hi alone
// when lo is null).
using Int8SegmentKernel = void (*)(const uint8_t* packed, size_t nblocks,
                                   size_t seg_groups, size_t segments,
                                   const int8_t* hi, const int8_t* lo,
                                   int32_t* out);

// The segment kernel for `vectors` queries at once: query j is hi[j] (and
// lo[j]; lo null: hi alone for every query), its sums into out[j] as
// Int8SegmentKernel's: the same integers as one call per query. The VNNI
// kernel scores a tile of blocks for every query before the next tile, so
// the codes come from memory once per scan of all the queries, not once per
// query; the others make one call per query.
using Int8MultiSegmentKernel = void (*)(const uint8_t* packed, size_t nblocks,
                                        size_t seg_groups, size_t segments,
                                        size_t vectors, const int8_t* const* hi,
                                        const int8_t* const* lo,
                                        int32_t* const* out);

struct Int8KernelInfo {
  std::string name;
  Int8BlockKernel fn;
  SurvivorSelector select;
  Int8SegmentKernel segments;
  Int8MultiSegmentKernel multi_segments;
};

// Kernels this CPU can run, best first ("avx512vnni", "avx2" when present,
// "scalar").
const std::vector<Int8KernelInfo>& AvailableInt8Kernels();
// The kernel searches use: the best available, unless overridden.
const Int8KernelInfo& ActiveInt8Kernel();
// Overrides the kernel by name (tests, benchmarks); false when unknown or
// unavailable here.
bool SelectInt8Kernel(const std::string& name);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_INT8_KERNELS_H_
