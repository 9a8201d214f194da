#include "engine/recall/mass_scorer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/thread_scratch.h"
#include "base/timing.h"
#include "engine/index/dot.h"
#include "engine/recall/identity_channel.h"
#include "engine/recall/mass_bounds.h"
#include "engine/recall/mass_estimate.h"
#include "engine/recall/mass_rows.h"
#include "engine/recall/mass_scan.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/semantic_cache.h"
#include "engine/recall/token_groups.h"
#include "engine/recall/token_stage.h"
#include "engine/recall/track_candidates.h"
#include "engine/signals/semantics.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

// Per-thread scratch is kept between recalls up to this many floats (32 MiB);
// a larger recall frees its scratch when it is done.
constexpr uint64_t kKeepScratchFloats = uint64_t{1} << 23;

// Frees a large recall's scratch once its plans are made (ScoredRecall::
// state), on the recall's thread.
struct ReleaseRowsScratch {
  ~ReleaseRowsScratch() { ReleaseThreadScratch<MassRows>(); }
};

// What one set's second pass reads besides the rows.
struct SetState {
  SemanticCache sem;
  std::vector<bool> ranked;  // Rows the first pass ranked.
};

// The semantic scores a mass recall knows up front.
SemanticCache MassSemantics(const RecallView& view, const RecallQuery& q,
                            size_t eligible)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const RecallWeights& w = view.config().weights;
  const bool semantic = SemanticWeights(w);
  const BlockTable& blocks = view.blocks();
  SemanticCache sem(semantic, [&blocks, &q, &w](uint64_t b) {
    return SemanticScore(MatchSignals(blocks[b].rec, q.signals), w);
  });
  // Semantic scores are known up front wherever they can be above 0, so
  // the value bounds hold: for the query's track candidates (tracks and IoU
  // are 0 elsewhere), and for every eligible block when the scene term
  // counts (any block's scene can match).
  if (w.scene > 0 && !q.signals.scene_embedding.empty()) {
    sem.Reserve(eligible);
    for (size_t b = blocks.first(); b < eligible; ++b) sem.Get(b);
  } else if (semantic) {
    for (size_t b : TrackCandidates(view, q.signals, eligible)) sem.Get(b);
  }
  return sem;
}

// Exact densities over head range `range` of the rows `first` (the scan
// was approximate), into *density.
void ExactDensities(const RecallView& view, const RecallQuery& q,
                    const MassRows& rows, size_t range,
                    const std::vector<uint32_t>& first,
                    std::vector<float>* dots, std::vector<float>* exact,
                    std::vector<float>* density)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const std::vector<uint64_t>& ids = rows.ids();
  const uint32_t hd = view.config().geometry.head_dim;
  const uint32_t heads = view.summary_dim() / hd;
  const uint32_t vectors = static_cast<uint32_t>(rows.scans.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Their summaries lie in their block records, scattered: ask for all of
  // them before reading any.
  for (uint32_t row : first) {
    const char* p = reinterpret_cast<const char*>(view.UnitSummary(ids[row]));
    for (size_t b = 0; b < view.summary_dim() * sizeof(float); b += 64) {
      __builtin_prefetch(p + b);
    }
  }
  dots->resize(first.size() * vectors * heads);
  exact->resize(first.size());
  for (size_t k = 0; k < first.size(); ++k) {
    UnitDots(view, ids[first[k]], q.query.data(), vectors,
             dots->data() + k * vectors * heads);
  }
  const auto [h0, h1] = rows.ranges[range];
  CandidateDensities(rows.est, dots->data(), first.size(), h0, h1, scale,
                     exact->data());
  for (size_t k = 0; k < first.size(); ++k) (*density)[k] = (*exact)[k];
}

