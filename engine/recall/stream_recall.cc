// Stream: the recall planner's stream side: validation, the hot window, and
// score SUMMED (kvmem before per-head scoring, kept for comparison).
// Score MASS, the default, is in stream_mass.cc. With SUMMED, candidates come
// from the index (query . summary, raw logits summed over layers and heads)
// and from the query's track ids (the semantic signal); each is scored
//   priority = model_weight * score / sqrt(head_dim) + semantic
// and the plan takes the best by priority (at most top_k blocks when set),
// then fills the token budget.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/index/dot.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/recall_query.h"
#include "engine/recall/semantic_cache.h"
#include "engine/stream/signals.h"
#include "engine/stream/stream.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

uint32_t MicrosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - t0)
          .count());
}

// How many recent blocks per query track become semantic candidates.
constexpr size_t kBlocksPerTrack = 64;

float SummaryDot(const float* summary, const float* query, size_t dim) {
  double dot = 0;
  for (size_t i = 0; i < dim; ++i)
    dot += static_cast<double>(summary[i]) * query[i];
  return static_cast<float>(dot);
}

}  // namespace

std::vector<size_t> Stream::TrackCandidates(const FrameSignals& signals,
                                            size_t eligible) const {
  std::vector<size_t> out;
  const RecallWeights& w = config_.weights;
  if ((w.track <= 0 && w.iou <= 0) || eligible == 0) return out;
  for (const Detection& d : signals.detections) {
    auto it = track_blocks_.find(d.track_id);
    if (it == track_blocks_.end()) continue;
    size_t taken = 0;
    for (auto b = it->second.rbegin();
         b != it->second.rend() && taken < kBlocksPerTrack; ++b) {
      if (*b >= eligible || !blocks_.Has(*b) ||
          blocks_[*b].rec.disk == DiskForm::kNone) {
        continue;
      }
      ++taken;
      out.push_back(*b);
    }
  }
  return out;
}

std::vector<PlanUnit> Stream::BlockCandidates(
    const BlockIndex& index, const float* query, size_t offset, size_t dim,
    const FrameSignals& signals, size_t eligible, uint32_t top_k,
    uint32_t priority, CallCost* cost, uint32_t* search_us) const {
  const auto t0 = std::chrono::steady_clock::now();
  const RecallWeights& w = config_.weights;
  const bool semantic = w.track > 0 || w.iou > 0 || w.scene > 0;
  std::unordered_map<uint64_t, float> scores;  // id -> inner product
  if (eligible > 0 && top_k > 0) {
    // Blocks in the window can outrank eligible ones: ask for enough extra
    // results that top_k eligible ones survive the filter. With semantic
    // weights, a wider model pool lets them reorder it.
    const uint64_t pool = static_cast<uint64_t>(top_k) * (semantic ? 4 : 1);
    const uint32_t k = static_cast<uint32_t>(
        std::min<uint64_t>(pool, eligible) + (blocks_.size() - eligible));
    for (const ScoredId& h :
         accel().Search(index, query, {k, priority}, cost)) {
      if (h.id < eligible) scores.emplace(h.id, h.score);
    }
  }
  if (search_us != nullptr) *search_us = MicrosSince(t0);
  for (size_t b : TrackCandidates(signals, eligible)) {
    if (scores.count(b)) continue;
    scores.emplace(
        b, SummaryDot(blocks_[b].rec.summary.data() + offset, query, dim));
  }
  std::vector<PlanUnit> units;
  units.reserve(scores.size());
  for (const auto& [id, score] : scores) {
    const BlockRecord& rec = blocks_[id].rec;
    units.push_back(
        {id, 0, rec.info.token_count, score,
         semantic ? SemanticScore(MatchSignals(rec, signals), w) : 0.0f});
  }
  return units;
}

