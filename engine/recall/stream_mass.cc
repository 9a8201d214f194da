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
#include "engine/recall/mass_estimate.h"
#include "engine/recall/recall_planner.h"
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

// Keeps the best units by key until they hold `need` tokens; Threshold()
// is then the largest key t such that the units keyed >= t hold at least
// `need` tokens (-inf while all seen hold fewer). One pass; the heap only
// changes when a unit beats the current threshold.
class KeyThreshold {
 public:
  explicit KeyThreshold(uint64_t need) : need_(need) {}
  void Add(float key, uint32_t tokens) {
    if (held_ >= need_ && key <= heap_.front().first) return;
    heap_.emplace_back(key, tokens);
    std::push_heap(heap_.begin(), heap_.end(), Greater);
    held_ += tokens;
    // Drop the weakest while the others still hold enough.
    while (held_ - heap_.front().second >= need_) {
      held_ -= heap_.front().second;
      std::pop_heap(heap_.begin(), heap_.end(), Greater);
      heap_.pop_back();
    }
  }
  float Threshold() const {
    return held_ >= need_ ? heap_.front().first
                          : -std::numeric_limits<float>::infinity();
  }

 private:
  static bool Greater(const std::pair<float, uint32_t>& a,
                      const std::pair<float, uint32_t>& b) {
    return a.first > b.first;
  }
  const uint64_t need_;
  uint64_t held_ = 0;
  std::vector<std::pair<float, uint32_t>> heap_;  // Min-heap by key.
};

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
  const uint32_t hd = config_.geometry.head_dim;
  const uint32_t heads = summary_dim_ / hd;
  const uint32_t vectors = static_cast<uint32_t>(q.query.size() / summary_dim_);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const BlockIndex& index = index_groups() ? *index_.groups : *index_.all;
  const uint32_t shift = UnitShift();
  const uint64_t mask = (uint64_t{1} << shift) - 1;
  r->query_vectors = vectors;
  r->window_estimated = q.window_lse.empty();

  // Per-thread, so a recall allocates little once warm.
  struct Scratch {
    MassRows rows;
    std::vector<SegmentScan> scans;
  };
  Scratch& scratch = ThreadScratch<Scratch>();
  MassRows& rows = scratch.rows;
  rows.exact = true;
  rows.mean_query = &mean_query;
  std::vector<SegmentScan>& scans = scratch.scans;
  scans.resize(vectors);
  // The modelled refinement: about the units that fill the budget.
  const SearchParams params{
      static_cast<uint32_t>(std::min<uint64_t>(index.size(), 64)), q.priority};
  bool scanned = true;
  for (uint32_t j = 0; j < vectors && scanned; ++j) {
    scanned = accel().Scan(index, q.query.data() + j * summary_dim_, params,
                           &scans[j], &r->accel);
  }
  if (!scanned) {
    PoolScans(q, mean_query, eligible, r->budget_tokens, &r->accel, &scans);
  }
  r->search_us = MicrosSince(t0);
  const auto t1 = std::chrono::steady_clock::now();

  const size_t n = scans[0].ids.size();
  rows.scans = &scans;
  rows.tokens.resize(n);
  rows.role.resize(n);
  rows.counted.resize(n);
  rows.recallable.resize(n);
  const bool front_window = !q.window_lse.empty();
  const uint64_t* ids = scans[0].ids.data();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t b = ids[i] >> shift;
    const uint32_t tokens = unit_tokens_[UnitSlot(b, ids[i] & mask)];
    const CandidateRole role = b < eligible   ? CandidateRole::kRecall
                               : front_window ? CandidateRole::kIgnore
                                              : CandidateRole::kWindow;
    rows.tokens[i] = tokens;
    rows.role[i] = role;
    rows.counted[i] =
        role == CandidateRole::kIgnore ? 0.0f : static_cast<float>(tokens);
    rows.recallable[i] = role == CandidateRole::kRecall ? 1.0f : 0.0f;
  }
  for (const SegmentScan& s : scans) rows.exact &= s.bound.empty();
  // What attention reads besides the candidates: the front end's window, or
  // the open block as its mean key stands for it (the sealed blocks in the
  // window are kWindow rows).
  std::vector<float> window(static_cast<size_t>(vectors) * heads,
                            -std::numeric_limits<float>::infinity());
  if (front_window) {
    window = q.window_lse;
  } else if (open_mean_tokens_ > 0) {
    const float log_tokens = std::log(static_cast<float>(open_mean_tokens_));
    for (uint32_t j = 0; j < vectors; ++j) {
      const float* qj = q.query.data() + j * summary_dim_;
      for (uint32_t h = 0; h < heads; ++h) {
        window[j * heads + h] =
            log_tokens +
            scale * Dot(qj + h * hd, open_mean_.data() + h * hd, hd);
      }
    }
  }
  MassInputs in;
  in.heads = heads;
  in.logit_scale = scale;
  in.n = n;
  in.counted = rows.counted.data();
  for (const SegmentScan& s : scans) in.scans.push_back(&s);
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
  rows.scans = nullptr;
  rows.mean_query = nullptr;
  if (uint64_t{vectors} * heads * n > kKeepScratchFloats) {
    ReleaseThreadScratch<Scratch>();
  }
  r->plan_us = MicrosSince(t1);
}

