#include "engine/tiers/replacement.h"

#include <algorithm>
#include <cmath>

#include "engine/signals/semantics.h"

namespace kvmem {
namespace {

double Recency(const BlockRecord& b, uint64_t now) {
  return now == 0 ? 0.0 : static_cast<double>(b.last_access_frame) / now;
}

class LruPolicy final : public ReplacementPolicy {
 public:
  double KeepScore(const BlockRecord& b,
                   const ReplacementContext& ctx) const override {
    return Recency(b, ctx.now_frame);
  }
  const char* name() const override { return "lru"; }
  double promotion_margin() const override { return 0; }
};

class HeatPolicy final : public ReplacementPolicy {
 public:
  double KeepScore(const BlockRecord& b,
                   const ReplacementContext& ctx) const override {
    const double half_life = std::max<uint32_t>(1, ctx.half_life_frames);
    double persistence = 0, frequency = 0;
    if (ctx.tracks != nullptr) {
      for (const TrackPresence& t : b.tracks) {
        auto it = ctx.tracks->find(t.track_id);
        if (it == ctx.tracks->end()) continue;
        const TrackHistory& h = it->second;
        persistence =
            std::max(persistence,
                     std::min(1.0, (h.last_frame - h.first_frame) / half_life));
        frequency = std::max(frequency, std::min(1.0, h.blocks / 8.0));
      }
    }
    double similarity = 0;
    if (ctx.latest != nullptr) {
      const SemanticMatch m = MatchSignals(b, *ctx.latest);
      similarity = std::max(m.tracks, m.scene);
    }
    const double history =
        std::min(1.0, DecayedHits(b, ctx.now_frame, ctx.half_life_frames) / 4);
    return persistence + frequency + similarity + history +
           0.01 * Recency(b, ctx.now_frame);
  }
  const char* name() const override { return "heat"; }
  double promotion_margin() const override { return 0.5; }
};

}  // namespace

double DecayedHits(const BlockRecord& b, uint64_t now,
                   uint32_t half_life_frames) {
  if (b.hits == 0) return 0;
  const double age = now > b.last_hit_frame ? now - b.last_hit_frame : 0;
  return b.hits * std::exp2(-age / std::max<uint32_t>(1, half_life_frames));
}

std::unique_ptr<ReplacementPolicy> NewLruPolicy() {
  return std::make_unique<LruPolicy>();
}
std::unique_ptr<ReplacementPolicy> NewHeatPolicy() {
  return std::make_unique<HeatPolicy>();
}

std::unique_ptr<ReplacementPolicy> NewReplacementPolicy(Replacement kind) {
  if (kind == Replacement::kLru) return NewLruPolicy();
  return NewHeatPolicy();
}

}  // namespace kvmem
