#include "engine/index/progressive_search.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "base/thread_scratch.h"
#include "engine/index/dot.h"
#include "engine/index/query_codes.h"

namespace kvmem {
namespace {

// The raw sums one chunk of a multi-vector segment scan keeps (int32s over
// all its vectors: 64 KiB, within L2 beside the codes).
constexpr size_t kRawChunkInts = size_t{16} << 10;

// n rows rounded up to whole blocks of kInt8Lanes (the packed codes' unit).
size_t LaneRows(size_t n) {
  return (n + kInt8Lanes - 1) / kInt8Lanes * kInt8Lanes;
}

// Symmetric quantisation to [-levels, levels]; returns the scale (0 for a
// zero vector), the residual's norm |x - s c| in *residual and the codes'
// norm |c| in *code_norm (both computed in double, then rounded up a
// little so the bounds built from them stay safe).
float Quantize(const float* x, size_t n, int levels, int8_t* out,
               float* residual, float* code_norm) {
  const float s = SymmetricCodes(x, n, levels, out);
  double r2 = 0, c2 = 0;
  AddCodeNorms(x, out, s, n, &r2, &c2);
  *residual = static_cast<float>(std::sqrt(r2) * (1 + 1e-6));
  *code_norm = static_cast<float>(std::sqrt(c2) * (1 + 1e-6));
  return s;
}

// Per-thread buffers, so a search allocates nothing once warm.
struct Scratch {
  std::vector<int8_t> query, query_lo;
  std::vector<int32_t> raw;
  SelectScratch select;
  std::vector<Survivor> cand;
};

// Norms of the residual x - s c and of the codes c over [begin, end),
// rounded up a little like Quantize's.
void SegmentNorms(const float* x, const int8_t* c, float s, size_t begin,
                  size_t end, float* residual, float* code_norm) {
  double r2 = 0, c2 = 0;
  AddCodeNorms(x + begin, c + begin, s, end - begin, &r2, &c2);
  *residual = static_cast<float>(std::sqrt(r2) * (1 + 1e-6));
  *code_norm = static_cast<float>(std::sqrt(c2) * (1 + 1e-6));
}

// The segment scan's scores and bounds for rows [first, first + count) from
// the kernel's raw sums of their blocks (raw[(block * S + h) * 8 + lane],
// block 0 the one holding row `first`, a multiple of 8), segment by segment:
// dots [h][row] of n rows, bound[row] the largest over segments (bound null:
// the dots alone). Rows come in whole packed blocks of 8 (the tail apart), so
// each step is 8 lanes of independent arrays: AVX2 where the CPU has it (no
// FMA: the same floats as the default clone).
__attribute__((target_clones("avx2", "default"))) void SegmentBoundsPass(
    const float* t, const float* qnorm, const float* fnorm,
    const int32_t* offset, const int32_t* raw, size_t first, size_t count,
    size_t n, size_t S, const float* __restrict scale,
    const std::vector<std::vector<float>>& seg_enorm,
    const std::vector<std::vector<float>>& seg_cnorm, float* __restrict dots,
    float* __restrict bound) {
  const size_t full = count / kInt8Lanes;
  for (size_t h = 0; h < S; ++h) {
    float* __restrict d = dots + h * n + first;
    const float* __restrict sc = scale + first;
    const float th = t[h], qn = qnorm[h], fn = fnorm[h];
    const int32_t off = offset[h];
    const float* __restrict enorm = seg_enorm[h].data() + first;
    const float* __restrict cnorm = seg_cnorm[h].data() + first;
    float* __restrict bd = bound == nullptr ? nullptr : bound + first;
    const int32_t* __restrict r = raw + h * kInt8Lanes;
    if (bd == nullptr) {  // The dots alone.
      for (size_t b = 0; b <= full; ++b, r += S * kInt8Lanes) {
        const size_t i0 = b * kInt8Lanes;
        if (b < full) {
          for (size_t l = 0; l < kInt8Lanes; ++l) {
            d[i0 + l] = th * sc[i0 + l] * static_cast<float>(r[l] - off);
          }
          continue;
        }
        for (size_t l = 0; l < count - i0; ++l) {  // The tail.
          d[i0 + l] = th * sc[i0 + l] * static_cast<float>(r[l] - off);
        }
      }
      continue;
    }
    for (size_t b = 0; b <= full; ++b, r += S * kInt8Lanes) {
      const size_t i0 = b * kInt8Lanes;
      const size_t lanes = b < full ? kInt8Lanes : count - i0;
      if (lanes == kInt8Lanes) {
        for (size_t l = 0; l < kInt8Lanes; ++l) {
          const size_t i = i0 + l;
          const float approx = th * sc[i] * static_cast<float>(r[l] - off);
          d[i] = approx;
          bd[i] = std::max(
              bd[i], qn * enorm[i] + fn * cnorm[i] + 1e-4f * std::fabs(approx));
        }
        continue;
      }
      for (size_t l = 0; l < lanes; ++l) {  // The tail.
        const size_t i = i0 + l;
        const float approx = th * sc[i] * static_cast<float>(r[l] - off);
        d[i] = approx;
        bd[i] = std::max(
            bd[i], qn * enorm[i] + fn * cnorm[i] + 1e-4f * std::fabs(approx));
      }
    }
  }
}

// A multi-vector scan's per-thread scratch: each vector's query codes
// (hi, and lo for two terms), their scales and norms, and its raw sums.
struct ScanScratch {
  std::vector<int8_t> hi, lo;
  std::vector<int32_t> raw;
  std::vector<float> t, qnorm, fnorm;
  std::vector<int32_t> offset;
  std::vector<const int8_t*> hi_at, lo_at;
  std::vector<int32_t*> raw_at;
};

// Quantises each of `vectors` queries (dim floats apart) segment by
// segment into sc, with room for raw_ints raw sums a vector.
void PrepareScan(const float* queries, size_t vectors, size_t dim, size_t S,
                 size_t sd, size_t width, bool two_terms, size_t raw_ints,
                 ScanScratch* sc) {
  sc->hi.assign(vectors * width, 0);
  sc->lo.assign(two_terms ? vectors * width : 0, 0);
  sc->raw.resize(vectors * raw_ints);
  for (std::vector<float>* v : {&sc->t, &sc->qnorm, &sc->fnorm}) {
    v->resize(vectors * S);
  }
  sc->offset.resize(vectors * S);
  sc->hi_at.resize(vectors);
  sc->lo_at.resize(vectors);
  sc->raw_at.resize(vectors);
  for (size_t j = 0; j < vectors; ++j) {
    int8_t* hi = sc->hi.data() + j * width;
    int8_t* lo = two_terms ? sc->lo.data() + j * width : nullptr;
    for (size_t h = 0; h < S; ++h) {
      const QueryCode qc =
          QuantizeQuery(queries + j * dim + h * sd, sd, two_terms, hi + h * sd,
                        two_terms ? lo + h * sd : nullptr);
      sc->t[j * S + h] = qc.t;
      sc->offset[j * S + h] = qc.offset;
      sc->fnorm[j * S + h] = qc.residual;
      sc->qnorm[j * S + h] = qc.norm;
    }
    sc->hi_at[j] = hi;
    sc->lo_at[j] = lo;
    sc->raw_at[j] = sc->raw.data() + j * raw_ints;
  }
}

}  // namespace

ProgressiveIndex::ProgressiveIndex(uint32_t dim, uint32_t max_candidates,
                                   uint32_t segment_dim)
    : dim_(dim),
      groups_((dim + 3) / 4),
      max_candidates_(max_candidates),
      segment_dim_(segment_dim == 0 ? dim : segment_dim),
      segments_(dim / (segment_dim == 0 ? dim : segment_dim)),
      full_(dim),
      seg_enorm_(segments_),
      seg_cnorm_(segments_) {}

void ProgressiveIndex::Add(uint64_t id, const float* vec) {
  const size_t r = ids_.size();
  ++version_;
  // The codes' arrays reallocate (the fp32 rows take a chunk, no copy).
  if (r == ids_.capacity() ||
      (r % kInt8Lanes == 0 &&
       packed_.size() + groups_ * 4 * kInt8Lanes > packed_.capacity())) {
    copied_in_place_ += r;
  }
  if (r >= full_.capacity()) full_.Reserve(r + 1);
  row_[id] = r;
  ids_.push_back(id);
  std::copy_n(vec, dim_, full_.row(r));
  if (r % kInt8Lanes == 0) {  // A new block; unused lanes hold code 0.
    packed_.resize(packed_.size() + groups_ * 4 * kInt8Lanes, 128);
    scale_.resize(scale_.size() + kInt8Lanes, 0.0f);
    enorm_.resize(enorm_.size() + kInt8Lanes, 0.0f);
    cnorm_.resize(cnorm_.size() + kInt8Lanes, 0.0f);
  }
  std::vector<int8_t> codes(groups_ * 4, 0);
  float residual = 0, code_norm = 0;
  const float s = Quantize(vec, dim_, 127, codes.data(), &residual, &code_norm);
  for (uint32_t g = 0; g < groups_; ++g) {
    uint8_t* lane = Lane(r, g);
    for (int j = 0; j < 4; ++j)
      lane[j] = static_cast<uint8_t>(codes[g * 4 + j] + 128);
  }
  scale_[r] = s;
  enorm_[r] = residual;
  cnorm_[r] = s * code_norm;
  for (uint32_t h = 0; h < segments_; ++h) {
    float e = 0, c = 0;
    SegmentNorms(vec, codes.data(), s, h * segment_dim_, (h + 1) * segment_dim_,
                 &e, &c);
    seg_enorm_[h].push_back(e);
    seg_cnorm_[h].push_back(s * c);
  }
}

void ProgressiveIndex::Reserve(size_t n) {
  ++version_;
  const size_t lanes = LaneRows(n);
  row_.reserve(n);
  ids_.reserve(n);
  full_.Reserve(n);
  packed_.reserve(lanes * groups_ * 4);
  scale_.reserve(lanes);
  enorm_.reserve(lanes);
  cnorm_.reserve(lanes);
  for (uint32_t h = 0; h < segments_; ++h) {
    seg_enorm_[h].reserve(n);
    seg_cnorm_[h].reserve(n);
  }
}

namespace {

// Faults in the pages of v's room for `more` elements past its size: no
// element is written, so readers of the live ones go on.
template <typename T>
void FaultInRoom(const std::vector<T>& v, size_t more) {
  const size_t n = std::min(v.capacity() - v.size(), more);
  if (n > 0) FaultInBytes(v.data() + v.size(), n * sizeof(T));
}

// A copy of v with room for `cap` elements.
template <typename T>
std::vector<T> Roomier(const std::vector<T>& v, size_t cap) {
  std::vector<T> out;
  out.reserve(std::max(cap, v.size()));
  out.assign(v.begin(), v.end());
  return out;
}

}  // namespace

std::unique_ptr<ProgressiveIndex::Growth> ProgressiveIndex::Grow(
    size_t extra) const {
  if (extra == 0) return nullptr;
  const size_t n = ids_.size() + extra;
  const size_t lanes = LaneRows(n);
  const bool room = ids_.capacity() >= n &&
                    packed_.capacity() >= lanes * groups_ * 4 &&
                    scale_.capacity() >= lanes;
  // The room the adds will write, faulted in here rather than under the
  // writer's lock (the summaries and their codes: the rest is small); new
  // chunks come faulted in.
  const size_t extra_codes = (extra + kInt8Lanes) * groups_ * 4;
  full_.FaultIn(ids_.size(), extra);
  std::vector<RowChunks::Chunk> chunks = full_.MakeRoom(n);
  if (room) {
    FaultInRoom(packed_, extra_codes);
    if (chunks.empty()) return nullptr;
  }
  auto g = std::make_unique<Growth>();
  g->version = version_;
  g->full = std::move(chunks);
  if (room) return g;
  // Twice the size at least, as a vector's own growth: the next adds find
  // room too.
  const size_t want = std::max(n, 2 * ids_.size());
  const size_t want_lanes = LaneRows(want);
  g->arrays = true;
  g->ids = Roomier(ids_, want);
  g->packed = Roomier(packed_, want_lanes * groups_ * 4);
  g->scale = Roomier(scale_, want_lanes);
  g->enorm = Roomier(enorm_, want_lanes);
  g->cnorm = Roomier(cnorm_, want_lanes);
  for (uint32_t h = 0; h < segments_; ++h) {
    g->seg_enorm.push_back(Roomier(seg_enorm_[h], want));
    g->seg_cnorm.push_back(Roomier(seg_cnorm_[h], want));
  }
  g->row.reserve(want);
  g->row.insert(row_.begin(), row_.end());
  FaultInRoom(g->packed, extra_codes);
  return g;
}

uint64_t ProgressiveIndex::memory_bytes() const {
  uint64_t n = ids_.capacity() * sizeof(uint64_t) + full_.bytes() +
               packed_.capacity() +
               (scale_.capacity() + enorm_.capacity() + cnorm_.capacity()) *
                   sizeof(float);
  for (uint32_t h = 0; h < segments_; ++h) {
    n += (seg_enorm_[h].capacity() + seg_cnorm_[h].capacity()) * sizeof(float);
  }
  // A node (key, value, next) and a bucket pointer per entry.
  return n + row_.size() * 32 + row_.bucket_count() * sizeof(void*);
}

bool ProgressiveIndex::Adopt(Growth* g) {
  if (g == nullptr || g->version != version_) return false;
  full_.Adopt(&g->full);
  if (g->arrays) {
    ids_.swap(g->ids);
    packed_.swap(g->packed);
    scale_.swap(g->scale);
    enorm_.swap(g->enorm);
    cnorm_.swap(g->cnorm);
    seg_enorm_.swap(g->seg_enorm);
    seg_cnorm_.swap(g->seg_cnorm);
    row_.swap(g->row);
  }
  ++version_;
  return true;
}

bool ProgressiveIndex::Remove(uint64_t id) {
  auto it = row_.find(id);
  if (it == row_.end()) return false;
  ++version_;
  const size_t r = it->second, last = ids_.size() - 1;
  row_.erase(it);
  if (r != last) {  // Move the last row into the hole.
    ids_[r] = ids_[last];
    std::copy_n(full_.row(last), dim_, full_.row(r));
    for (uint32_t g = 0; g < groups_; ++g)
      std::copy_n(Lane(last, g), 4, Lane(r, g));
    scale_[r] = scale_[last];
    enorm_[r] = enorm_[last];
    cnorm_[r] = cnorm_[last];
    for (uint32_t h = 0; h < segments_; ++h) {
      seg_enorm_[h][r] = seg_enorm_[h][last];
      seg_cnorm_[h][r] = seg_cnorm_[h][last];
    }
    row_[ids_[r]] = r;
  }
  for (uint32_t h = 0; h < segments_; ++h) {
    seg_enorm_[h].pop_back();
    seg_cnorm_[h].pop_back();
  }
  for (uint32_t g = 0; g < groups_; ++g) std::fill_n(Lane(last, g), 4, 128);
  scale_[last] = 0;
  enorm_[last] = 0;
  cnorm_[last] = 0;
  ids_.pop_back();
  full_.Trim(last);
  if (last % kInt8Lanes == 0) {  // The last block is empty now.
    packed_.resize(packed_.size() - groups_ * 4 * kInt8Lanes);
    scale_.resize(scale_.size() - kInt8Lanes);
    enorm_.resize(enorm_.size() - kInt8Lanes);
    cnorm_.resize(cnorm_.size() - kInt8Lanes);
  }
  return true;
}

std::vector<ScoredId> ProgressiveIndex::Search(const float* query, uint32_t k,
                                               ProgressiveStats* stats) const {
  std::vector<ScoredId> out;
  const size_t n = ids_.size();
  ProgressiveStats st;
  if (n == 0 || k == 0) {
    if (stats != nullptr) *stats = st;
    return out;
  }
  k = static_cast<uint32_t>(std::min<size_t>(k, n));
  Scratch& sc = ThreadScratch<Scratch>();
  const size_t nblocks = (n + kInt8Lanes - 1) / kInt8Lanes;
  // The 13-bit query's second multiply-add pass costs more than the fp32
  // rescoring it saves at dim 128 (kvmem bench: 79-90 vs 88-100 us p50,
  // 63 vs 26 rescored) and saves more at dim 1024 (1.2-1.5 vs 1.9-2.4 ms).
  const bool two_terms =
      groups_ * 4 >= kTwoTermMinDim && groups_ * 4 <= kMaxTwoTermDim;
  sc.query.assign(groups_ * 4, 0);
  sc.query_lo.assign(groups_ * 4, 0);
  const QueryCode qc = QuantizeQuery(query, dim_, two_terms, sc.query.data(),
                                     sc.query_lo.data());
  // Stage 1: int8 scores with their error bounds.
  sc.raw.resize(nblocks * kInt8Lanes);
  ActiveInt8Kernel().fn(packed_.data(), nblocks, groups_, sc.query.data(),
                        two_terms ? sc.query_lo.data() : nullptr,
                        sc.raw.data());
  BoundInputs in;
  in.raw = sc.raw.data();
  in.scale = scale_.data();
  in.enorm = enorm_.data();
  in.cnorm = cnorm_.data();
  in.n = n;
  in.t = qc.t;
  in.qnorm = qc.norm;
  in.fnorm = qc.residual;
  in.offset = qc.offset;
  ActiveInt8Kernel().select(in, k, &sc.select, &sc.cand);
  st.scanned = static_cast<uint32_t>(n);
  if (max_candidates_ > 0 && sc.cand.size() > max_candidates_) {
    std::nth_element(
        sc.cand.begin(), sc.cand.begin() + max_candidates_, sc.cand.end(),
        [](const Survivor& a, const Survivor& b) { return a.upper > b.upper; });
    sc.cand.resize(max_candidates_);
    st.exact = false;
  }
  st.candidates = static_cast<uint32_t>(sc.cand.size());
  // Stage 2: exact scores of the survivors; their rows are scattered over
  // the fp32 copy, so ask for all of them before reading any.
  for (const Survivor& c : sc.cand) {
    const char* row = reinterpret_cast<const char*>(full_.row(c.row));
    for (size_t b = 0; b < dim_ * sizeof(float); b += 64) {
      __builtin_prefetch(row + b);
    }
  }
  out.reserve(sc.cand.size());
  for (const Survivor& c : sc.cand) {
    out.push_back({ids_[c.row], Dot(query, full_.row(c.row), dim_)});
  }
  const size_t keep = std::min<size_t>(k, out.size());
  std::partial_sort(out.begin(), out.begin() + keep, out.end(),
                    [](const ScoredId& a, const ScoredId& b) {
                      return a.score != b.score ? a.score > b.score
                                                : a.id < b.id;
                    });
  out.resize(keep);
  if (stats != nullptr) *stats = st;
  return out;
}

void ProgressiveIndex::ScanSegments(const float* query, SegmentScan* out,
                                    ScanMode mode) const {
  ScanSegments(query, 1, out, mode);
}

void ProgressiveIndex::ScanSegments(const float* queries, size_t vectors,
                                    SegmentScan* outs, ScanMode mode) const {
  const size_t n = ids_.size(), S = segments_, sd = segment_dim_;
  for (size_t j = 0; j < vectors; ++j) {
    outs[j].segments = segments_;
    outs[j].ids = ids_;
    outs[j].dots.resize(n * S);
    outs[j].exact = sd % 4 != 0;
    outs[j].bound.clear();
  }
  if (n == 0) return;
  if (sd % 4 != 0) {  // Segments straddle the kernel's groups: fp32.
    for (size_t j = 0; j < vectors; ++j) {
      const float* query = queries + j * dim_;
      for (size_t i = 0; i < n; ++i) {
        for (size_t h = 0; h < S; ++h) {
          outs[j].dots[h * n + i] =
              Dot(query + h * sd, full_.row(i) + h * sd, sd);
        }
      }
    }
    return;
  }
  ScanScratch& sc = ThreadScratch<ScanScratch>();
  // 13-bit queries at every width for proofs: the mass estimate
  // exponentiates scores, so the query's rounding counts more than in a
  // top-k search (kvmem eval, 8 heads x 64 dims: 57 units rescored exactly
  // per recall against 94 with 7-bit queries, for 2 us more scanning). A
  // scan to rank by rescores nothing: 7 bits, half the multiply-adds.
  const bool proof = mode == ScanMode::kProof;
  const bool two_terms = proof && sd <= kMaxTwoTermDim;
  const size_t width = size_t{groups_} * 4;
  const size_t nblocks = (n + kInt8Lanes - 1) / kInt8Lanes;
  // Blocks in chunks whose raw sums (over all the vectors) stay in L2, each
  // chunk's sums made dots (and bounds) at once: the raw sums of a whole scan
  // of 8 vectors (8 x 123 KB at the evaluation's size) did not.
  const size_t block_raw = S * kInt8Lanes;
  const size_t chunk =
      std::max<size_t>(4, kRawChunkInts / (vectors * block_raw)) / 4 * 4;
  PrepareScan(queries, vectors, dim_, S, sd, width, two_terms,
              chunk * block_raw, &sc);
  for (size_t j = 0; proof && j < vectors; ++j) outs[j].bound.assign(n, 0.0f);
  const size_t block_bytes = size_t{groups_} * 4 * kInt8Lanes;
  for (size_t b0 = 0; b0 < nblocks; b0 += chunk) {
    const size_t nb = std::min(chunk, nblocks - b0);
    ActiveInt8Kernel().multi_segments(packed_.data() + b0 * block_bytes, nb,
                                      sd / 4, S, vectors, sc.hi_at.data(),
                                      two_terms ? sc.lo_at.data() : nullptr,
                                      sc.raw_at.data());
    const size_t first = b0 * kInt8Lanes;
    const size_t count = std::min(n - first, nb * kInt8Lanes);
    for (size_t j = 0; j < vectors; ++j) {
      SegmentScan& out = outs[j];
      SegmentBoundsPass(sc.t.data() + j * S, sc.qnorm.data() + j * S,
                        sc.fnorm.data() + j * S, sc.offset.data() + j * S,
                        sc.raw_at[j], first, count, n, S, scale_.data(),
                        seg_enorm_, seg_cnorm_, out.dots.data(),
                        proof ? out.bound.data() : nullptr);
    }
  }
}

}  // namespace kvmem
