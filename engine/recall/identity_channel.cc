#include "engine/recall/identity_channel.h"

#include <algorithm>
#include <cmath>

#include "base/thread_scratch.h"
#include "engine/index/dot.h"
#include "engine/recall/top_select.h"
#include "engine/recall/track_candidates.h"

namespace kvmem {

float IdentityShare(const RecallWeights& w, const RecallQuery& q) {
  return q.identity_share.value_or(
      w.identity_share.value_or(kDefaultIdentityShare));
}

IdentitySplit SplitIdentity(uint32_t budget, float share, size_t anchors) {
  IdentitySplit s;
  s.identity = static_cast<uint32_t>(
      std::min<double>(budget, std::lround(double(share) * budget)));
  s.track = anchors == 0 ? 0 : (s.identity + 1) / 2;
  return s;
}

std::vector<uint64_t> AnchorBlocks(const RecallView& view, const RecallQuery& q,
                                   size_t eligible) {
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

void PrepareIdentity(const RecallView& view, const ScoreRequest& req,
                     MassRows* rows) {
  rows->anchors = AnchorBlocks(view, *req.query, req.eligible);
  const size_t n = rows->tokens.size(), H = rows->est.heads;
  struct Scratch {
    SegmentScan mean;
    std::vector<float> counted;
    std::vector<const float*> vectors;
  };
  Scratch& s = ThreadScratch<Scratch>();
  // The mean vector's dots: the weighted mean of the vectors' (a logit is
  // linear in the query).
  s.mean.segments = static_cast<uint32_t>(H);
  s.mean.exact = rows->exact;
  s.mean.bound.clear();
  s.mean.dots.assign(n * H, 0.0f);
  s.vectors.clear();
  for (const SegmentScan& scan : rows->scans)
    s.vectors.push_back(scan.dots.data());
  AxpyRows(rows->est.weight.data(), s.vectors.data(), s.vectors.size(),
           s.mean.dots.data(), n * H);
  // The window counts in its normaliser too (the front end's window_lse
  // speaks of its own vectors only). Without window_lse the recall sealed
  // any full block first (Stream::SealBeforeRecall) and the window's blocks
  // are rows (kWindow) beside the open block's mean. With it, a full block
  // may still wait for its seal (seal_after_ack): the window is taken as
  // whole blocks (WindowBlocksLse), the same floats sealed or not, and only
  // the recallable rows count.
  const bool front_window = !req.query->window_lse.empty();
  s.counted.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.counted[i] = front_window && rows->role[i] != CandidateRole::kRecall
                       ? 0.0f
                       : static_cast<float>(rows->tokens[i]);
  }
  const std::vector<float> window =
      front_window
          ? WindowBlocksLse(
                view, req.mean_query->data(), req.eligible,
                rows->straddle_block == req.eligible ? req.straddle_tokens : 0)
          : WindowLse(view, req.mean_query->data(), 1, {});
  MassInputs in;
  in.heads = static_cast<uint32_t>(H);
  in.logit_scale =
      1.0f / std::sqrt(static_cast<float>(view.config().geometry.head_dim));
  in.n = n;
  in.counted = s.counted.data();
  in.scans = {&s.mean};
  in.window_lse = window.data();
  in.ranges = rows->ranges;
  rows->mean_est = EstimateMass(in);
}

std::vector<uint32_t> IdentityPoolRows(const RecallView& view,
                                       const MassRows& rows, size_t range,
                                       const IdentitySplit& split,
                                       const std::vector<bool>& pooled,
                                       PoolCandidates* c) {
  const std::vector<float>& mean = rows.mean_est.density[range];
  const uint32_t shift = view.unit_shift();
  std::vector<uint32_t> out;
  // The mean vector's best, kIdentityPoolFactor times the share (rows
  // pooled already last: they are not added again).
  c->other.resize(c->row.size());
  for (size_t k = 0; k < c->row.size(); ++k) {
    c->other[k] = pooled[c->row[k]] ? -1.0f : mean[c->row[k]];
  }
  for (uint32_t k : BestUntil(c->other, c->tokens, c->id,
                              uint64_t{split.identity} * kIdentityPoolFactor)) {
    if (!pooled[c->row[k]]) out.push_back(c->row[k]);
  }
  // Each anchor's groups best by attention, kIdentityPoolFactor times its
  // part of the tracks' share.
  const size_t anchors = rows.anchors.size();
  if (anchors == 0) return out;
  const uint64_t part = std::max<uint64_t>(1, split.track / anchors);
  std::vector<std::vector<uint32_t>> mine(anchors);
  for (size_t k = 0; k < c->row.size(); ++k) {
    const auto a =
        std::find(rows.anchors.begin(), rows.anchors.end(), c->id[k] >> shift);
    if (a != rows.anchors.end()) mine[a - rows.anchors.begin()].push_back(k);
  }
  for (const std::vector<uint32_t>& ks : mine) {
    std::vector<float> value;
    std::vector<uint32_t> tokens;
    std::vector<uint64_t> id;
    for (uint32_t k : ks) {
      value.push_back(c->value[k]);
      tokens.push_back(c->tokens[k]);
      id.push_back(c->id[k]);
    }
    for (uint32_t j :
         BestUntil(value, tokens, id, part * kIdentityPoolFactor)) {
      const uint32_t i = c->row[ks[j]];
      if (!pooled[i] && std::find(out.begin(), out.end(), i) == out.end()) {
        out.push_back(i);
      }
    }
  }
  return out;
}

namespace {

// The first `keep` of the pool's tokens by `value` (ties to the later
// place in the newer block), as token units of `channel`.
void BestTokens(const TokenStageOutput& scored,
                const std::vector<uint32_t>& tokens,
                const std::vector<float>& value, size_t keep,
                RecallChannel channel, std::vector<PlanUnit>* out) {
  struct Scratch {
    std::vector<float> value;
    std::vector<uint32_t> best;
  };
  Scratch& sc = ThreadScratch<Scratch>();
  sc.value.resize(tokens.size());
  for (size_t k = 0; k < tokens.size(); ++k) sc.value[k] = value[tokens[k]];
  SelectTop(
      sc.value.data(), nullptr, tokens.size(), keep,
      [&](uint32_t a, uint32_t b) {
        const uint32_t ta = tokens[a], tb = tokens[b];
        const uint64_t xa = scored.runs[scored.run[ta]].block,
                       xb = scored.runs[scored.run[tb]].block;
        return xa != xb ? xa > xb : scored.place[ta] > scored.place[tb];
      },
      true, &sc.best);
  for (uint32_t k : sc.best) {
    PlanUnit u = scored.Unit(tokens[k]);
    u.channel = channel;
    out->push_back(u);
  }
}

}  // namespace

void IdentityUnits(const TokenStageOutput& scored,
                   const std::vector<uint64_t>& anchors,
                   const IdentitySplit& split, ScoredSet* out) {
  const size_t n = scored.density.size();
  out->identity_budget = split.identity;
  if (split.track > 0 && !anchors.empty()) {
    out->track_budget = split.track;
    const size_t part = std::max<size_t>(1, split.track / anchors.size());
    for (uint64_t a : anchors) {
      std::vector<uint32_t> mine;
      for (uint32_t i = 0; i < n; ++i) {
        if (scored.runs[scored.run[i]].block == a) mine.push_back(i);
      }
      BestTokens(scored, mine, scored.density, part, RecallChannel::kTrack,
                 &out->track_units);
    }
  }
  std::vector<uint32_t> all(n);
  for (uint32_t i = 0; i < n; ++i) all[i] = i;
  // The share and as many again: the tracks' tokens come first, and a
  // token they took is passed over.
  BestTokens(scored, all, scored.mean_density, 2 * size_t{split.identity},
             RecallChannel::kQuery, &out->query_units);
}

}  // namespace kvmem
