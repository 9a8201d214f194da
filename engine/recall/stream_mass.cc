// Stream: recall by estimated attention mass per head (score MASS; the
// formula is in mass_estimate.h and kvmem.v1.ScoreMode).
//
// One recall: scan the candidate index once per query vector (every unit's
// score per head: int8 with proven bounds on Progressive, exact on Flat),
// estimate every unit's attention mass per token with each head's softmax
// normaliser, find the lowest lower bound that could still be needed to fill
// the budget, rescore exactly the units whose upper bound reaches it, rank
// those by priority = model_weight * ln(mass per token) + semantic, fill the
// budget, and fill what is left with the best remaining units that fit.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "base/thread_scratch.h"
#include "engine/index/dot.h"
#include "engine/recall/mass_bounds.h"
#include "engine/recall/mass_estimate.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/semantic_cache.h"
#include "engine/recall/token_groups.h"
#include "engine/stream/signals.h"
#include "engine/stream/stream.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

// Tracks of a query that anchor a recall (re-identification).
constexpr size_t kAnchorTracks = 8;

// Per-thread scratch is kept between recalls up to this many floats (32 MiB);
// a larger recall frees its scratch when it is done.
constexpr uint64_t kKeepScratchFloats = uint64_t{1} << 23;

uint32_t MicrosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - t0)
          .count());
}

// The token group of a unit id (block << shift | group).
uint32_t GroupOf(uint64_t unit, uint32_t shift) {
  return static_cast<uint32_t>(unit & ((uint64_t{1} << shift) - 1));
}

// The units no first pass ranked that still fit `left` tokens, with their
// scanned density and known semantic score.
std::vector<PlanUnit> RestUnits(const std::vector<uint64_t>& ids,
                                uint32_t shift,
                                const std::vector<CandidateRole>& role,
                                const std::vector<uint32_t>& tokens,
                                const std::vector<float>& density,
                                const std::vector<bool>& ranked,
                                const SemanticCache& sem, uint32_t left) {
  std::vector<PlanUnit> units;
  for (uint32_t i = 0; i < ids.size(); ++i) {
    if (role[i] != CandidateRole::kRecall || ranked[i] || tokens[i] > left) {
      continue;
    }
    const uint64_t b = ids[i] >> shift;
    units.push_back(
        {b, GroupOf(ids[i], shift), tokens[i], density[i], sem.Known(b)});
  }
  return units;
}

}  // namespace

// The scanned candidates, shared by the sets of one recall.
struct Stream::MassRows {
  const std::vector<SegmentScan>* scans = nullptr;
  std::vector<uint32_t> tokens;
  std::vector<CandidateRole> role;
  std::vector<float> counted;     // MassInputs::counted.
  std::vector<float> recallable;  // 1 for kRecall rows, else 0.
  MassEstimate est;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  const std::vector<float>* mean_query = nullptr;  // The vectors' mean.
  bool exact = true;                               // The scans' dots are exact.
};

const float* Stream::UnitSummary(uint64_t unit) const {
  const BlockRecord& rec = blocks_[unit >> UnitShift()].rec;
  return index_groups() ? rec.group_summaries.data() +
                              (unit & (kGroupStride - 1)) * summary_dim_
                        : rec.summary.data();
}

void Stream::UnitDots(uint64_t unit, const float* query, uint32_t vectors,
                      float* out) const {
  const uint32_t hd = config_.geometry.head_dim, heads = summary_dim_ / hd;
  const float* s = UnitSummary(unit);
  for (uint32_t j = 0; j < vectors; ++j) {
    const float* q = query + static_cast<size_t>(j) * summary_dim_;
    for (uint32_t h = 0; h < heads; ++h) {
      out[j * heads + h] = Dot(q + h * hd, s + h * hd, hd);
    }
  }
}

void Stream::PoolScans(const RecallQuery& q,
                       const std::vector<float>& mean_query, size_t eligible,
                       uint32_t budget, CallCost* cost,
                       std::vector<SegmentScan>* scans) const {
  const BlockIndex& index = index_groups() ? *index_.groups : *index_.all;
  const uint32_t shift = UnitShift();
  std::vector<uint64_t> rows;
  // Every unit of the blocks in the window (for the window estimate), then
  // the index's best for the mean query.
  for (size_t b = eligible; b < blocks_.size(); ++b) {
    if (blocks_[b].rec.disk == DiskForm::kNone) continue;
    for (uint32_t g = 0; g < UnitsPerBlock(); ++g) {
      if (unit_tokens_[UnitSlot(b, g)] > 0) {
        rows.push_back((b << shift) + g);
      }
    }
  }
  const size_t window_rows = rows.size();
  const uint32_t k = static_cast<uint32_t>(std::min<uint64_t>(
      index.size(), std::max<uint64_t>(256, budget) + window_rows));
  for (const ScoredId& h :
       accel().Search(index, mean_query.data(), {k, q.priority}, cost)) {
    if ((h.id >> shift) < eligible) rows.push_back(h.id);
  }
  const uint32_t heads = summary_dim_ / config_.geometry.head_dim;
  for (size_t j = 0; j < scans->size(); ++j) {
    SegmentScan& s = (*scans)[j];
    s.segments = heads;
    s.ids = rows;
    s.bound.clear();
    s.dots.resize(rows.size() * heads);
    std::vector<float> one(heads);
    for (size_t i = 0; i < rows.size(); ++i) {
      UnitDots(rows[i], q.query.data() + j * summary_dim_, 1, one.data());
      for (uint32_t h = 0; h < heads; ++h) s.dots[h * rows.size() + i] = one[h];
    }
  }
}

