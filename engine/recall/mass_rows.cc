#include "engine/recall/mass_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/thread_scratch.h"
#include "engine/index/dot.h"

namespace kvmem {

void ClassifyRows(const RecallView& view, const ScoreRequest& req,
                  bool by_token, MassRows* rows) {
  const size_t n = rows->ids().size();
  const uint32_t shift = view.unit_shift();
  rows->tokens.resize(n);
  rows->role.resize(n);
  rows->counted.resize(n);
  rows->recallable.resize(n);
  const bool front_window = !req.query->window_lse.empty();
  // The straddling block's tokens before the window, per group (a group's
  // tokens are in append order in its run: these are its first).
  struct Scratch {
    std::vector<uint32_t> before;
  };
  std::vector<uint32_t>& before = ThreadScratch<Scratch>().before;
  rows->straddle_block = UINT64_MAX;
  if (by_token && req.straddle_tokens > 0) {
    rows->straddle_block = req.eligible;
    before.assign(view.units_per_block(), 0);
    const std::vector<uint8_t>& group =
        view.blocks()[req.eligible].rec.token_group;
    for (uint32_t t = 0; t < req.straddle_tokens; ++t) ++before[group[t]];
  }
  const uint64_t* ids = rows->ids().data();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t b = ids[i] >> shift;
    const uint32_t tokens = view.UnitTokens(b, GroupOf(ids[i], shift));
    const uint32_t cold = b < req.eligible ? tokens
                          : b == rows->straddle_block
                              ? before[GroupOf(ids[i], shift)]
                              : 0;
    const CandidateRole role = b < req.eligible || cold > 0
                                   ? CandidateRole::kRecall
                               : front_window ? CandidateRole::kIgnore
                                              : CandidateRole::kWindow;
    rows->tokens[i] = role == CandidateRole::kRecall ? cold : tokens;
    rows->role[i] = role;
    // Without the front end's window_lse, a straddling group's tokens in
    // the window count in the normaliser as the window's do.
    rows->counted[i] =
        front_window ? static_cast<float>(cold) : static_cast<float>(tokens);
    rows->recallable[i] = role == CandidateRole::kRecall ? 1.0f : 0.0f;
  }
  rows->exact = true;
  for (const SegmentScan& s : rows->scans) rows->exact &= s.exact;
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
