#include "engine/recall/recaller.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/thread_scratch.h"
#include "base/timing.h"
#include "engine/index/dot.h"
#include "engine/recall/query_reduction.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/recall_query.h"
#include "engine/recall/set_planning.h"
#include "engine/recall/token_stage.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

// The summary of a planned block's best unit (what a mean-dot score reads).
const float* PlannedSummary(const RecallView& view, const PlannedBlock& p)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  return view.UnitSummary((p.block << view.unit_shift()) | p.first_group);
}

// Fetches that summary into the cache: the scan read its int8 codes, so it
// is cold; the answer fetches the next block's while it answers this one.
void PrefetchSummary(const RecallView& view, const PlannedBlock& p)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const char* s = reinterpret_cast<const char*>(PlannedSummary(view, p));
  const size_t bytes = view.summary_dim() * sizeof(float);
  for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(s + b);
}

// A plan's blocks as the recall answers them: block info and tier, staging,
// token offsets for group units, and the score the scorer reports.
std::vector<RecalledBlock> ToRecalled(const RecallView& view,
                                      const RecallPlan& plan,
                                      const ScoredRecall& scored,
                                      const std::vector<float>& mean_query)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  std::vector<RecalledBlock> out;
  out.reserve(plan.blocks.size());
  GroupOrder& order = ThreadScratch<GroupOrder>();
  struct Scratch {
    std::vector<uint32_t> singles;  // A block's single tokens' offsets.
  };
  std::vector<uint32_t>& singles = ThreadScratch<Scratch>().singles;
  const bool mean_dot = scored.score_is_mean_dot;
  if (mean_dot && !plan.blocks.empty()) PrefetchSummary(view, plan.blocks[0]);
  for (size_t k = 0; k < plan.blocks.size(); ++k) {
    const PlannedBlock& p = plan.blocks[k];
    if (mean_dot && k + 1 < plan.blocks.size()) {
      PrefetchSummary(view, plan.blocks[k + 1]);
    }
    const BlockEntry& e = view.blocks()[p.block];
    RecalledBlock r;
    r.block = e.rec.info;
    r.block.tier = TierOf(e);
    r.score = mean_dot ? Dot(mean_query.data(), PlannedSummary(view, p),
                             view.summary_dim())
                       : p.score;
    r.semantic_score = p.semantic;
    r.priority = p.priority;
    r.mass = p.mass;
    r.gate_weight = p.gate_weight;
    r.was_staged = e.staged;
    if (scored.group_units) {
      if (!p.single_tokens.empty() || !p.query_tokens.empty() ||
          !p.track_tokens.empty()) {
        order.Reset(e.rec.token_group, view.BlockUnitTokens(p.block),
                    view.units_per_block());
      }
      order.Tokens(p.single_tokens, &singles);
      r.token_offsets = TokenOffsets(e.rec.token_group, p.group_mask, singles,
                                     r.block.token_count);
      if (!p.query_tokens.empty())
        r.query_offsets = order.Tokens(p.query_tokens);
      if (!p.track_tokens.empty())
        r.track_offsets = order.Tokens(p.track_tokens);
      std::sort(r.query_offsets.begin(), r.query_offsets.end());
      std::sort(r.track_offsets.begin(), r.track_offsets.end());
    }
    out.push_back(std::move(r));
  }
  return out;
}

// One planned set's answer: its blocks, channels and cold share, their
// masses as shares of the query's attention (ScoredSet::mass_scale); their
// sum into *mass. Shares of one whole sum to at most 1: at extreme logits
// (keys near fp16's largest) the exact rescoring of the first units leaves
// the scan's normaliser behind, and the shares are then scaled down
// together (their order kept).
LayerRecallSet AnswerSet(const RecallView& view, const ScoredSet& set,
                         const RecallPlan& plan, const ScoredRecall& scored,
                         const std::vector<float>& mean_query, float* mass)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  LayerRecallSet out;
  out.layer = set.layer;
  out.kv_head = set.kv_head;
  out.blocks = ToRecalled(view, plan, scored, mean_query);
  out.total_tokens = plan.total_tokens;
  out.channels = plan.channels;
  out.channels.identity_budget = set.identity_budget;
  double cold = 0;  // In the estimate's own units, as set.cold_mass.
  for (const RecalledBlock& b : out.blocks) cold += b.mass;
  out.cold_share = set.cold_mass > 0
                       ? static_cast<float>(std::min(1.0, cold / set.cold_mass))
                       : 0.0f;
  double sum = 0;
  for (RecalledBlock& b : out.blocks) {
    b.mass = static_cast<float>(b.mass * set.mass_scale);
    sum += b.mass;
  }
  if (sum > 1) {
    for (RecalledBlock& b : out.blocks) {
      b.mass = static_cast<float>(b.mass / sum);
    }
    sum = 1;
  }
  *mass = static_cast<float>(sum);
  return out;
}

