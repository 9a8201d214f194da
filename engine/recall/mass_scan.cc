#include "engine/recall/mass_scan.h"

#include <algorithm>

#include "engine/index/dot.h"

namespace kvmem {
namespace {

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
    s.exact = true;
    s.bound.clear();
    s.dots.resize(rows.size() * heads);
    std::vector<float> one(heads);
    for (size_t i = 0; i < rows.size(); ++i) {
      UnitDots(view, rows[i], req.query->query.data() + j * dim, 1, one.data());
      for (uint32_t h = 0; h < heads; ++h) s.dots[h * rows.size() + i] = one[h];
    }
  }
}

}  // namespace

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

// The index's scan of every unit per query vector (or PoolScans).
void ScanUnits(const RecallView& view, const ScoreRequest& req, ScanMode mode,
               CallCost* cost, std::vector<SegmentScan>* scans)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const BlockIndex& index = view.indexes().units();
  const uint32_t dim = view.summary_dim();
  const RecallQuery& q = *req.query;
  const uint32_t vectors = static_cast<uint32_t>(q.query.size() / dim);
  scans->resize(vectors);
  // The modelled refinement: about the units that fill the budget.
  const SearchParams params{
      static_cast<uint32_t>(std::min<uint64_t>(index.size(), 64)), q.priority,
      mode};
  // The vectors in one pass over the codes (Accelerator::Scan of many
  // queries), split over the recall's helpers when it has them. Not through
  // a modelled backend: its calls queue on one modelled engine, and a
  // recall's own scans would count as waiting behind each other.
  const RecallHelpers helpers =
      req.accel->modelled() ? RecallHelpers{} : req.helpers;
  const size_t parts =
      helpers.on() ? std::min<size_t>(vectors, helpers.pool->helpers() + 1) : 1;
  std::vector<CallCost> costs(parts);
  std::vector<char> scanned(parts, 1);
  helpers.For(parts, [&](size_t p) {
    const size_t j0 = vectors * p / parts, j1 = vectors * (p + 1) / parts;
    scanned[p] = req.accel->Scan(index, q.query.data() + j0 * dim, j1 - j0,
                                 params, scans->data() + j0, &costs[p]);
  });
  if (cost != nullptr) {
    for (const CallCost& c : costs) *cost += c;
  }
  if (std::find(scanned.begin(), scanned.end(), 0) != scanned.end()) {
    PoolScans(view, req, cost, scans);
  }
}

}  // namespace kvmem
