#include "engine/recall/mass_scorer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/thread_scratch.h"
#include "base/timing.h"
#include "engine/index/dot.h"
#include "engine/recall/mass_bounds.h"
#include "engine/recall/mass_estimate.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/semantic_cache.h"
#include "engine/recall/track_candidates.h"
#include "engine/signals/semantics.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

// Tracks of a query that anchor a recall (re-identification).
constexpr size_t kAnchorTracks = 8;

// Per-thread scratch is kept between recalls up to this many floats (32 MiB);
// a larger recall frees its scratch when it is done.
constexpr uint64_t kKeepScratchFloats = uint64_t{1} << 23;

// The token group of a unit id (block << shift | group).
uint32_t GroupOf(uint64_t unit, uint32_t shift) {
  return static_cast<uint32_t>(unit & ((uint64_t{1} << shift) - 1));
}

// The scanned candidates, shared by the sets of one recall (per-thread
// scratch: a recall allocates little once warm).
struct MassRows {
  std::vector<SegmentScan> scans;  // One per query vector.
  std::vector<uint32_t> tokens;
  std::vector<CandidateRole> role;
  std::vector<float> counted;     // MassInputs::counted.
  std::vector<float> recallable;  // 1 for kRecall rows, else 0.
  MassEstimate est;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool exact = true;  // The scans' dots are exact.
  const std::vector<uint64_t>& ids() const { return scans[0].ids; }
};

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

// Exact per-head dots of a unit's summary with each of the `vectors` query
// vectors: out[vector * heads + head].
void UnitDots(const RecallView& view, uint64_t unit, const float* query,
              uint32_t vectors, float* out)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const uint32_t dim = view.summary_dim();
  const uint32_t hd = view.config().geometry.head_dim, heads = dim / hd;
  const float* s = view.UnitSummary(unit);
  for (uint32_t j = 0; j < vectors; ++j) {
    const float* q = query + static_cast<size_t>(j) * dim;
    for (uint32_t h = 0; h < heads; ++h) {
      out[j * heads + h] = Dot(q + h * hd, s + h * hd, hd);
    }
  }
}

// Candidate rows for index kinds that cannot scan (FAISS approximate): the
// index's top results for the mean query plus the hot window's units,
// scored exactly from their summaries.
void PoolScans(const RecallView& view, const ScoreRequest& req, CallCost* cost,
               std::vector<SegmentScan>* scans)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const BlockIndex& index = view.indexes().units();
  const BlockTable& blocks = view.blocks();
  const uint32_t shift = view.unit_shift();
  std::vector<uint64_t> rows;
  // Every unit of the blocks in the window (for the window estimate), then
  // the index's best for the mean query.
  for (size_t b = req.eligible; b < blocks.size(); ++b) {
    if (blocks[b].rec.disk == DiskForm::kNone) continue;
    for (uint32_t g = 0; g < view.units_per_block(); ++g) {
      if (view.UnitTokens(b, g) > 0) rows.push_back((b << shift) + g);
    }
  }
  const size_t window_rows = rows.size();
  const uint32_t k = static_cast<uint32_t>(std::min<uint64_t>(
      index.size(), std::max<uint64_t>(256, req.budget.tokens) + window_rows));
  for (const ScoredId& h : req.accel->Search(index, req.mean_query->data(),
                                             {k, req.query->priority}, cost)) {
    if ((h.id >> shift) < req.eligible) rows.push_back(h.id);
  }
  const uint32_t dim = view.summary_dim();
  const uint32_t heads = dim / view.config().geometry.head_dim;
  for (size_t j = 0; j < scans->size(); ++j) {
    SegmentScan& s = (*scans)[j];
    s.segments = heads;
    s.ids = rows;
    s.bound.clear();
    s.dots.resize(rows.size() * heads);
    std::vector<float> one(heads);
    for (size_t i = 0; i < rows.size(); ++i) {
      UnitDots(view, rows[i], req.query->query.data() + j * dim, 1, one.data());
      for (uint32_t h = 0; h < heads; ++h) s.dots[h * rows.size() + i] = one[h];
    }
  }
}