// Moves the re-identification anchors (track weight > 0): each track the
// query shows has the best unit of its most recent recallable block taken
// first, so an object that re-enters brings back where it was last seen
// even where attention alone would not (RoPE decay, look-alikes).
void PutAnchorsFirst(const RecallView& view, const ScoreRequest& req,
                     const MassRows& rows, const std::vector<float>& density,
                     SetState* set, std::vector<PlanUnit>* units)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const std::vector<uint64_t>& ids = rows.ids();
  const size_t n = ids.size();
  const uint32_t shift = view.unit_shift();
  const std::vector<uint64_t> anchor_blocks =
      AnchorBlocks(view, *req.query, req.eligible);
  std::vector<size_t> best(anchor_blocks.size(), n);
  for (size_t i = 0; i < n && !anchor_blocks.empty(); ++i) {
    if (rows.role[i] != CandidateRole::kRecall) continue;
    const auto a =
        std::find(anchor_blocks.begin(), anchor_blocks.end(), ids[i] >> shift);
    if (a == anchor_blocks.end()) continue;
    size_t& k = best[a - anchor_blocks.begin()];
    if (k == n || density[i] > density[k]) k = i;
  }
  std::vector<PlanUnit> front;
  for (size_t k : best) {
    if (k == n) continue;
    const uint64_t b = ids[k] >> shift;
    const uint32_t g = GroupOf(ids[k], shift);
    auto in_first =
        std::find_if(units->begin(), units->end(), [&](const PlanUnit& u) {
          return u.block == b && u.group == g && u.token == kWholeUnit;
        });
    if (in_first != units->end()) {
      front.push_back(*in_first);
      units->erase(in_first);
    } else {
      set->ranked[k] = true;
      front.push_back({b, g, rows.tokens[k], density[k], set->sem.Get(b)});
    }
  }
  units->insert(units->begin(), front.begin(), front.end());
}

// The units no first pass ranked that still fit `left` tokens, with their
// scanned density and known semantic score.
std::vector<PlanUnit> RestUnits(const MassRows& rows, uint32_t shift,
                                const std::vector<float>& density,
                                const SetState& set, uint32_t left) {
  const std::vector<uint64_t>& ids = rows.ids();
  std::vector<PlanUnit> units;
  for (uint32_t i = 0; i < ids.size(); ++i) {
    const uint64_t b = ids[i] >> shift;
    // The straddling block's groups hold window tokens: by token only.
    if (rows.role[i] != CandidateRole::kRecall || set.ranked[i] ||
        rows.tokens[i] > left || b == rows.straddle_block) {
      continue;
    }
    units.push_back({b, GroupOf(ids[i], shift), rows.tokens[i], density[i],
                     set.sem.Known(b)});
  }
  return units;
}