std::vector<PlanUnit> Stream::GroupCandidates(const float* query,
                                              const FrameSignals& signals,
                                              size_t eligible, uint32_t top_k,
                                              uint32_t priority, CallCost* cost,
                                              uint32_t* search_us) const {
  const auto t0 = std::chrono::steady_clock::now();
  const RecallWeights& w = config_.weights;
  const bool semantic = w.track > 0 || w.iou > 0 || w.scene > 0;
  auto groups_of = [&](size_t b) {
    return blocks_[b].rec.group_summaries.size() / summary_dim_;
  };
  std::unordered_map<uint64_t, float> scores;  // Group id -> inner product.
  if (eligible > 0 && top_k > 0) {
    // Groups of blocks in the window can outrank eligible ones: ask for
    // enough extra results that the pool of eligible groups survives.
    uint64_t window_groups = 0;
    for (size_t b = eligible; b < blocks_.size(); ++b) {
      if (blocks_[b].rec.disk != DiskForm::kNone) window_groups += groups_of(b);
    }
    const uint64_t eligible_groups = index_.groups->size() - window_groups;
    const uint64_t pool = static_cast<uint64_t>(top_k) *
                          config_.groups_per_block * (semantic ? 2 : 1);
    const uint32_t k = static_cast<uint32_t>(
        std::min<uint64_t>(pool, eligible_groups) + window_groups);
    for (const ScoredId& h :
         accel().Search(*index_.groups, query, {k, priority}, cost)) {
      if (h.id / kGroupStride < eligible) scores.emplace(h.id, h.score);
    }
  }
  if (search_us != nullptr) *search_us = MicrosSince(t0);
  for (size_t b : TrackCandidates(signals, eligible)) {
    for (size_t g = 0; g < groups_of(b); ++g) {
      const uint64_t gid = b * kGroupStride + g;
      if (scores.count(gid)) continue;
      scores.emplace(gid, SummaryDot(blocks_[b].rec.group_summaries.data() +
                                         g * summary_dim_,
                                     query, summary_dim_));
    }
  }
  // Each group with its block's semantic match.
  SemanticCache sem(semantic, [&](uint64_t b) {
    return SemanticScore(MatchSignals(blocks_[b].rec, signals), w);
  });
  std::vector<PlanUnit> units;
  units.reserve(scores.size());
  for (const auto& [gid, score] : scores) {
    const uint64_t b = gid / kGroupStride;
    const uint32_t g = static_cast<uint32_t>(gid % kGroupStride);
    units.push_back({b, g, unit_tokens_[UnitSlot(b, g)], score,
                     semantic ? sem.Get(b) : 0.0f});
  }
  return units;
}

std::vector<RecalledBlock> Stream::ToRecalled(const RecallPlan& plan,
                                              bool grouped,
                                              const float* mean_query) const {
  std::vector<RecalledBlock> out;
  out.reserve(plan.blocks.size());
  for (const PlannedBlock& p : plan.blocks) {
    const BlockEntry& e = blocks_[p.block];
    RecalledBlock r;
    r.block = e.rec.info;
    r.block.tier = TierOf(e);
    // Score MASS reports the mean query's inner product with the summary of
    // the block's best unit; SUMMED ranked by that product already.
    r.score = mean_query == nullptr
                  ? p.score
                  : Dot(mean_query,
                        UnitSummary((p.block << UnitShift()) | p.first_group),
                        summary_dim_);
    r.semantic_score = p.semantic;
    r.priority = p.priority;
    r.mass = p.mass;
    r.gate_weight = p.gate_weight;
    r.was_staged = e.staged;
    if (grouped) {
      r.token_offsets =
          TokenOffsets(e.rec.token_group, p.group_mask, r.block.token_count);
    }
    out.push_back(std::move(r));
  }
  return out;
}

void Stream::StageRecall(RecallResult* r, uint32_t priority) const {
  // Warm blocks sit in RAM layer-major (one run each); cold and degraded
  // ones come back from storage frame-major: a run per frame, layer and
  // K/V. Only the chosen tokens move.
  const uint64_t per_token = FramePayloadBytes(config_.geometry, 1);
  std::vector<StageItem> items;
  auto add = [&](const RecalledBlock& b) {
    const BlockInfo& i = b.block;
    StageItem it;
    it.bytes = static_cast<uint64_t>(RecalledTokens(b)) * per_token;
    it.layer_major = i.tier == Tier::kWarm;
    it.rows = static_cast<uint32_t>((i.last_frame - i.first_frame + 1) *
                                    config_.geometry.layers * 2);
    items.push_back(it);
  };
  for (const RecalledBlock& b : r->blocks) add(b);
  for (const LayerRecallSet& s : r->layer_sets)
    for (const RecalledBlock& b : s.blocks) add(b);
  accel().Stage(items, {priority}, &r->accel);
}

