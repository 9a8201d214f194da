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

std::vector<RecalledBlock> Stream::RankCandidates(
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
    // top_k is at least 1 here: Recall passes the budget's worth without a
    // cap (every block holds a token at least).
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
  const float scale =
      w.model / std::sqrt(static_cast<float>(config_.geometry.head_dim));
  std::vector<RecalledBlock> ranked;
  ranked.reserve(scores.size());
  for (const auto& [id, score] : scores) {
    const BlockEntry& e = blocks_[id];
    RecalledBlock r;
    r.block = e.rec.info;
    r.block.tier = TierOf(e);
    r.score = score;
    r.semantic_score =
        semantic ? SemanticScore(MatchSignals(e.rec, signals), w) : 0.0f;
    r.priority = scale * score + r.semantic_score;
    r.was_staged = e.staged;
    ranked.push_back(r);
  }
  std::sort(ranked.begin(), ranked.end(),
            [](const RecalledBlock& a, const RecalledBlock& b) {
              return a.priority != b.priority ? a.priority > b.priority
                                              : a.block.id > b.block.id;
            });
  if (ranked.size() > top_k) ranked.resize(top_k);
  return ranked;
}

std::vector<RecalledBlock> Stream::RecallGroups(
    const float* query, const FrameSignals& signals, size_t eligible,
    uint32_t top_k, uint32_t max_tokens, uint32_t priority, CallCost* cost,
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
  // Rank groups: model score plus their block's semantic match.
  const float scale =
      w.model / std::sqrt(static_cast<float>(config_.geometry.head_dim));
  struct Candidate {
    uint64_t gid;
    float score, semantic, priority;
  };
  std::unordered_map<uint64_t, float> block_semantic;
  std::vector<Candidate> ranked;
  ranked.reserve(scores.size());
  for (const auto& [gid, score] : scores) {
    const uint64_t b = gid / kGroupStride;
    float sem = 0;
    if (semantic) {
      auto [it, fresh] = block_semantic.try_emplace(b, 0.0f);
      if (fresh) {
        it->second = SemanticScore(MatchSignals(blocks_[b].rec, signals), w);
      }
      sem = it->second;
    }
    ranked.push_back({gid, score, sem, scale * score + sem});
  }
  std::sort(ranked.begin(), ranked.end(),
            [](const Candidate& a, const Candidate& b) {
              return a.priority != b.priority ? a.priority > b.priority
                                              : a.gid > b.gid;
            });
  // Fill the budget with groups, at most top_k distinct blocks.
  std::vector<FillUnit> units;
  units.reserve(ranked.size());
  for (const Candidate& c : ranked) {
    const uint64_t b = c.gid / kGroupStride;
    units.push_back({b, unit_tokens_[UnitSlot(b, c.gid % kGroupStride)]});
  }
  FillState fill;
  std::vector<size_t> taken;
  FillBudget(units, max_tokens, top_k, &fill, &taken);
  std::vector<RecalledBlock> chosen;
  std::unordered_map<uint64_t, size_t> slot;  // Block -> index in chosen.
  for (size_t i : taken) {
    const Candidate& c = ranked[i];
    const uint64_t b = c.gid / kGroupStride;
    const uint8_t g = static_cast<uint8_t>(c.gid % kGroupStride);
    const BlockRecord& rec = blocks_[b].rec;
    auto it = slot.find(b);
    if (it == slot.end()) {
      RecalledBlock r;
      r.block = rec.info;
      r.block.tier = TierOf(blocks_[b]);
      r.score = c.score;
      r.semantic_score = c.semantic;
      r.priority = c.priority;
      r.was_staged = blocks_[b].staged;
      it = slot.emplace(b, chosen.size()).first;
      chosen.push_back(std::move(r));
    }
    RecalledBlock& r = chosen[it->second];
    for (uint32_t t = 0; t < rec.token_group.size(); ++t) {
      if (rec.token_group[t] == g) r.token_offsets.push_back(t);
    }
  }
  for (RecalledBlock& r : chosen) {
    std::sort(r.token_offsets.begin(), r.token_offsets.end());
    if (r.token_offsets.size() == r.block.token_count) r.token_offsets.clear();
  }
  AssignGateWeights(&chosen, config_.gate_temperature, ScoreMode::kSummed);
  return chosen;
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
  if (q.query.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query is empty; stream \"", id_, "\" expects ", summary_dim_,
        " floats ([indexed_layer][kv_head][head_dim])"));
  }
  if (q.query.size() % summary_dim_ != 0 ||
      q.query.size() / summary_dim_ > kMaxQueryVectors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query has ", q.query.size(), " floats; stream \"", id_,
        "\" expects n x ", summary_dim_,
        " (n query vectors of [indexed_layer][kv_head][head_dim], n in [1, ",
        kMaxQueryVectors, "])"));
  }
  const uint32_t vectors = static_cast<uint32_t>(q.query.size() / summary_dim_);
  const uint32_t heads = summary_dim_ / config_.geometry.head_dim;
  KVMEM_RETURN_IF_ERROR(CheckFinite("query", q.query));
  if (q.current_token_position > (uint64_t{1} << 63)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "current_token_position is ", q.current_token_position,
        "; must be at most 2^63 (frame positions are at most 2^62)"));
  }
  if (!q.window_lse.empty()) {
    if (q.window_lse.size() != static_cast<size_t>(vectors) * heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("window_lse has ", q.window_lse.size(), " floats; with ",
                       vectors, " query vector(s) stream \"", id_,
                       "\" expects ", static_cast<size_t>(vectors) * heads,
                       " ([query vector][indexed_layer][kv_head]) or none"));
    }
    KVMEM_RETURN_IF_ERROR(CheckFinite("window_lse", q.window_lse));
  }
  KVMEM_RETURN_IF_ERROR(ValidateSignals("signals", q.signals));
  if (q.per_head &&
      (q.per_layer || config_.weights.score != ScoreMode::kMass)) {
    return absl::InvalidArgumentError(
        q.per_layer ? "per_head and per_layer are both set; ask for one"
                    : absl::StrCat("per_head needs score MASS; stream \"", id_,
                                   "\" scores SUMMED"));
  }
  if (!(q.window_fraction >= 0.0f && q.window_fraction <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("budget.window_fraction is ",
                                                   q.window_fraction,
                                                   "; must be in [0, 1]"));
  }
  RecallResult result;
  result.top_k = q.top_k == 0 ? config_.default_top_k : q.top_k;
  result.query_vectors = vectors;
  if (q.max_tokens > 0) {
    result.budget_tokens = q.max_tokens;
  } else if (q.window_fraction > 0) {
    result.budget_tokens = std::max<uint32_t>(
        1,
        static_cast<uint32_t>(q.window_fraction * config_.hot_window_tokens));
  } else {
    result.budget_tokens = config_.default_max_tokens;
  }
  if (result.top_k > kMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat("budget.top_k is ", q.top_k,
                                                   "; must be at most ",
                                                   kMaxTopK, " (0: no cap)"));
  }
  if (result.budget_tokens > (1u << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget.max_tokens is ", q.max_tokens, "; must be at most ", 1u << 24));
  }

  const bool mass = config_.weights.score == ScoreMode::kMass;
  // The mean of the query vectors: what SUMMED scores (its scores are
  // linear), and MASS's RecalledBlock.score and candidate pool.
  std::vector<float> mean_query(q.query.begin(),
                                q.query.begin() + summary_dim_);
  for (uint32_t j = 1; j < vectors; ++j) {
    Axpy(1.0f, q.query.data() + j * summary_dim_, mean_query.data(),
         summary_dim_);
  }
  if (vectors > 1) {
    for (float& x : mean_query) x /= static_cast<float>(vectors);
  }
  // Without a cap on blocks, SUMMED asks the index for the budget's worth
  // (every block holds a token at least).
  const uint32_t rank_k =
      result.top_k > 0 ? result.top_k
                       : std::min<uint32_t>(result.budget_tokens, kMaxTopK);
  std::vector<std::vector<RecalledBlock>> ranked;  // One list per set.
  std::vector<uint32_t> set_layers;
  bool grouped = false;  // ranked[0] is already the plan (token groups).
  bool planned = false;  // result holds the sets already (score MASS).
  uint64_t now_frame;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    if (deleted_) return DeletedError();
    now_frame = state_.last_frame < 0 ? 0 : state_.last_frame;
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
    result.candidates = index_.all->size() - in_window;
    if (mass) {
      const BlockIndex& units = index_groups() ? *index_.groups : *index_.all;
      const uint64_t scores = uint64_t{vectors} * heads * units.size();
      if (scores > kMaxScoresPerRecall) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "recall would score ", vectors, " query vectors x ", heads,
            " heads x ", units.size(), " units of stream \"", id_,
            "\" = ", scores, " scores; at most ", kMaxScoresPerRecall,
            " per recall: send fewer query vectors"));
      }
      planned = true;
      RecallByMass(q, mean_query, eligible, &result);
    } else if (!q.per_layer && index_.groups != nullptr) {
      grouped = true;
      ranked.push_back(RecallGroups(mean_query.data(), q.signals, eligible,
                                    rank_k, result.budget_tokens, q.priority,
                                    &result.accel, &result.search_us));
    } else if (!q.per_layer) {
      ranked.push_back(RankCandidates(
          *index_.all, mean_query.data(), 0, summary_dim_, q.signals, eligible,
          rank_k, q.priority, &result.accel, &result.search_us));
    } else {
      for (size_t li = 0; li < config_.indexed_layers.size(); ++li) {
        uint32_t us = 0;
        // One indexed layer: its index is the all-layers one.
        const BlockIndex& layer =
            index_.layers.empty() ? *index_.all : *index_.layers[li];
        ranked.push_back(
            RankCandidates(layer, mean_query.data() + li * layer_dim_,
                           li * layer_dim_, layer_dim_, q.signals, eligible,
                           rank_k, q.priority, &result.accel, &us));
        result.search_us += us;
        set_layers.push_back(config_.indexed_layers[li]);
      }
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<std::pair<uint64_t, uint64_t>> feedback;
  if (planned) {  // Score MASS planned under the lock; count and feed back.
    auto account = [&](const std::vector<RecalledBlock>& blocks,
                       uint32_t tokens) {
      for (const auto& b : blocks) feedback.emplace_back(b.block.id, now_frame);
      recalled_blocks_.fetch_add(blocks.size(), std::memory_order_relaxed);
      recalled_tokens_.fetch_add(tokens, std::memory_order_relaxed);
    };
    account(result.blocks, result.total_tokens);
    for (const LayerRecallSet& set : result.layer_sets) {
      account(set.blocks, set.total_tokens);
    }
  }
  for (size_t i = 0; i < ranked.size(); ++i) {
    LayerRecallSet set;
    set.blocks = grouped ? std::move(ranked[i])
                         : PlanBudgetedRecall(ranked[i], result.budget_tokens,
                                              config_.gate_temperature);
    for (const auto& b : set.blocks) {
      set.total_tokens += RecalledTokens(b);
      feedback.emplace_back(b.block.id, now_frame);
    }
    recalled_blocks_.fetch_add(set.blocks.size(), std::memory_order_relaxed);
    recalled_tokens_.fetch_add(set.total_tokens, std::memory_order_relaxed);
    if (q.per_layer) {
      set.layer = set_layers[i];
      result.layer_sets.push_back(std::move(set));
    } else {
      result.blocks = std::move(set.blocks);
      result.total_tokens = set.total_tokens;
    }
  }
  if (!planned) result.plan_us = MicrosSince(t1);
  StageRecall(&result, q.priority);
  AccountAccel(result.accel);
  if (recalls_.fetch_add(1, std::memory_order_relaxed) % 16 == 15) {
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
  if (!feedback.empty()) {
    // Per-layer sets may share blocks: one hit per block and query.
    std::sort(feedback.begin(), feedback.end());
    feedback.erase(std::unique(feedback.begin(), feedback.end()),
                   feedback.end());
    {
      kvmem::MutexLock lock(&feedback_mu_);
      recalled_.insert(recalled_.end(), feedback.begin(), feedback.end());
    }
    ScheduleMaintenance();
  }
  result.total_us = MicrosSince(t0);
  RecordRecallLatency(result.total_us);
  return result;
}

}  // namespace kvmem
