#include "engine/recall/token_stage.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "base/thread_scratch.h"
#include "engine/recall/token_groups.h"
#include "engine/recall/token_lanes.h"
#include "engine/recall/top_select.h"

namespace kvmem {

void TokenDensities(const TokenCodeShape& shape, const TokenStageInput& in,
                    const uint8_t* records, size_t m, float* out,
                    float* mean_out) {
  const size_t per_token = size_t{in.query->vectors} * shape.segments;
  struct Scratch {
    std::vector<float> dots;
  };
  std::vector<float>& dots = ThreadScratch<Scratch>().dots;
  dots.resize(m * per_token);
  ActiveTokenKernel().dots(shape, *in.query, records, m, in.h0, in.h1,
                           dots.data());
  const bool mean = in.mean_est != nullptr && mean_out != nullptr;
  const DensityTerms* terms = in.terms;
  if (terms == nullptr) {
    DensityTerms& t = ThreadScratch<DensityTerms>();
    PrepareDensityTerms(*in.est, in.h0, in.h1, in.logit_scale,
                        mean ? in.mean_est : nullptr, in.weight, &t);
    terms = &t;
  }
  TermDensities(*terms, dots.data(), m, out, mean ? mean_out : nullptr);
}

namespace {

// Asks for a run of code records before it is read (the pool's runs lie
// in different blocks' records: the next run's misses overlap this run's
// scoring).
void PrefetchRun(const uint8_t* p, size_t bytes) {
  for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

// A pooled group's tokens.
struct PoolRun {
  const PlanUnit* unit;
  const uint8_t* records;  // The group's run in its block's codes.
  uint32_t begin = 0, count = 0;
  size_t at = 0;  // Its first token in the output.
};

// The runs' densities into out (density, mean_density when `mean`), in
// slices of whole runs of about kParallelPoolTokens tokens on `helpers`
// (one slice without them); each slice writes only its runs' tokens.
void ScoreRuns(const TokenCodeShape& shape, const TokenStageInput& in,
               const std::vector<PoolRun>& runs, bool mean,
               const RecallHelpers& helpers, TokenStageOutput* out) {
  const size_t stride = shape.bytes_per_token();
  std::vector<size_t> slices(1, 0);  // First run of each, then the end.
  for (size_t i = 0; i < runs.size(); ++i) {
    if (helpers.on() && runs[i].at + runs[i].count - runs[slices.back()].at >=
                            kParallelPoolTokens) {
      slices.push_back(i + 1);
    }
  }
  if (slices.back() != runs.size()) slices.push_back(runs.size());
  // Tokens in lanes where the CPU has the kernel (token_lanes.h): each
  // slice's records in one call.
  const bool lanes = in.terms != nullptr && LaneTokenKernel() != "off";
  helpers.For(slices.size() - 1, [&](size_t k) {
    const size_t first = slices[k], end = slices[k + 1];
    if (lanes) {
      struct Scratch {
        std::vector<const uint8_t*> records;
      };
      std::vector<const uint8_t*>& recs = ThreadScratch<Scratch>().records;
      recs.clear();
      for (size_t i = first; i < end; ++i) {
        for (uint32_t t = 0; t < runs[i].count; ++t) {
          recs.push_back(runs[i].records + t * stride);
        }
      }
      const size_t at = runs[first].at;
      if (LaneTokenDensities(shape, *in.query, *in.terms, recs.data(),
                             recs.size(), out->density.data() + at,
                             mean ? out->mean_density.data() + at : nullptr)) {
        return;
      }
    }
    PrefetchRun(runs[first].records, runs[first].count * stride);
    for (size_t i = first; i < end; ++i) {
      const PoolRun& r = runs[i];
      if (i + 1 < end) {
        PrefetchRun(runs[i + 1].records, runs[i + 1].count * stride);
      }
      TokenDensities(shape, in, r.records, r.count, out->density.data() + r.at,
                     mean ? out->mean_density.data() + r.at : nullptr);
    }
  });
}

}  // namespace

bool HasTokenCodes(const BlockRecord& rec, const TokenCodeShape& shape) {
  const size_t n = rec.info.token_count;
  return rec.token_codes.size() == n * shape.bytes_per_token() &&
         rec.token_group.size() == n;
}

uint32_t TokensBeforeWindow(const RecallView& view, uint64_t block,
                            uint64_t window_start) {
  if (!view.grouped() || !view.blocks().Has(block)) return 0;
  const BlockRecord& rec = view.blocks()[block].rec;
  if (rec.disk == DiskForm::kNone ||
      rec.info.first_token_position >= window_start ||
      rec.info.end_token_position <= window_start ||
      // Positions without gaps (frames back to back), so a token's offset
      // is its position's: the record keeps no frame's own position.
      rec.info.end_token_position - rec.info.first_token_position !=
          rec.info.token_count ||
      !HasTokenCodes(rec, TokenCodeShapeOf(view.config()))) {
    return 0;
  }
  return static_cast<uint32_t>(window_start - rec.info.first_token_position);
}

void ScorePoolTokens(const RecallView& view, const TokenStageInput& in,
                     const std::vector<PlanUnit>& pool, TokenStageOutput* out,
                     const RecallHelpers& helpers) {
  const TokenCodeShape shape = TokenCodeShapeOf(view.config());
  const size_t stride = shape.bytes_per_token();
  struct Scratch {
    std::vector<PoolRun> runs;
  };
  std::vector<PoolRun>& runs = ThreadScratch<Scratch>().runs;
  runs.clear();
  size_t tokens = 0;
  for (const PlanUnit& u : pool) {
    const BlockRecord& rec = view.blocks()[u.block].rec;
    if (!HasTokenCodes(rec, shape)) {
      out->whole.push_back(u);  // No codes: the group stays whole.
      continue;
    }
    // The group's run starts after the tokens of the groups before it.
    uint32_t begin = 0;
    for (uint32_t g = 0; g < u.group; ++g) begin += view.UnitTokens(u.block, g);
    const uint32_t count =
        std::min(u.tokens, view.UnitTokens(u.block, u.group));
    runs.push_back({&u,
                    reinterpret_cast<const uint8_t*>(rec.token_codes.data()) +
                        size_t{begin} * stride,
                    begin, count, tokens});
    tokens += count;
  }
  // The mean vector's densities: with its estimate and the weights both.
  const bool mean = in.mean_est != nullptr && in.weight != nullptr;
  out->density.resize(tokens);
  out->mean_density.resize(mean ? tokens : 0);
  // The density terms, once for the pool (a scratch of their own: the
  // functions of mass_estimate.h use DensityTerms' own).
  struct PoolTerms {
    DensityTerms t;
  };
  DensityTerms& terms = ThreadScratch<PoolTerms>().t;
  PrepareDensityTerms(*in.est, in.h0, in.h1, in.logit_scale,
                      mean ? in.mean_est : nullptr, in.weight, &terms);
  TokenStageInput pool_in = in;
  pool_in.terms = &terms;
  out->run.resize(tokens);
  out->place.resize(tokens);
  out->runs.reserve(out->runs.size() + runs.size());
  for (const PoolRun& r : runs) {
    const uint32_t run = static_cast<uint32_t>(out->runs.size());
    out->runs.push_back(*r.unit);
    for (uint32_t k = 0; k < r.count; ++k) {
      out->run[r.at + k] = run;
      out->place[r.at + k] = r.begin + k;
    }
  }
  out->tokens_scored += tokens;
  ScoreRuns(shape, pool_in, runs, mean, helpers, out);
}

uint32_t PoolBudget(uint32_t budget, uint32_t vectors, uint32_t heads) {
  const uint64_t per_token = uint64_t{vectors} * heads;
  const uint64_t affordable = kMaxTokenDots / std::max<uint64_t>(per_token, 1);
  return static_cast<uint32_t>(
      std::min<uint64_t>({uint64_t{budget} * kTokenPoolFactor,
                          std::max<uint64_t>(affordable, budget), UINT32_MAX}));
}

std::vector<uint32_t> PoolUntil(const std::vector<float>& value,
                                const std::vector<uint32_t>& tokens,
                                const std::vector<uint64_t>& id,
                                uint64_t budget) {
  std::vector<uint32_t> out;
  SelectTop(
      value.data(), tokens.data(), value.size(), budget,
      [&id](uint32_t a, uint32_t b) { return id[a] > id[b]; }, false, &out);
  return out;
}

std::vector<uint32_t> BestUntil(const std::vector<float>& value,
                                const std::vector<uint32_t>& tokens,
                                const std::vector<uint64_t>& id,
                                uint64_t budget) {
  std::vector<uint32_t> out;
  SelectTop(
      value.data(), tokens.data(), value.size(), budget,
      [&id](uint32_t a, uint32_t b) { return id[a] > id[b]; }, true, &out);
  return out;
}

void RankScoredTokens(std::shared_ptr<const TokenStageOutput> scored,
                      const PlanPolicy& policy, uint32_t budget,
                      std::vector<PlanUnit>* ranked,
                      std::function<std::vector<PlanUnit>()>* rest) {
  const TokenStageOutput& so = *scored;
  const size_t n = so.density.size();
  struct Scratch {
    std::vector<float> value;
    std::vector<uint32_t> best;
    std::vector<uint8_t> taken;
  };
  Scratch& sc = ThreadScratch<Scratch>();
  sc.value.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    sc.value[i] = MassRankValue(so.density[i], so.runs[so.run[i]].semantic,
                                policy.model_weight);
  }
  // Rank's order: ties to the newer block, the larger group and place.
  const size_t keep = std::min(n, size_t{budget} + kRankSlack);
  SelectTop(
      sc.value.data(), nullptr, n, keep,
      [&so](uint32_t a, uint32_t b) {
        const PlanUnit &x = so.runs[so.run[a]], &y = so.runs[so.run[b]];
        if (x.block != y.block) return x.block > y.block;
        return x.group != y.group ? x.group > y.group
                                  : so.place[a] > so.place[b];
      },
      true, &sc.best);
  ranked->clear();
  ranked->reserve(keep + so.whole.size());
  for (uint32_t i : sc.best) ranked->push_back(so.Unit(i));
  if (!so.whole.empty()) {  // Groups without codes join the ranking.
    ranked->insert(ranked->end(), so.whole.begin(), so.whole.end());
    RecallPlanner(policy).Rank(ranked);
  }
  // The others, in token order (the planner ranks what it is given).
  std::vector<uint8_t>& taken = sc.taken;
  taken.assign(n, 0);
  for (uint32_t i : sc.best) taken[i] = 1;
  std::vector<uint32_t> order;
  order.reserve(n - keep);
  for (uint32_t i = 0; i < n; ++i) {
    if (taken[i] == 0) order.push_back(i);
  }
  *rest = [scored, order = std::move(order)] {
    std::vector<PlanUnit> units;
    units.reserve(order.size());
    for (uint32_t i : order) units.push_back(scored->Unit(i));
    return units;
  };
}

void GroupOrder::Reset(const std::vector<uint8_t>& token_group,
                       const uint32_t* group_tokens, uint32_t groups) {
  // Each group's next place, from the group's first.
  uint32_t next[kMaxGroupsPerBlock];
  uint32_t places = 0;
  groups = std::min(groups, kMaxGroupsPerBlock);
  for (uint32_t g = 0; g < groups; ++g) {
    next[g] = places;
    places += group_tokens[g];
  }
  token_at_.resize(places);
  for (uint32_t t = 0; t < token_group.size(); ++t) {
    const uint8_t g = token_group[t];
    if (g < groups && next[g] < places) token_at_[next[g]++] = t;
  }
}

std::vector<uint32_t> GroupOrder::Tokens(
    absl::Span<const uint32_t> places) const {
  std::vector<uint32_t> out;
  Tokens(places, &out);
  return out;
}

void GroupOrder::Tokens(absl::Span<const uint32_t> places,
                        std::vector<uint32_t>* out) const {
  out->clear();
  out->reserve(places.size());
  for (uint32_t p : places) {
    if (p < token_at_.size()) out->push_back(token_at_[p]);
  }
}

}  // namespace kvmem