void Stream::AccountAccel(const CallCost& c) {
  kvmem::MutexLock lock(&accel_mu_);
  accel_cost_ += c;
}

std::string Stream::RecallFloorWarning() const {
  const double floor = accel().recall_floor();
  const IndexQuality q = RetiredQuality(index_, retired_quality_);
  // A few samples before judging: one every 16th search.
  if (floor <= 0 || q.samples < 4 || q.recall() >= floor) return "";
  return absl::StrCat("stream \"", id_, "\": index ", config_.index_factory,
                      " sampled recall@k ", q.recall(), " over ", q.samples,
                      " searches is below the ", accel().name(),
                      " accelerator's recall floor ", floor,
                      "; use index_factory Flat or Progressive (exact) or a "
                      "more accurate index");
}

size_t Stream::EligibleBlocks(uint64_t window_end) const {
  const uint64_t window_start = window_end > config_.hot_window_tokens
                                    ? window_end - config_.hot_window_tokens
                                    : 0;
  // Blocks are in position order, so the recallable ones are a prefix (the
  // dropped evicted run included).
  return blocks_.first() +
         (std::partition_point(blocks_.begin(), blocks_.end(),
                               [&](const BlockEntry& b) {
                                 return b.rec.info.end_token_position <=
                                        window_start;
                               }) -
          blocks_.begin());
}

absl::StatusOr<RecallResult> Stream::Recall(const RecallQuery& q) {
  const auto t0 = std::chrono::steady_clock::now();
  KVMEM_RETURN_IF_ERROR(ValidateRecallQuery(q, config_, summary_dim_, id_));
  RecallResult result;
  KVMEM_RETURN_IF_ERROR(ResolveBudget(q, config_, summary_dim_, &result));
  // The mean of the query vectors: what SUMMED scores (its scores are
  // linear), and MASS's RecalledBlock.score and candidate pool.
  const std::vector<float> mean_query = MeanQuery(q.query, summary_dim_);
  uint64_t now_frame = 0;
  KVMEM_RETURN_IF_ERROR(PlanRecall(q, mean_query, &result, &now_frame));
  StageRecall(&result, q.priority);
  AccountAccel(result.accel);
  if (recalls_.fetch_add(1, std::memory_order_relaxed) % 16 == 15) {
    WarnIfBelowRecallFloor();
  }
  QueueFeedback(result, now_frame);
  result.total_us = MicrosSince(t0);
  RecordRecallLatency(result.total_us);
  return result;
}

absl::Status Stream::PlanRecall(const RecallQuery& q,
                                const std::vector<float>& mean_query,
                                RecallResult* r, uint64_t* now_frame) const {
  kvmem::ReaderMutexLock lock(&mu_);
  if (deleted_) return DeletedError();
  *now_frame = state_.last_frame < 0 ? 0 : state_.last_frame;
  const size_t eligible = EligibleBlocks(q.current_token_position == 0
                                             ? state_.next_token_position
                                             : q.current_token_position + 1);
  // The index holds every block with a disk form; blocks are in position
  // order, so the ineligible ones are the (short) tail in the window.
  // O(window), not O(blocks): at 100k blocks a scan of every entry cost
  // more than the search.
  uint64_t in_window = 0;
  for (size_t i = eligible; i < blocks_.size(); ++i) {
    in_window += blocks_[i].rec.disk != DiskForm::kNone;
  }
  r->candidates = index_.all->size() - in_window;
  if (config_.weights.score != ScoreMode::kMass) {
    PlanSummed(q, mean_query, eligible, r);
    return absl::OkStatus();
  }
  const BlockIndex& units = index_groups() ? *index_.groups : *index_.all;
  const uint32_t heads = summary_dim_ / config_.geometry.head_dim;
  const uint64_t scores = uint64_t{r->query_vectors} * heads * units.size();
  if (scores > kMaxScoresPerRecall) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "recall would score ", r->query_vectors, " query vectors x ", heads,
        " heads x ", units.size(), " units of stream \"", id_, "\" = ", scores,
        " scores; at most ", kMaxScoresPerRecall,
        " per recall: send fewer query vectors"));
  }
  RecallByMass(q, mean_query, eligible, r);
  return absl::OkStatus();
}