LayerRecallSet Stream::FillByMass(const RecallQuery& q, size_t eligible,
                                  const MassRows& rows, size_t range,
                                  const RecallResult& r) const {
  const std::vector<SegmentScan>& scans = *rows.scans;
  const std::vector<uint64_t>& ids = scans[0].ids;
  struct Scratch {
    std::vector<float> lower, upper, dots, exact;
    std::vector<std::pair<uint32_t, float>> pending;  // Row, upper.
  };
  Scratch& scratch = ThreadScratch<Scratch>();
  const std::vector<float>& density = rows.est.density[range];
  const auto [h0, h1] = rows.ranges[range];
  const uint32_t shift = UnitShift();
  const uint64_t mask = (uint64_t{1} << shift) - 1;
  const uint32_t heads = summary_dim_ / config_.geometry.head_dim;
  const uint32_t vectors = static_cast<uint32_t>(scans.size());
  const float scale =
      1.0f / std::sqrt(static_cast<float>(config_.geometry.head_dim));
  const RecallWeights& w = config_.weights;
  const bool semantic = w.track > 0 || w.iou > 0 || w.scene > 0;
  // Ranking works on value = density * exp(semantic / model_weight), which
  // orders units as priority = model_weight * ln(density) + semantic does,
  // with no log per unit (model_weight > 0: 0 is defaulted to 1).
  // Semantic scores are known up front wherever they can be above 0, so
  // the bounds below hold: for the query's track candidates (tracks and IoU
  // are 0 elsewhere), and for every eligible block when the scene term
  // counts (any block's scene can match).
  std::unordered_map<uint64_t, float> block_semantic;
  auto semantic_of = [&](uint64_t b) {
    auto [it, fresh] = block_semantic.try_emplace(b, 0.0f);
    if (fresh) {
      it->second = SemanticScore(MatchSignals(blocks_[b].rec, q.signals), w);
    }
    return it->second;
  };
  auto known_semantic = [&](uint64_t b) {
    if (!semantic) return 0.0f;
    auto it = block_semantic.find(b);
    return it == block_semantic.end() ? 0.0f : it->second;
  };
  auto value_of = [&](float d, float sem) {
    return MassRankValue(d, sem, w.model);
  };
  if (w.scene > 0 && !q.signals.scene_embedding.empty()) {
    block_semantic.reserve(eligible);
    for (size_t b = 0; b < eligible; ++b) semantic_of(b);
  } else if (semantic) {
    for (size_t b : TrackCandidates(q.signals, eligible)) semantic_of(b);
  }

  // The lowest lower bound that could still be needed to fill the budget;
  // only units whose upper bound reaches it can be among the first taken.
  // Bounds of each unit's value (-1 for units that are not recallable).
  const size_t n = ids.size();
  std::vector<float>& lower = scratch.lower;
  std::vector<float>& upper = scratch.upper;
  lower.resize(n);
  upper.resize(n);
  const float* slack = rows.est.slack.data();
  const float* on = rows.recallable.data();
  for (size_t i = 0; i < n; ++i) {  // Branch-free: it vectorises.
    lower[i] = on[i] * (density[i] / slack[i]) + (on[i] - 1.0f);
    upper[i] = on[i] * (density[i] * slack[i]) + (on[i] - 1.0f);
  }
  if (semantic) {
    for (size_t i = 0; i < n; ++i) {
      if (upper[i] < 0) continue;
      const float sem = known_semantic(ids[i] >> shift);
      lower[i] = value_of(lower[i], sem);
      upper[i] = value_of(upper[i], sem);
    }
  }
  // theta: the largest value such that the units whose lower bound reaches
  // it hold the budget. Only units whose upper bound reaches theta can be
  // among the first taken. To avoid a heap over every unit: guess a floor
  // from a 1/16 sample (its best units holding 1/16 of the budget), take
  // the units whose upper bound reaches the floor, and compute theta over
  // them; that is exact when theta >= floor (every unit whose lower bound
  // reaches theta is then among them). Otherwise the floor is the sample's
  // threshold for the whole budget, which is never above theta.
  std::vector<std::pair<uint32_t, float>>& pending = scratch.pending;
  auto threshold_over = [&](float floor) {
    KeyThreshold threshold(r.budget_tokens);
    pending.clear();
    for (size_t i0 = 0; i0 < n; i0 += 16) {  // Most runs of 16 skip at once.
      const size_t i1 = std::min(n, i0 + 16);
      float top = upper[i0];
      for (size_t i = i0 + 1; i < i1; ++i) top = std::max(top, upper[i]);
      if (!(top >= floor)) continue;
      for (size_t i = i0; i < i1; ++i) {
        if (!(upper[i] >= floor)) continue;
        threshold.Add(lower[i], rows.tokens[i]);
        pending.emplace_back(static_cast<uint32_t>(i), upper[i]);
      }
    }
    return threshold.Threshold();
  };
  KeyThreshold guess((r.budget_tokens + 15) / 16), safe(r.budget_tokens);
  for (size_t i = 0; i < n; i += 16) {
    if (upper[i] < 0) continue;
    guess.Add(lower[i], rows.tokens[i]);
    safe.Add(lower[i], rows.tokens[i]);
  }
  const float floor = std::max(guess.Threshold(), 0.0f);
  float theta = threshold_over(floor);
  if (!(theta >= floor))
    theta = threshold_over(std::max(safe.Threshold(), 0.0f));

  struct Ranked {
    size_t row;
    float density, value;
  };
  std::vector<Ranked> first;
  std::vector<bool> ranked(ids.size(), false);
  for (const auto& [i, upper] : pending) {
    if (upper < theta) continue;
    ranked[i] = true;
    first.push_back({i, density[i], 0.0f});
  }
  if (!rows.exact) {  // Exact densities of the survivors.
    // Their summaries lie in their block records, scattered: ask for all
    // of them before reading any.
    for (const Ranked& x : first) {
      const char* p = reinterpret_cast<const char*>(UnitSummary(ids[x.row]));
      for (size_t b = 0; b < summary_dim_ * sizeof(float); b += 64) {
        __builtin_prefetch(p + b);
      }
    }
    std::vector<float>& dots = scratch.dots;
    std::vector<float>& exact = scratch.exact;
    dots.resize(first.size() * vectors * heads);
    exact.resize(first.size());
    for (size_t k = 0; k < first.size(); ++k) {
      UnitDots(ids[first[k].row], q.query.data(), vectors,
               dots.data() + k * vectors * heads);
    }
    CandidateDensities(rows.est, dots.data(), first.size(), h0, h1, scale,
                       exact.data());
    for (size_t k = 0; k < first.size(); ++k) first[k].density = exact[k];
  }
  for (Ranked& x : first) {
    x.value =
        value_of(x.density, semantic ? semantic_of(ids[x.row] >> shift) : 0.0f);
  }
  auto better = [&](const Ranked& a, const Ranked& b) {
    return a.value != b.value ? a.value > b.value : ids[a.row] > ids[b.row];
  };
  std::sort(first.begin(), first.end(), better);

  // Re-identification anchors (track weight > 0): each track the query
  // shows has the best unit of its most recent recallable block taken
  // first, so an object that re-enters brings back where it was last seen
  // even where attention alone would not (RoPE decay, look-alikes).
  if (w.track > 0 && !q.signals.detections.empty()) {
    std::vector<uint64_t> anchor_blocks;
    for (const Detection& d : q.signals.detections) {
      if (anchor_blocks.size() >= kAnchorTracks) break;
      auto it = track_blocks_.find(d.track_id);
      if (it == track_blocks_.end()) continue;
      for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) {
        if (*b >= eligible || !blocks_.Has(*b) ||
            blocks_[*b].rec.disk == DiskForm::kNone) {
          continue;
        }
        if (std::find(anchor_blocks.begin(), anchor_blocks.end(), *b) ==
            anchor_blocks.end()) {
          anchor_blocks.push_back(*b);
        }
        break;
      }
    }
    std::vector<size_t> best(anchor_blocks.size(), n);
    for (size_t i = 0; i < n && !anchor_blocks.empty(); ++i) {
      if (rows.role[i] != CandidateRole::kRecall) continue;
      const auto a = std::find(anchor_blocks.begin(), anchor_blocks.end(),
                               ids[i] >> shift);
      if (a == anchor_blocks.end()) continue;
      size_t& k = best[a - anchor_blocks.begin()];
      if (k == n || density[i] > density[k]) k = i;
    }
    std::vector<Ranked> front;
    for (size_t k : best) {
      if (k == n) continue;
      auto in_first = std::find_if(first.begin(), first.end(),
                                   [&](const Ranked& x) { return x.row == k; });
      if (in_first != first.end()) {
        front.push_back(*in_first);
        first.erase(in_first);
      } else {
        ranked[k] = true;
        front.push_back({k, density[k],
                         value_of(density[k], semantic_of(ids[k] >> shift))});
      }
    }
    first.insert(first.begin(), front.begin(), front.end());
  }

  // Fill: the ranked units, then what still fits from the rest, best first.
  FillState fill;
  std::vector<Ranked> taken;
  std::vector<FillUnit> units;
  for (const Ranked& x : first) {
    units.push_back({ids[x.row] >> shift, rows.tokens[x.row]});
  }
  std::vector<size_t> picked;
  FillBudget(units, r.budget_tokens, r.top_k, &fill, &picked);
  for (size_t p : picked) taken.push_back(first[p]);
  // Skipped units leave a gap smaller than the largest unit; the rest of
  // the candidates that fit it, by their scanned estimate.
  std::vector<Ranked> rest;
  if (fill.used < r.budget_tokens) {
    const uint64_t left = r.budget_tokens - fill.used;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (rows.role[i] != CandidateRole::kRecall || ranked[i] ||
          rows.tokens[i] > left) {
        continue;
      }
      rest.push_back({i, density[i],
                      value_of(density[i], known_semantic(ids[i] >> shift))});
    }
  }
  // Taking the best unit that fits, again and again, is one pass in rank
  // order: a unit that does not fit never will (the tokens left only
  // shrink, and a block not taken once top_k are cannot be taken later).
  if (!rest.empty()) {
    std::sort(rest.begin(), rest.end(), better);
    units.clear();
    for (const Ranked& x : rest) {
      units.push_back({ids[x.row] >> shift, rows.tokens[x.row]});
    }
    picked.clear();
    FillBudget(units, r.budget_tokens, r.top_k, &fill, &picked);
    for (size_t p : picked) taken.push_back(rest[p]);
  }

  // One RecalledBlock per block, in the order blocks were first taken
  // (fill.blocks); `slots` finds a block's place by binary search.
  LayerRecallSet set;
  set.blocks.resize(fill.blocks.size());
  std::vector<std::pair<uint64_t, uint32_t>> slots;
  slots.reserve(fill.blocks.size());
  for (uint32_t k = 0; k < fill.blocks.size(); ++k) {
    slots.emplace_back(fill.blocks[k], k);
  }
  std::sort(slots.begin(), slots.end());
  std::vector<uint64_t> chosen(fill.blocks.size(), 0);  // Group masks.
  std::vector<bool> started(fill.blocks.size(), false);
  static_assert(kMaxGroupsPerBlock <= 64, "a group mask has 64 bits");
  for (const Ranked& x : taken) {
    const uint64_t unit = ids[x.row], b = unit >> shift;
    const uint32_t k =
        std::lower_bound(slots.begin(), slots.end(), std::make_pair(b, 0u))
            ->second;
    RecalledBlock& rb = set.blocks[k];
    if (!started[k]) {  // Its best-ranked unit scores the block.
      started[k] = true;
      const BlockEntry& e = blocks_[b];
      rb.block = e.rec.info;
      rb.block.tier = TierOf(e);
      rb.score = Dot(rows.mean_query->data(), UnitSummary(unit), summary_dim_);
      rb.semantic_score = known_semantic(b);
      // A density that underflowed to 0 counts as the smallest float, so
      // the priority stays finite (ln: -103.3).
      rb.priority =
          w.model * std::log(std::max(
                        x.density, std::numeric_limits<float>::denorm_min())) +
          rb.semantic_score;
      rb.was_staged = e.staged;
    }
    rb.mass += x.density * static_cast<float>(rows.tokens[x.row]);
    chosen[k] |= uint64_t{1} << (unit & mask);
    set.total_tokens += rows.tokens[x.row];
  }
  if (index_groups()) {
    for (size_t k = 0; k < set.blocks.size(); ++k) {
      RecalledBlock& rb = set.blocks[k];
      const BlockRecord& rec = blocks_[rb.block.id].rec;
      rb.token_offsets.reserve(rec.token_group.size());
      for (uint32_t t = 0; t < rec.token_group.size(); ++t) {
        if (chosen[k] >> rec.token_group[t] & 1) rb.token_offsets.push_back(t);
      }
      if (rb.token_offsets.size() == rb.block.token_count) {
        rb.token_offsets.clear();
      }
    }
  }
  AssignGateWeights(&set.blocks, config_.gate_temperature, ScoreMode::kMass);
  if (scratch.dots.size() + 2 * n > kKeepScratchFloats) {
    ReleaseThreadScratch<Scratch>();
  }
  return set;
}

}  // namespace kvmem