// Under the view's lock: the eligible blocks, the scorer's sets and their
// plans, into *r.
absl::Status PlanRecall(const RecallView& view, const RecallScorer& scorer,
                        Accelerator& accel, const RecallQuery& q,
                        const RecallBudget& budget,
                        const std::vector<float>& mean_query,
                        const std::vector<float>* weights,
                        const RecallHelpers& helpers, RecallResult* r,
                        uint64_t* now_frame)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  if (view.deleted()) return view.DeletedError();
  const StreamState& state = view.state();
  *now_frame = state.last_frame < 0 ? 0 : state.last_frame;
  const uint64_t window_end = q.current_token_position == 0
                                  ? state.next_token_position
                                  : q.current_token_position + 1;
  const size_t eligible = view.EligibleBlocks(window_end);
  // The index holds every block with a disk form; blocks are in position
  // order, so the ineligible ones are the (short) tail in the window.
  // O(window), not O(blocks): at 100k blocks a scan of every entry cost
  // more than the search.
  const BlockTable& blocks = view.blocks();
  uint64_t in_window = 0;
  for (size_t i = eligible; i < blocks.size(); ++i) {
    in_window += blocks[i].rec.disk != DiskForm::kNone;
  }
  r->candidates =
      static_cast<uint32_t>(view.indexes().all().size() - in_window);
  const auto t0 = SteadyClock::now();
  ScoreRequest req;
  req.query = &q;
  req.mean_query = &mean_query;
  req.vector_weights = weights;
  req.budget = budget;
  req.eligible = eligible;
  req.straddle_tokens =
      TokensBeforeWindow(view, eligible, view.WindowStart(window_end));
  req.accel = &accel;
  req.helpers = helpers;
  ScoredRecall scored;
  KVMEM_RETURN_IF_ERROR(scorer.Score(view, req, &scored, &r->accel));
  if (!scored.layer_sets && scored.sets.size() != 1) {
    return absl::InternalError(absl::StrCat(
        "scorer \"", scorer.name(), "\" returned ", scored.sets.size(),
        " recall sets for a recall of one set"));
  }
  r->window_estimated = scored.window_estimated;
  r->search_us = scored.search_us;
  const std::vector<RecallPlan> plans =
      PlanSets(scored.policy, &scored.sets, q.mass_target);
  for (size_t si = 0; si < scored.sets.size(); ++si) {
    const ScoredSet& set = scored.sets[si];
    r->tokens_scored += set.tokens_scored;
    r->token_us += set.token_us;
    float mass = 0;
    LayerRecallSet out =
        AnswerSet(view, set, plans[si], scored, mean_query, &mass);
    r->channels += out.channels;
    if (scored.layer_sets) {
      r->recalled_mass += mass / static_cast<float>(scored.sets.size());
      r->cold_share += out.cold_share / static_cast<float>(scored.sets.size());
      r->layer_sets.push_back(std::move(out));
    } else {
      r->recalled_mass = mass;
      r->cold_share = out.cold_share;
      r->blocks = std::move(out.blocks);
      r->total_tokens = out.total_tokens;
    }
  }
  const uint32_t scored_us = WholeMicrosSince(t0);
  r->plan_us = scored_us > r->search_us ? scored_us - r->search_us : 0;
  return absl::OkStatus();
}

