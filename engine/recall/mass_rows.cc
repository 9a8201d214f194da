#include "engine/recall/mass_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "base/thread_scratch.h"
#include "engine/index/dot.h"

namespace kvmem {

namespace {

struct ClassifyScratch {
  std::vector<uint32_t> before, straddling;
};

// With `by_token` and a block straddling the window's start: that block
// (else UINT64_MAX), and its tokens before the window per group into
// *before (a group's tokens are in append order in its run: these are its
// first).
uint64_t StraddleBefore(const RecallView& view, const ScoreRequest& req,
                        bool by_token, std::vector<uint32_t>* before)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  if (!by_token || req.straddle_tokens == 0) return UINT64_MAX;
  before->assign(view.units_per_block(), 0);
  const std::vector<uint8_t>& group =
      view.blocks()[req.eligible].rec.token_group;
  for (uint32_t t = 0; t < req.straddle_tokens; ++t) ++(*before)[group[t]];
  return req.eligible;
}

}  // namespace

void ClassifyRows(const RecallView& view, const ScoreRequest& req,
                  bool by_token, MassRows* rows) {
  const size_t n = rows->ids().size();
  const uint32_t shift = view.unit_shift();
  rows->tokens.resize(n);
  rows->role.resize(n);
  rows->counted.resize(n);
  rows->recallable.resize(n);
  const bool front_window = !req.query->window_lse.empty();
  ClassifyScratch& scratch = ThreadScratch<ClassifyScratch>();
  std::vector<uint32_t>& before = scratch.before;
  rows->straddle_block = StraddleBefore(view, req, by_token, &before);
  // Raw pointers: a store through role (one byte) may alias anything, so
  // through the vectors every row reloaded their data pointers.
  const uint64_t* ids = rows->ids().data();
  uint32_t* out_tokens = rows->tokens.data();
  CandidateRole* out_role = rows->role.data();
  const uint32_t* before_tokens = before.data();
  const uint64_t eligible = req.eligible, straddle = rows->straddle_block;
  const uint64_t first = view.blocks().first();
  const uint32_t per_block = view.units_per_block();
  const uint32_t* unit_tokens = view.BlockUnitTokens(first);
  const CandidateRole held =
      front_window ? CandidateRole::kIgnore : CandidateRole::kWindow;
  // The straddling block's recallable rows: their tokens in the window
  // count in the normaliser as the window's do, when the front end sent
  // no window_lse.
  std::vector<uint32_t>& straddling = scratch.straddling;
  straddling.clear();
  // Two loops: this one gathers (scalar); the next derives the floats (it
  // vectorises), so this one makes two stores a row, not four.
  // Ungrouped with no straddling block (unit id = block id): half the
  // instructions a row, which is what this loop is bound by.
  const bool plain = shift == 0 && straddle == UINT64_MAX;
  for (size_t i = 0; plain && i < n; ++i) {
    const bool recall = ids[i] < eligible;
    out_tokens[i] = unit_tokens[ids[i] - first];
    out_role[i] = recall ? CandidateRole::kRecall : held;
  }
  for (size_t i = 0; !plain && i < n; ++i) {
    const uint64_t b = ids[i] >> shift;
    const uint32_t g = GroupOf(ids[i], shift);
    const uint32_t tokens = unit_tokens[(b - first) * per_block + g];
    uint32_t cold = b < eligible ? tokens : 0;
    if (b == straddle) {
      cold = before_tokens[g];
      if (cold > 0) straddling.push_back(static_cast<uint32_t>(i));
    }
    const bool recall = b < eligible || cold > 0;
    out_tokens[i] = recall ? cold : tokens;
    out_role[i] = recall ? CandidateRole::kRecall : held;
  }
  float* out_counted = rows->counted.data();
  float* out_recallable = rows->recallable.data();
  for (size_t i = 0; i < n; ++i) {
    const bool recall = out_role[i] == CandidateRole::kRecall;
    const float tokens = static_cast<float>(out_tokens[i]);
    // With window_lse, only recallable tokens count (the front end's
    // window is in it).
    out_counted[i] = front_window && !recall ? 0.0f : tokens;
    out_recallable[i] = recall ? 1.0f : 0.0f;
  }
  if (!front_window) {
    for (uint32_t i : straddling) {
      const uint64_t b = ids[i] >> shift;
      out_counted[i] = static_cast<float>(
          unit_tokens[(b - first) * per_block + GroupOf(ids[i], shift)]);
    }
  }
  rows->exact = true;
  for (const SegmentScan& s : rows->scans) rows->exact &= s.exact;
}

double ColdMassScalar(const float* density, const float* recallable,
                      const uint32_t* tokens, size_t n) {
  double cold[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (size_t k = 0; k < 4; ++k) {
      cold[k] +=
          recallable[i + k] > 0 ? double(density[i + k]) * tokens[i + k] : 0.0;
    }
  }
  for (; i < n; ++i) {
    cold[0] += recallable[i] > 0 ? double(density[i]) * tokens[i] : 0.0;
  }
  return (cold[0] + cold[1]) + (cold[2] + cold[3]);
}