// The token stage over head range `range`: the pool (the recallable units
// best by their scanned value, up to kTokenPoolFactor x the budget's tokens)
// has each of its tokens scored from its codes; out->ranked becomes the best
// token units, ranked (the budget's count and kRankSlack more: what the planner
// can take), and *rest makes units of the others for the fill. The pool's
// rows count as ranked for the fill.
void RankPoolTokens(const RecallView& view, const ScoreRequest& req,
                    const PlanPolicy& policy, const MassRows& rows,
                    size_t range, SetState* set, ScoredSet* out,
                    std::function<std::vector<PlanUnit>()>* rest)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const auto t0 = SteadyClock::now();
  const std::vector<uint64_t>& ids = rows.ids();
  const std::vector<float>& density = rows.est.density[range];
  const uint32_t shift = view.unit_shift();
  const auto [h0, h1] = rows.ranges[range];
  const uint32_t pool_budget =
      PoolBudget(req.budget.tokens, rows.token_query.vectors, h1 - h0);
  // The identity channel's share, when it is on.
  const IdentitySplit split =
      rows.mean_est.density.empty()
          ? IdentitySplit{}
          : SplitIdentity(req.budget.tokens,
                          IdentityShare(view.config().weights, *req.query),
                          rows.anchors.size());
  // The recallable units by their scanned value (the first pass's bounds
  // need no proof here: the tokens decide), in one pass.
  PoolCandidates& c = ThreadScratch<PoolCandidates>();
  c.Clear();
  for (uint32_t i = 0; i < ids.size(); ++i) {
    if (rows.role[i] != CandidateRole::kRecall || rows.tokens[i] == 0) continue;
    c.row.push_back(i);
    c.value.push_back(MassRankValue(density[i], set->sem.Known(ids[i] >> shift),
                                    policy.model_weight));
    c.tokens.push_back(rows.tokens[i]);
    c.id.push_back(ids[i]);
  }
  std::vector<uint32_t> pool_rows =
      PoolUntil(c.value, c.tokens, c.id, pool_budget);
  for (uint32_t& k : pool_rows) {
    k = c.row[k];
    set->ranked[k] = true;
  }
  // The identity channel's candidates join the pool.
  if (split.identity > 0) {
    for (uint32_t i :
         IdentityPoolRows(view, rows, range, split, set->ranked, &c)) {
      set->ranked[i] = true;
      pool_rows.push_back(i);
    }
  }
  std::vector<PlanUnit> pool;
  pool.reserve(pool_rows.size());
  for (uint32_t i : pool_rows) {
    const uint64_t b = ids[i] >> shift;
    pool.push_back({b, GroupOf(ids[i], shift), rows.tokens[i], density[i],
                    set->sem.on() ? set->sem.Get(b) : 0.0f});
  }
  TokenStageInput in;
  in.query = &rows.token_query;
  in.est = &rows.est;
  in.h0 = h0;
  in.h1 = h1;
  in.logit_scale =
      1.0f / std::sqrt(static_cast<float>(view.config().geometry.head_dim));
  if (split.identity > 0) {
    in.mean_est = &rows.mean_est;
    in.weight = rows.est.weight.data();
  }
  auto scored = std::make_shared<TokenStageOutput>();
  ScorePoolTokens(view, in, pool, scored.get(), req.helpers);
  // The pooled groups' mass at token resolution, in place of their means'.
  double delta = 0;
  for (const PlanUnit& u : pool) delta -= double(u.score) * u.tokens;
  for (float d : scored->density) delta += d;
  for (const PlanUnit& u : scored->whole) delta += double(u.score) * u.tokens;
  out->cold_mass = std::max(out->cold_mass + delta, 0.0);
  // The whole (window and every candidate) was 1 at the groups' means.
  out->mass_scale = 1.0 / std::max(1.0 + delta, 1e-6);
  RankScoredTokens(scored, policy, req.budget.tokens, &out->ranked, rest);
  if (split.identity > 0) IdentityUnits(*scored, rows.anchors, split, out);
  out->tokens_scored = scored->tokens_scored;
  out->token_us = WholeMicrosSince(t0);
}

class MassScorer final : public RecallScorer {
 public:
  explicit MassScorer(bool token_stage)
      : token_stage_(token_stage),
        name_(token_stage ? kMassScorer : kMassGroupsScorer) {}
  const std::string& name() const override { return name_; }
  bool wants_open_mean() const override { return true; }
  bool answers_per_head() const override { return true; }

  absl::Status Score(const RecallView& view, const ScoreRequest& req,
                     ScoredRecall* out, CallCost* cost) const override
      ABSL_SHARED_LOCKS_REQUIRED(view.mu());

 private:
  // One recall set over head range `range`: the units that can be among
  // the first taken, ranked (anchors first), and the rest for the fill.
  ScoredSet RankSet(const RecallView& view, const ScoreRequest& req,
                    const PlanPolicy& policy, const MassRows& rows,
                    size_t range) const ABSL_SHARED_LOCKS_REQUIRED(view.mu());

  const bool token_stage_;
  const std::string name_;
};