void Stream::RecallByMass(const RecallQuery& q,
                          const std::vector<float>& mean_query, size_t eligible,
                          RecallResult* r) const {
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t heads = summary_dim_ / config_.geometry.head_dim;
  const uint32_t vectors = static_cast<uint32_t>(q.query.size() / summary_dim_);
  r->query_vectors = vectors;
  r->window_estimated = q.window_lse.empty();
  // Per-thread, so a recall allocates little once warm.
  struct Scratch {
    MassRows rows;
    std::vector<SegmentScan> scans;
  };
  Scratch& scratch = ThreadScratch<Scratch>();
  MassRows& rows = scratch.rows;
  rows.mean_query = &mean_query;
  ScanUnits(q, mean_query, eligible, r, &scratch.scans);
  r->search_us = MicrosSince(t0);
  const auto t1 = std::chrono::steady_clock::now();
  rows.scans = &scratch.scans;
  ClassifyRows(q, eligible, &rows);
  const std::vector<float> window = WindowLse(q);
  MassInputs in;
  in.heads = heads;
  in.logit_scale =
      1.0f / std::sqrt(static_cast<float>(config_.geometry.head_dim));
  in.n = rows.tokens.size();
  in.counted = rows.counted.data();
  for (const SegmentScan& s : scratch.scans) in.scans.push_back(&s);
  in.window_lse = window.data();
  const uint32_t kv = config_.geometry.kv_heads;
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
  rows.est = EstimateMass(in);
  for (size_t ri = 0; ri < rows.ranges.size(); ++ri) {
    LayerRecallSet set = FillByMass(q, eligible, rows, ri, *r);
    float mass = 0;
    for (const RecalledBlock& b : set.blocks) mass += b.mass;
    if (q.per_layer || q.per_head) {
      const uint32_t h0 = rows.ranges[ri].first;
      set.layer = config_.indexed_layers[h0 / kv];
      set.kv_head = q.per_head ? h0 % kv : 0;
      r->recalled_mass += mass / static_cast<float>(rows.ranges.size());
      r->layer_sets.push_back(std::move(set));
    } else {
      r->recalled_mass = mass;
      r->blocks = std::move(set.blocks);
      r->total_tokens = set.total_tokens;
    }
  }
  const uint64_t n = rows.tokens.size();
  rows.scans = nullptr;
  rows.mean_query = nullptr;
  if (uint64_t{vectors} * heads * n > kKeepScratchFloats) {
    ReleaseThreadScratch<Scratch>();
  }
  r->plan_us = MicrosSince(t1);
}

void Stream::ScanUnits(const RecallQuery& q,
                       const std::vector<float>& mean_query, size_t eligible,
                       RecallResult* r, std::vector<SegmentScan>* scans) const {
  const BlockIndex& index = index_groups() ? *index_.groups : *index_.all;
  const uint32_t vectors = static_cast<uint32_t>(q.query.size() / summary_dim_);
  scans->resize(vectors);
  // The modelled refinement: about the units that fill the budget.
  const SearchParams params{
      static_cast<uint32_t>(std::min<uint64_t>(index.size(), 64)), q.priority};
  bool scanned = true;
  for (uint32_t j = 0; j < vectors && scanned; ++j) {
    scanned = accel().Scan(index, q.query.data() + j * summary_dim_, params,
                           &(*scans)[j], &r->accel);
  }
  if (!scanned) {
    PoolScans(q, mean_query, eligible, r->budget_tokens, &r->accel, scans);
  }
}