double ColdMass(const float* density, const float* recallable,
                const uint32_t* tokens, size_t n) {
#if defined(__SSE2__)
  // Lanes: sums 0 and 1 in `lo`, 2 and 3 in `hi`. A uint32 t becomes the
  // double 2^52 + t by its bits, less 2^52: exactly t. Rows not recallable
  // add +0.0 (the mask clears the product, NaN or not), as the scalar's 0.0.
  const __m128i magic = _mm_set1_epi32(0x43300000);
  const __m128d two52 = _mm_set1_pd(4503599627370496.0);
  const __m128 zero = _mm_setzero_ps();
  __m128d lo = _mm_setzero_pd(), hi = _mm_setzero_pd();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 d = _mm_loadu_ps(density + i);
    const __m128 on = _mm_cmpgt_ps(_mm_loadu_ps(recallable + i), zero);
    const __m128i t =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(tokens + i));
    const __m128d t_lo =
        _mm_sub_pd(_mm_castsi128_pd(_mm_unpacklo_epi32(t, magic)), two52);
    const __m128d t_hi =
        _mm_sub_pd(_mm_castsi128_pd(_mm_unpackhi_epi32(t, magic)), two52);
    const __m128d d_lo = _mm_cvtps_pd(d);
    const __m128d d_hi = _mm_cvtps_pd(_mm_movehl_ps(d, d));
    const __m128d on_lo = _mm_castps_pd(_mm_unpacklo_ps(on, on));
    const __m128d on_hi = _mm_castps_pd(_mm_unpackhi_ps(on, on));
    lo = _mm_add_pd(lo, _mm_and_pd(_mm_mul_pd(d_lo, t_lo), on_lo));
    hi = _mm_add_pd(hi, _mm_and_pd(_mm_mul_pd(d_hi, t_hi), on_hi));
  }
  double cold[4];
  _mm_storeu_pd(cold, lo);
  _mm_storeu_pd(cold + 2, hi);
  for (; i < n; ++i) {
    cold[0] += recallable[i] > 0 ? double(density[i]) * tokens[i] : 0.0;
  }
  return (cold[0] + cold[1]) + (cold[2] + cold[3]);
#else
  return ColdMassScalar(density, recallable, tokens, n);
#endif
}

std::vector<float> WindowLse(const RecallView& view, const float* query,
                             uint32_t vectors,
                             const std::vector<float>& window_lse) {
  if (!window_lse.empty()) return window_lse;
  const uint32_t dim = view.summary_dim();
  const uint32_t hd = view.config().geometry.head_dim, heads = dim / hd;
  std::vector<float> window(static_cast<size_t>(vectors) * heads,
                            -std::numeric_limits<float>::infinity());
  const OpenMean& open = view.open_mean();
  if (open.tokens == 0) return window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float log_tokens = std::log(static_cast<float>(open.tokens));
  for (uint32_t j = 0; j < vectors; ++j) {
    const float* qj = query + static_cast<size_t>(j) * dim;
    for (uint32_t h = 0; h < heads; ++h) {
      window[j * heads + h] =
          log_tokens + scale * Dot(qj + h * hd, open.mean.data() + h * hd, hd);
    }
  }
  return window;
}

std::vector<float> WindowBlocksLse(const RecallView& view, const float* query,
                                   size_t first, uint32_t straddle_tokens) {
  const uint32_t dim = view.summary_dim();
  const uint32_t hd = view.config().geometry.head_dim, heads = dim / hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  struct Term {
    float log_tokens;
    const float* mean;
  };
  std::vector<Term> terms;
  const BlockTable& blocks = view.blocks();
  for (size_t b = std::max<size_t>(first, blocks.first()); b < blocks.size();
       ++b) {
    const BlockRecord& r = blocks[b].rec;
    uint32_t tokens = r.info.token_count;
    if (b == first) tokens -= std::min(tokens, straddle_tokens);
    if (tokens == 0 || r.summary.size() != dim) continue;
    terms.push_back({std::log(static_cast<float>(tokens)), r.summary.data()});
  }
  const OpenMean& open = view.open_mean();
  if (open.tokens > 0 && open.mean.size() == dim) {
    terms.push_back(
        {std::log(static_cast<float>(open.tokens)), open.mean.data()});
  }
  std::vector<float> out(heads, -std::numeric_limits<float>::infinity());
  std::vector<float> logit(terms.size());
  for (uint32_t h = 0; h < heads && !terms.empty(); ++h) {
    float mx = -std::numeric_limits<float>::infinity();
    for (size_t k = 0; k < terms.size(); ++k) {
      logit[k] = terms[k].log_tokens +
                 scale * Dot(query + h * hd, terms[k].mean + h * hd, hd);
      mx = std::max(mx, logit[k]);
    }
    double sum = 0;
    for (float l : logit) sum += std::exp(static_cast<double>(l - mx));
    out[h] = mx + static_cast<float>(std::log(sum));
  }
  return out;
}

}  // namespace kvmem