absl::Status MassScorer::Score(const RecallView& view, const ScoreRequest& req,
                               ScoredRecall* out, CallCost* cost) const {
  const StreamConfig& config = view.config();
  const RecallQuery& q = *req.query;
  const uint32_t heads = view.summary_dim() / config.geometry.head_dim;
  const uint64_t units = view.indexes().units().size();
  const uint64_t scores = uint64_t{req.budget.query_vectors} * heads * units;
  if (scores > kMaxScoresPerRecall) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "recall would score ", req.budget.query_vectors, " query vectors x ",
        heads, " heads x ", units, " units of stream \"", view.stream_id(),
        "\" = ", scores, " scores; at most ", kMaxScoresPerRecall,
        " per recall: send fewer query vectors or index fewer layers"));
  }
  const auto t0 = SteadyClock::now();
  out->window_estimated = q.window_lse.empty();
  out->group_units = view.grouped();
  out->score_is_mean_dot = true;
  out->layer_sets = q.per_layer || q.per_head;
  out->policy = {ScoreMode::kMass,
                 req.budget.tokens,
                 req.budget.top_k,
                 config.weights.model,
                 1.0f,
                 config.gate_temperature};
  MassRows& rows = ThreadScratch<MassRows>();
  // The token stage proves nothing from the scan (its tokens decide): ranks.
  ScanUnits(view, req,
            token_stage_ && view.grouped() ? ScanMode::kRank : ScanMode::kProof,
            cost, &rows.scans);
  out->search_us = WholeMicrosSince(t0);
  ClassifyRows(view, req, token_stage_ && view.grouped(), &rows);
  const std::vector<float> window =
      WindowLse(view, q.query.data(), static_cast<uint32_t>(rows.scans.size()),
                q.window_lse);
  MassInputs in;
  in.heads = heads;
  in.logit_scale =
      1.0f / std::sqrt(static_cast<float>(config.geometry.head_dim));
  in.n = rows.tokens.size();
  in.counted = rows.counted.data();
  for (const SegmentScan& s : rows.scans) in.scans.push_back(&s);
  in.window_lse = window.data();
  if (req.vector_weights != nullptr) in.weight = *req.vector_weights;
  const uint32_t kv = config.geometry.kv_heads;
  if (q.per_layer) {
    for (uint32_t li = 0; li < heads / kv; ++li) {
      in.ranges.emplace_back(li * kv, (li + 1) * kv);
    }
  } else if (q.per_head) {
    for (uint32_t h = 0; h < heads; ++h) in.ranges.emplace_back(h, h + 1);
  } else {
    in.ranges.emplace_back(0, heads);
  }
  rows.ranges = in.ranges;
  EstimateMass(in, &rows.est);
  rows.anchors.clear();
  rows.mean_est = MassEstimate{};
  if (token_stage_ && view.grouped()) {
    PrepareTokenQuery(TokenCodeShapeOf(config), q.query.data(),
                      static_cast<uint32_t>(rows.scans.size()),
                      &rows.token_query);
    if (IdentityShare(config.weights, q) > 0) PrepareIdentity(view, req, &rows);
  }
  for (size_t ri = 0; ri < rows.ranges.size(); ++ri) {
    ScoredSet set = RankSet(view, req, out->policy, rows, ri);
    if (out->layer_sets) {
      const uint32_t h0 = rows.ranges[ri].first;
      set.layer = config.indexed_layers[h0 / kv];
      set.kv_head = q.per_head ? h0 % kv : 0;
    }
    out->sets.push_back(std::move(set));
  }
  if (uint64_t{req.budget.query_vectors} * heads * rows.tokens.size() >
      kKeepScratchFloats) {
    out->state = std::make_shared<ReleaseRowsScratch>();
  }
  return absl::OkStatus();
}

struct RankScratch {
  std::vector<float> lower, upper, dots, exact;
  std::vector<std::pair<uint32_t, float>> pending;  // Row, upper.
};