void Stream::ClassifyRows(const RecallQuery& q, size_t eligible,
                          MassRows* rows) const {
  const std::vector<SegmentScan>& scans = *rows->scans;
  const size_t n = scans[0].ids.size();
  const uint32_t shift = UnitShift();
  rows->tokens.resize(n);
  rows->role.resize(n);
  rows->counted.resize(n);
  rows->recallable.resize(n);
  const bool front_window = !q.window_lse.empty();
  const uint64_t* ids = scans[0].ids.data();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t b = ids[i] >> shift;
    const uint32_t tokens = unit_tokens_[UnitSlot(b, GroupOf(ids[i], shift))];
    const CandidateRole role = b < eligible   ? CandidateRole::kRecall
                               : front_window ? CandidateRole::kIgnore
                                              : CandidateRole::kWindow;
    rows->tokens[i] = tokens;
    rows->role[i] = role;
    rows->counted[i] =
        role == CandidateRole::kIgnore ? 0.0f : static_cast<float>(tokens);
    rows->recallable[i] = role == CandidateRole::kRecall ? 1.0f : 0.0f;
  }
  rows->exact = true;
  for (const SegmentScan& s : scans) rows->exact &= s.bound.empty();
}

std::vector<float> Stream::WindowLse(const RecallQuery& q) const {
  // What attention reads besides the candidates: the front end's window, or
  // the open block as its mean key stands for it (the sealed blocks in the
  // window are kWindow rows).
  if (!q.window_lse.empty()) return q.window_lse;
  const uint32_t hd = config_.geometry.head_dim, heads = summary_dim_ / hd;
  const uint32_t vectors = static_cast<uint32_t>(q.query.size() / summary_dim_);
  std::vector<float> window(static_cast<size_t>(vectors) * heads,
                            -std::numeric_limits<float>::infinity());
  if (open_mean_tokens_ == 0) return window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float log_tokens = std::log(static_cast<float>(open_mean_tokens_));
  for (uint32_t j = 0; j < vectors; ++j) {
    const float* qj = q.query.data() + j * summary_dim_;
    for (uint32_t h = 0; h < heads; ++h) {
      window[j * heads + h] =
          log_tokens + scale * Dot(qj + h * hd, open_mean_.data() + h * hd, hd);
    }
  }
  return window;
}

LayerRecallSet Stream::FillByMass(const RecallQuery& q, size_t eligible,
                                  const MassRows& rows, size_t range,
                                  const RecallResult& r) const {
  const std::vector<uint64_t>& ids = (*rows.scans)[0].ids;
  const size_t n = ids.size();
  struct Scratch {
    std::vector<float> lower, upper, dots, exact;
    std::vector<std::pair<uint32_t, float>> pending;  // Row, upper.
  };
  Scratch& scratch = ThreadScratch<Scratch>();
  const std::vector<float>& density = rows.est.density[range];
  const uint32_t shift = UnitShift();
  const RecallWeights& w = config_.weights;
  SemanticCache sem = MassSemantics(q, eligible);

  // Bounds of each unit's value (-1 for units that are not recallable); only
  // units whose upper bound reaches theta can be among the first taken.
  ValueBounds(density.data(), rows.est.slack.data(), rows.recallable.data(),
              ids, shift, sem, w.model, &scratch.lower, &scratch.upper);
  const float theta = BudgetThreshold(scratch.lower, scratch.upper, rows.tokens,
                                      r.budget_tokens, &scratch.pending);
  std::vector<uint32_t> first_rows;
  std::vector<bool> ranked(n, false);
  for (const auto& [i, upper] : scratch.pending) {
    if (upper < theta) continue;
    ranked[i] = true;
    first_rows.push_back(i);
  }
  std::vector<float> first_density(first_rows.size());
  for (size_t k = 0; k < first_rows.size(); ++k) {
    first_density[k] = density[first_rows[k]];
  }
  if (!rows.exact) {
    ExactDensities(q, rows, range, first_rows, &scratch.dots, &scratch.exact,
                   &first_density);
  }

  RecallPlanner planner({ScoreMode::kMass, r.budget_tokens, r.top_k, w.model,
                         1.0f, config_.gate_temperature});
  std::vector<PlanUnit> units;
  units.reserve(first_rows.size());
  for (size_t k = 0; k < first_rows.size(); ++k) {
    const uint64_t unit = ids[first_rows[k]], b = unit >> shift;
    units.push_back({b, GroupOf(unit, shift), rows.tokens[first_rows[k]],
                     first_density[k], sem.on() ? sem.Get(b) : 0.0f});
  }
  planner.Rank(&units);
  if (w.track > 0 && !q.signals.detections.empty()) {
    PutAnchorsFirst(q, eligible, rows, density, &sem, &ranked, &units);
  }
  planner.Take(units);
  // Skipped units leave a gap smaller than the largest unit; the rest of
  // the candidates that fit it, by their scanned estimate. Taking the best
  // unit that fits, again and again, is one pass in rank order: a unit that
  // does not fit never will (the tokens left only shrink, and a block not
  // taken once top_k are cannot be taken later).
  if (!planner.full()) {
    units = RestUnits(ids, shift, rows.role, rows.tokens, density, ranked, sem,
                      planner.tokens_left());
    planner.Rank(&units);
    planner.Take(units);
  }
  const RecallPlan plan = planner.Finish();
  LayerRecallSet set;
  set.blocks = ToRecalled(plan, index_groups(), rows.mean_query->data());
  set.total_tokens = plan.total_tokens;
  if (scratch.dots.size() + 2 * n > kKeepScratchFloats) {
    ReleaseThreadScratch<Scratch>();
  }
  return set;
}