// The index's scan of every unit per query vector (or PoolScans).
void ScanUnits(const RecallView& view, const ScoreRequest& req, CallCost* cost,
               std::vector<SegmentScan>* scans)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const BlockIndex& index = view.indexes().units();
  const uint32_t dim = view.summary_dim();
  const RecallQuery& q = *req.query;
  const uint32_t vectors = static_cast<uint32_t>(q.query.size() / dim);
  scans->resize(vectors);
  // The modelled refinement: about the units that fill the budget.
  const SearchParams params{
      static_cast<uint32_t>(std::min<uint64_t>(index.size(), 64)), q.priority};
  bool scanned = true;
  for (uint32_t j = 0; j < vectors && scanned; ++j) {
    scanned = req.accel->Scan(index, q.query.data() + j * dim, params,
                              &(*scans)[j], cost);
  }
  if (!scanned) PoolScans(view, req, cost, scans);
}

// Each scanned unit's tokens and role (recallable, window, ignored).
void ClassifyRows(const RecallView& view, const ScoreRequest& req,
                  MassRows* rows) ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const size_t n = rows->ids().size();
  const uint32_t shift = view.unit_shift();
  rows->tokens.resize(n);
  rows->role.resize(n);
  rows->counted.resize(n);
  rows->recallable.resize(n);
  const bool front_window = !req.query->window_lse.empty();
  const uint64_t* ids = rows->ids().data();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t b = ids[i] >> shift;
    const uint32_t tokens = view.UnitTokens(b, GroupOf(ids[i], shift));
    const CandidateRole role = b < req.eligible ? CandidateRole::kRecall
                               : front_window   ? CandidateRole::kIgnore
                                                : CandidateRole::kWindow;
    rows->tokens[i] = tokens;
    rows->role[i] = role;
    rows->counted[i] =
        role == CandidateRole::kIgnore ? 0.0f : static_cast<float>(tokens);
    rows->recallable[i] = role == CandidateRole::kRecall ? 1.0f : 0.0f;
  }
  rows->exact = true;
  for (const SegmentScan& s : rows->scans) rows->exact &= s.bound.empty();
}

// [vector][head]: what attention reads besides the candidates: the front
// end's window, or the open block as its mean key stands for it (the
// sealed blocks in the window are kWindow rows).
std::vector<float> WindowLse(const RecallView& view, const RecallQuery& q)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  if (!q.window_lse.empty()) return q.window_lse;
  const uint32_t dim = view.summary_dim();
  const uint32_t hd = view.config().geometry.head_dim, heads = dim / hd;
  const uint32_t vectors = static_cast<uint32_t>(q.query.size() / dim);
  std::vector<float> window(static_cast<size_t>(vectors) * heads,
                            -std::numeric_limits<float>::infinity());
  const OpenMean& open = view.open_mean();
  if (open.tokens == 0) return window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float log_tokens = std::log(static_cast<float>(open.tokens));
  for (uint32_t j = 0; j < vectors; ++j) {
    const float* qj = q.query.data() + j * dim;
    for (uint32_t h = 0; h < heads; ++h) {
      window[j * heads + h] =
          log_tokens + scale * Dot(qj + h * hd, open.mean.data() + h * hd, hd);
    }
  }
  return window;
}

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