// The units that can be among the first taken (their upper bound reaches
// the budget's threshold), rescored exactly when the scan was not, ranked.
std::vector<PlanUnit> RankFirstUnits(const RecallView& view,
                                     const ScoreRequest& req,
                                     const PlanPolicy& policy,
                                     const MassRows& rows, size_t range,
                                     SetState* set, RankScratch* scratch_ptr)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  RankScratch& scratch = *scratch_ptr;
  const std::vector<uint64_t>& ids = rows.ids();
  const std::vector<float>& density = rows.est.density[range];
  const uint32_t shift = view.unit_shift();
  // Bounds of each unit's value (-1 for units that are not recallable); only
  // units whose upper bound reaches theta can be among the first taken.
  ValueBounds(density.data(), rows.est.slack.data(), rows.recallable.data(),
              ids, shift, set->sem, view.config().weights.model, &scratch.lower,
              &scratch.upper);
  const float theta = BudgetThreshold(scratch.lower, scratch.upper, rows.tokens,
                                      req.budget.tokens, &scratch.pending);
  std::vector<uint32_t> first_rows;
  for (const auto& [i, upper] : scratch.pending) {
    if (upper < theta) continue;
    set->ranked[i] = true;
    first_rows.push_back(i);
  }
  std::vector<float> first_density(first_rows.size());
  for (size_t k = 0; k < first_rows.size(); ++k) {
    first_density[k] = density[first_rows[k]];
  }
  if (!rows.exact) {
    ExactDensities(view, *req.query, rows, range, first_rows, &scratch.dots,
                   &scratch.exact, &first_density);
  }
  std::vector<PlanUnit> ranked;
  ranked.reserve(first_rows.size());
  for (size_t k = 0; k < first_rows.size(); ++k) {
    const uint64_t unit = ids[first_rows[k]], b = unit >> shift;
    ranked.push_back({b, GroupOf(unit, shift), rows.tokens[first_rows[k]],
                      first_density[k],
                      set->sem.on() ? set->sem.Get(b) : 0.0f});
  }
  RecallPlanner(policy).Rank(&ranked);
  return ranked;
}

ScoredSet MassScorer::RankSet(const RecallView& view, const ScoreRequest& req,
                              const PlanPolicy& policy, const MassRows& rows,
                              size_t range) const {
  const size_t n = rows.ids().size();
  RankScratch& scratch = ThreadScratch<RankScratch>();
  const std::vector<float>& density = rows.est.density[range];
  const uint32_t shift = view.unit_shift();
  const RecallWeights& w = view.config().weights;
  auto set = std::make_shared<SetState>(
      SetState{MassSemantics(view, *req.query, req.eligible),
               std::vector<bool>(n, false)});
  ScoredSet out;
  out.cold_mass =
      ColdMass(density.data(), rows.recallable.data(), rows.tokens.data(), n);
  std::function<std::vector<PlanUnit>()> rest_tokens;
  if (token_stage_ && view.grouped()) {
    // The tokens decide: the pool needs no exact group ranking.
    RankPoolTokens(view, req, policy, rows, range, set.get(), &out,
                   &rest_tokens);
  } else {
    out.ranked =
        RankFirstUnits(view, req, policy, rows, range, set.get(), &scratch);
  }
  if (w.track > 0 && !req.query->signals.detections.empty()) {
    PutAnchorsFirst(view, req, rows, density, set.get(), &out.ranked);
  }
  // Skipped units leave a gap smaller than the largest unit; the rest of
  // the candidates that fit it, by their scanned estimate. Taking the best
  // unit that fits, again and again, is one pass in rank order: a unit that
  // does not fit never will (the tokens left only shrink, and a block not
  // taken once top_k are cannot be taken later).
  // The leftovers' closure moved in, not copied (a copy copied their
  // list of every pooled token not ranked).
  out.more = [&rows, &density, shift, set,
              rest_tokens = std::move(rest_tokens)](uint32_t left) {
    std::vector<PlanUnit> more = RestUnits(rows, shift, density, *set, left);
    if (rest_tokens) {
      const std::vector<PlanUnit> tokens = rest_tokens();
      more.insert(more.end(), tokens.begin(), tokens.end());
    }
    return more;
  };
  if (scratch.dots.size() + 2 * n > kKeepScratchFloats) {
    ReleaseThreadScratch<RankScratch>();
  }
  return out;
}

}  // namespace

std::unique_ptr<RecallScorer> NewMassScorer(bool token_stage) {
  return std::make_unique<MassScorer>(token_stage);
}

}  // namespace kvmem