// Stages a planned recall's KV through the accelerator (cost into
// r->accel). Warm blocks sit in RAM layer-major (one run each); cold and
// degraded ones come back from storage frame-major: a run per frame, layer
// and K/V. Only the chosen tokens move.
void StageRecall(const Geometry& g, Accelerator& accel, uint32_t priority,
                 RecallResult* r) {
  const uint64_t per_token = FramePayloadBytes(g, 1);
  std::vector<StageItem> items;
  size_t count = r->blocks.size();
  for (const LayerRecallSet& s : r->layer_sets) count += s.blocks.size();
  items.reserve(count);
  auto add = [&](const RecalledBlock& b) {
    const BlockInfo& i = b.block;
    StageItem it;
    it.bytes = static_cast<uint64_t>(RecalledTokens(b)) * per_token;
    it.layer_major = i.tier == Tier::kWarm;
    it.rows = static_cast<uint32_t>((i.last_frame - i.first_frame + 1) *
                                    g.layers * 2);
    items.push_back(it);
  };
  for (const RecalledBlock& b : r->blocks) add(b);
  for (const LayerRecallSet& s : r->layer_sets)
    for (const RecalledBlock& b : s.blocks) add(b);
  accel.Stage(items, {priority}, &r->accel);
}

}  // namespace

absl::StatusOr<RecallResult> AnswerRecall(
    const RecallView& view, const RecallScorer& scorer, Accelerator& accel,
    const RecallQuery& q, uint64_t* now_frame, const RecallHelpers& helpers) {
  const StreamConfig& config = view.config();
  KVMEM_RETURN_IF_ERROR(ValidateRecallQuery(q, config, view.summary_dim(),
                                            view.stream_id(),
                                            scorer.answers_per_head()));
  KVMEM_ASSIGN_OR_RETURN(RecallBudget budget,
                         ResolveBudget(q, config, view.summary_dim()));
  // The helpers wake now and poll until the plans are made: they join the
  // scan sooner, and take no CPU after it.
  helpers.Enter();
  struct Leave {
    const RecallHelpers& h;
    ~Leave() { h.Leave(); }
  } leave{helpers};
  RecallResult result;
  result.budget_tokens = budget.tokens;
  result.top_k = budget.top_k;
  result.query_vectors = budget.query_vectors;
  // The mean of the query vectors: what SUMMED scores (its scores are
  // linear), and MASS's RecalledBlock.score, candidate pool and the query
  // as a whole.
  const std::vector<float> mean_query = MeanQuery(q.query, view.summary_dim());
  // A query of more vectors than recall scores: weighted representatives.
  RecallQuery reduced;
  ReducedQuery red;
  const bool reduce = budget.query_vectors > kMaxScoredVectors;
  if (reduce) {
    const auto t0 = SteadyClock::now();
    red = ReduceQuery(q.query, q.window_lse, view.summary_dim(),
                      view.summary_dim() / config.geometry.head_dim,
                      kMaxScoredVectors);
    reduced = q;
    reduced.query = std::move(red.query);
    reduced.window_lse = std::move(red.window_lse);
    budget.query_vectors = static_cast<uint32_t>(red.weight.size());
    result.reduce_us = WholeMicrosSince(t0);
  }
  result.scored_vectors = budget.query_vectors;
  {
    kvmem::ReaderMutexLock lock(&view.mu());
    KVMEM_RETURN_IF_ERROR(PlanRecall(
        view, scorer, accel, reduce ? reduced : q, budget, mean_query,
        reduce ? &red.weight : nullptr, helpers, &result, now_frame));
  }
  StageRecall(config.geometry, accel, q.priority, &result);
  return result;
}

std::string RecallFloorWarning(const RecallView& view, const Accelerator& accel,
                               uint64_t samples, double recall) {
  const double floor = accel.recall_floor();
  // A few samples before judging: one every 16th search.
  if (floor <= 0 || samples < 4 || recall >= floor) return "";
  return absl::StrCat("stream \"", view.stream_id(), "\": index ",
                      view.config().index_factory, " sampled recall@k ", recall,
                      " over ", samples, " searches is below the ",
                      accel.name(), " accelerator's recall floor ", floor,
                      "; use index_factory Flat or Progressive (exact) or a "
                      "more accurate index");
}

}  // namespace kvmem