// The most recent recallable block of each of the query's tracks (at most
// kAnchorTracks).
std::vector<uint64_t> AnchorBlocks(const RecallView& view, const RecallQuery& q,
                                   size_t eligible)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  std::vector<uint64_t> anchors;
  for (const Detection& d : q.signals.detections) {
    if (anchors.size() >= kAnchorTracks) break;
    for (uint64_t b : RecentTrackBlocks(view, d.track_id, eligible, 1)) {
      if (std::find(anchors.begin(), anchors.end(), b) == anchors.end()) {
        anchors.push_back(b);
      }
    }
  }
  return anchors;
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
    auto in_first = std::find_if(
        units->begin(), units->end(),
        [&](const PlanUnit& u) { return u.block == b && u.group == g; });
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
    if (rows.role[i] != CandidateRole::kRecall || set.ranked[i] ||
        rows.tokens[i] > left) {
      continue;
    }
    const uint64_t b = ids[i] >> shift;
    units.push_back({b, GroupOf(ids[i], shift), rows.tokens[i], density[i],
                     set.sem.Known(b)});
  }
  return units;
}

class MassScorer final : public RecallScorer {
 public:
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

  const std::string name_{kMassScorer};
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
        " per recall: send fewer query vectors"));
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
  ScanUnits(view, req, cost, &rows.scans);
  out->search_us = WholeMicrosSince(t0);
  ClassifyRows(view, req, &rows);
  const std::vector<float> window = WindowLse(view, q);
  MassInputs in;
  in.heads = heads;
  in.logit_scale =
      1.0f / std::sqrt(static_cast<float>(config.geometry.head_dim));
  in.n = rows.tokens.size();
  in.counted = rows.counted.data();
  for (const SegmentScan& s : rows.scans) in.scans.push_back(&s);
  in.window_lse = window.data();
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
  rows.est = EstimateMass(in);
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

ScoredSet MassScorer::RankSet(const RecallView& view, const ScoreRequest& req,
                              const PlanPolicy& policy, const MassRows& rows,
                              size_t range) const {
  const std::vector<uint64_t>& ids = rows.ids();
  const size_t n = ids.size();
  struct Scratch {
    std::vector<float> lower, upper, dots, exact;
    std::vector<std::pair<uint32_t, float>> pending;  // Row, upper.
  };
  Scratch& scratch = ThreadScratch<Scratch>();
  const std::vector<float>& density = rows.est.density[range];
  const uint32_t shift = view.unit_shift();
  const RecallWeights& w = view.config().weights;
  auto set = std::make_shared<SetState>(
      SetState{MassSemantics(view, *req.query, req.eligible),
               std::vector<bool>(n, false)});

  // Bounds of each unit's value (-1 for units that are not recallable); only
  // units whose upper bound reaches theta can be among the first taken.
  ValueBounds(density.data(), rows.est.slack.data(), rows.recallable.data(),
              ids, shift, set->sem, w.model, &scratch.lower, &scratch.upper);
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
  ScoredSet out;
  out.ranked.reserve(first_rows.size());
  for (size_t k = 0; k < first_rows.size(); ++k) {
    const uint64_t unit = ids[first_rows[k]], b = unit >> shift;
    out.ranked.push_back({b, GroupOf(unit, shift), rows.tokens[first_rows[k]],
                          first_density[k],
                          set->sem.on() ? set->sem.Get(b) : 0.0f});
  }
  RecallPlanner(policy).Rank(&out.ranked);
  if (w.track > 0 && !req.query->signals.detections.empty()) {
    PutAnchorsFirst(view, req, rows, density, set.get(), &out.ranked);
  }
  // Skipped units leave a gap smaller than the largest unit; the rest of
  // the candidates that fit it, by their scanned estimate. Taking the best
  // unit that fits, again and again, is one pass in rank order: a unit that
  // does not fit never will (the tokens left only shrink, and a block not
  // taken once top_k are cannot be taken later).
  out.more = [&rows, &density, shift, set](uint32_t left) {
    return RestUnits(rows, shift, density, *set, left);
  };
  if (scratch.dots.size() + 2 * n > kKeepScratchFloats) {
    ReleaseThreadScratch<Scratch>();
  }
  return out;
}

}  // namespace

std::unique_ptr<RecallScorer> NewMassScorer() {
  return std::make_unique<MassScorer>();
}

}  // namespace kvmem
