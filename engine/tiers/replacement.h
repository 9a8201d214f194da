// Replacement policies: which block leaves a tier first. A policy scores how
// worth keeping a block is; the tier manager moves the lowest score down.
// Policies are stateless and safe from any thread; the context carries the
// stream's state they read.
#ifndef KVMEM_ENGINE_TIERS_REPLACEMENT_H_
#define KVMEM_ENGINE_TIERS_REPLACEMENT_H_

#include <map>
#include <memory>

#include "engine/codec/record_codec.h"
#include "engine/signals/semantics.h"
#include "engine/types.h"

namespace kvmem {

struct ReplacementContext {
  uint64_t now_frame = 0;
  uint32_t half_life_frames = 300;
  const std::map<uint64_t, TrackHistory>* tracks = nullptr;
  const FrameSignals* latest = nullptr;  // Newest frame's signals, if any.
  std::shared_ptr<const FrameSignals> latest_owner;  // Keeps *latest alive.
};

class ReplacementPolicy {
 public:
  virtual ~ReplacementPolicy() = default;
  // Higher means keep longer.
  virtual double KeepScore(const BlockRecord& block,
                           const ReplacementContext& ctx) const = 0;
  virtual const char* name() const = 0;
  // How much higher a recalled block's score must be than the warm block
  // it would push out for a promotion to replace one with the other.
  virtual double promotion_margin() const = 0;
};

// Least recently used: the frame at which the block was sealed or last
// recalled. Promotion margin 0 (a block just recalled is the most recent).
std::unique_ptr<ReplacementPolicy> NewLruPolicy();

// Heat: an estimate of revisit probability in [0, ~4.01]:
//   persistence  min(1, longest lifetime of its tracks / half_life)
// + frequency    min(1, most blocks any of its tracks appears in / 8)
// + similarity   max(share of the newest frame's tracks it shows,
//                    cosine of its scene with the newest frame's)
// + history      min(1, recall hits decayed by 2^(-age / half_life) / 4)
// + 0.01 * recency (last access / now) to break ties as LRU would.
// Promotion margin 0.5: a recalled block replaces a warm one only if it is
// half a component hotter, so blocks of similar heat do not swap places
// (each swap moves a whole block down and another up).
std::unique_ptr<ReplacementPolicy> NewHeatPolicy();

// Decayed recall hits of a block at frame `now`.
double DecayedHits(const BlockRecord& block, uint64_t now,
                   uint32_t half_life_frames);

std::unique_ptr<ReplacementPolicy> NewReplacementPolicy(Replacement kind);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_TIERS_REPLACEMENT_H_