SemanticCache Stream::MassSemantics(const RecallQuery& q,
                                    size_t eligible) const {
  const RecallWeights& w = config_.weights;
  const bool semantic = w.track > 0 || w.iou > 0 || w.scene > 0;
  SemanticCache sem(semantic, [this, &q, &w](uint64_t b) {
    return SemanticScore(MatchSignals(blocks_[b].rec, q.signals), w);
  });
  // Semantic scores are known up front wherever they can be above 0, so
  // the value bounds hold: for the query's track candidates (tracks and IoU
  // are 0 elsewhere), and for every eligible block when the scene term
  // counts (any block's scene can match).
  if (w.scene > 0 && !q.signals.scene_embedding.empty()) {
    sem.Reserve(eligible);
    for (size_t b = blocks_.first(); b < eligible; ++b) sem.Get(b);
  } else if (semantic) {
    for (size_t b : TrackCandidates(q.signals, eligible)) sem.Get(b);
  }
  return sem;
}

void Stream::ExactDensities(const RecallQuery& q, const MassRows& rows,
                            size_t range, const std::vector<uint32_t>& first,
                            std::vector<float>* dots, std::vector<float>* exact,
                            std::vector<float>* density) const {
  const std::vector<uint64_t>& ids = (*rows.scans)[0].ids;
  const uint32_t heads = summary_dim_ / config_.geometry.head_dim;
  const uint32_t vectors = static_cast<uint32_t>(rows.scans->size());
  const float scale =
      1.0f / std::sqrt(static_cast<float>(config_.geometry.head_dim));
  // Their summaries lie in their block records, scattered: ask for all of
  // them before reading any.
  for (uint32_t row : first) {
    const char* p = reinterpret_cast<const char*>(UnitSummary(ids[row]));
    for (size_t b = 0; b < summary_dim_ * sizeof(float); b += 64) {
      __builtin_prefetch(p + b);
    }
  }
  dots->resize(first.size() * vectors * heads);
  exact->resize(first.size());
  for (size_t k = 0; k < first.size(); ++k) {
    UnitDots(ids[first[k]], q.query.data(), vectors,
             dots->data() + k * vectors * heads);
  }
  const auto [h0, h1] = rows.ranges[range];
  CandidateDensities(rows.est, dots->data(), first.size(), h0, h1, scale,
                     exact->data());
  for (size_t k = 0; k < first.size(); ++k) (*density)[k] = (*exact)[k];
}

void Stream::PutAnchorsFirst(const RecallQuery& q, size_t eligible,
                             const MassRows& rows,
                             const std::vector<float>& density,
                             SemanticCache* sem, std::vector<bool>* ranked,
                             std::vector<PlanUnit>* units) const {
  // Re-identification anchors (track weight > 0): each track the query
  // shows has the best unit of its most recent recallable block taken
  // first, so an object that re-enters brings back where it was last seen
  // even where attention alone would not (RoPE decay, look-alikes).
  const std::vector<uint64_t>& ids = (*rows.scans)[0].ids;
  const size_t n = ids.size();
  const uint32_t shift = UnitShift();
  const std::vector<uint64_t> anchor_blocks = AnchorBlocks(q, eligible);
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
    auto in_first = std::find_if(
        units->begin(), units->end(),
        [&](const PlanUnit& u) { return u.block == b && u.group == g; });
    if (in_first != units->end()) {
      front.push_back(*in_first);
      units->erase(in_first);
    } else {
      (*ranked)[k] = true;
      front.push_back({b, g, rows.tokens[k], density[k], sem->Get(b)});
    }
  }
  units->insert(units->begin(), front.begin(), front.end());
}

std::vector<uint64_t> Stream::AnchorBlocks(const RecallQuery& q,
                                           size_t eligible) const {
  std::vector<uint64_t> anchors;
  for (const Detection& d : q.signals.detections) {
    if (anchors.size() >= kAnchorTracks) break;
    auto it = track_blocks_.find(d.track_id);
    if (it == track_blocks_.end()) continue;
    for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) {
      if (*b >= eligible || !blocks_.Has(*b) ||
          blocks_[*b].rec.disk == DiskForm::kNone) {
        continue;
      }
      if (std::find(anchors.begin(), anchors.end(), *b) == anchors.end()) {
        anchors.push_back(*b);
      }
      break;
    }
  }
  return anchors;
}

}  // namespace kvmem