void Stream::PlanSummed(const RecallQuery& q,
                        const std::vector<float>& mean_query, size_t eligible,
                        RecallResult* r) const {
  PlanPolicy policy;
  policy.mode = ScoreMode::kSummed;
  policy.max_tokens = r->budget_tokens;
  // Without a cap on blocks, SUMMED asks the index for the budget's worth
  // (every block holds a token at least).
  policy.top_k =
      r->top_k > 0 ? r->top_k : std::min<uint32_t>(r->budget_tokens, kMaxTopK);
  policy.model_scale = config_.weights.model /
                       std::sqrt(static_cast<float>(config_.geometry.head_dim));
  policy.gate_temperature = config_.gate_temperature;
  auto to_set = [&](const RecallPlan& plan, bool grouped) {
    LayerRecallSet set;
    set.blocks = ToRecalled(plan, grouped, nullptr);
    for (const auto& b : set.blocks) set.total_tokens += RecalledTokens(b);
    return set;
  };
  LayerRecallSet one;
  if (q.per_layer) {
    for (size_t li = 0; li < config_.indexed_layers.size(); ++li) {
      uint32_t us = 0;
      // One indexed layer: its index is the all-layers one.
      const BlockIndex& layer =
          index_.layers.empty() ? *index_.all : *index_.layers[li];
      std::vector<PlanUnit> units =
          BlockCandidates(layer, mean_query.data() + li * layer_dim_,
                          li * layer_dim_, layer_dim_, q.signals, eligible,
                          policy.top_k, q.priority, &r->accel, &us);
      r->search_us += us;
      const auto t1 = std::chrono::steady_clock::now();
      LayerRecallSet set =
          to_set(RecallPlanner::PlanBlocks(policy, std::move(units)), false);
      r->plan_us += MicrosSince(t1);
      set.layer = config_.indexed_layers[li];
      r->layer_sets.push_back(std::move(set));
    }
    return;
  }
  if (index_.groups != nullptr) {
    std::vector<PlanUnit> units =
        GroupCandidates(mean_query.data(), q.signals, eligible, policy.top_k,
                        q.priority, &r->accel, &r->search_us);
    const auto t1 = std::chrono::steady_clock::now();
    one = to_set(RecallPlanner::Plan(policy, std::move(units)), true);
    r->plan_us = MicrosSince(t1);
  } else {
    std::vector<PlanUnit> units = BlockCandidates(
        *index_.all, mean_query.data(), 0, summary_dim_, q.signals, eligible,
        policy.top_k, q.priority, &r->accel, &r->search_us);
    const auto t1 = std::chrono::steady_clock::now();
    one = to_set(RecallPlanner::PlanBlocks(policy, std::move(units)), false);
    r->plan_us = MicrosSince(t1);
  }
  r->blocks = std::move(one.blocks);
  r->total_tokens = one.total_tokens;
}

void Stream::WarnIfBelowRecallFloor() {
  std::string warning;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    warning = RecallFloorWarning();
  }
  bool crossed;
  {
    kvmem::MutexLock lock(&accel_mu_);
    crossed = !warning.empty() && !below_recall_floor_;
    below_recall_floor_ = !warning.empty();
  }
  if (crossed && env_.warn) env_.warn(warning);
}

void Stream::QueueFeedback(const RecallResult& r, uint64_t now_frame) {
  std::vector<std::pair<uint64_t, uint64_t>> feedback;
  auto account = [&](const std::vector<RecalledBlock>& blocks,
                     uint32_t tokens) {
    for (const auto& b : blocks) feedback.emplace_back(b.block.id, now_frame);
    recalled_blocks_.fetch_add(blocks.size(), std::memory_order_relaxed);
    recalled_tokens_.fetch_add(tokens, std::memory_order_relaxed);
  };
  if (r.layer_sets.empty()) account(r.blocks, r.total_tokens);
  for (const LayerRecallSet& set : r.layer_sets) {
    account(set.blocks, set.total_tokens);
  }
  if (feedback.empty()) return;
  // Per-layer sets may share blocks: one hit per block and query.
  std::sort(feedback.begin(), feedback.end());
  feedback.erase(std::unique(feedback.begin(), feedback.end()), feedback.end());
  {
    kvmem::MutexLock lock(&feedback_mu_);
    recalled_.insert(recalled_.end(), feedback.begin(), feedback.end());
  }
  ScheduleMaintenance();
}

}  // namespace kvmem
