// The identity channel of score MASS's token stage (scorer "mass").
//
// Following attention mass, token by token, loses a re-entering object:
// the attention of single query tokens spreads to look-alikes, while what
// the query as a whole matches, and what the front end's tracker knows,
// point at the object's own past. So a share of each recall set's budget
// is reserved for identity (RecallPolicy.identity_share, default
// kDefaultIdentityShare, engine/stream_config.h) and attention mass fills
// the rest:
//
//   identity = round(share x budget) tokens, taken first:
//     1. tracks: when the query carries detections, each of its tracks (at
//        most kAnchorTracks) with a recallable block gets an equal part of
//        half the identity share: the tokens of the track's most recent
//        recallable block (its last appearance outside the window) that
//        the attention density ranks first;
//     2. the query as a whole: the tokens whose density for the query's
//        mean vector (per head, the weighted mean of its vectors: its logit
//        is the mean of their logits) is largest, up to the identity share;
//   attention: the budget's other tokens by attention density (and what
//   the identity channel left).
//
// The mean vector's density uses the recall's formula with one vector, its
// normaliser over every scanned unit (recallable or in the window) and the
// open block (what the front end's window_lse says only of its own
// vectors). Identity picks carry their attention density, so masses and
// gates stay attention's. Tokens of blocks without codes (written before
// them) are attention's only. Each answer says which tokens each channel
// took (RecalledBlock.query_offsets, track_offsets; RecallChannels).
//
// Pure functions of the view; call under its lock.
#ifndef KVMEM_ENGINE_RECALL_IDENTITY_CHANNEL_H_
#define KVMEM_ENGINE_RECALL_IDENTITY_CHANNEL_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/recall/mass_rows.h"
#include "engine/recall/scorer.h"
#include "engine/recall/token_stage.h"
#include "engine/stream_config.h"
#include "engine/view/recall_view.h"

namespace kvmem {

// Tracks of a query that anchor a recall.
inline constexpr size_t kAnchorTracks = 8;
// The identity channel's pool: groups holding this many times its share
// (the mean vector's best, each anchor's best by attention), besides the
// attention pool (kTokenPoolFactor): the query as a whole mostly matches
// what attention pooled already.
inline constexpr uint32_t kIdentityPoolFactor = 2;

// The share in force: the query's, else the stream's, else the default.
float IdentityShare(const RecallWeights& w, const RecallQuery& q);

// A set's identity budget: `identity` tokens in all, of which at most
// `track` for the tracks (half, when there are anchors).
struct IdentitySplit {
  uint32_t identity = 0;
  uint32_t track = 0;
};
IdentitySplit SplitIdentity(uint32_t budget, float share, size_t anchors);

// The most recent recallable block of each of the query's tracks (at most
// kAnchorTracks, in the order of its detections, each block once).
std::vector<uint64_t> AnchorBlocks(const RecallView& view, const RecallQuery& q,
                                   size_t eligible)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// Fills rows->mean_est (the mean vector's estimate over rows->ranges) and
// rows->anchors. REQUIRES: rows scanned and classified, est made.
void PrepareIdentity(const RecallView& view, const ScoreRequest& req,
                     MassRows* rows) ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// The rows the identity channel adds to range `range`'s pool, not marked
// in `pooled`: the recallable rows best by the mean vector's density
// holding kIdentityPoolFactor x split.identity tokens, and each anchor
// block's rows best by attention holding kIdentityPoolFactor x its part of
// split.track.
// c: the set's candidates (PoolCandidates::other is overwritten).
std::vector<uint32_t> IdentityPoolRows(const RecallView& view,
                                       const MassRows& rows, size_t range,
                                       const IdentitySplit& split,
                                       const std::vector<bool>& pooled,
                                       PoolCandidates* c)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// The identity channel's units from the scored pool: out->track_units (each
// anchor's tokens best by attention density, an equal part of split.track
// each) and out->query_units (the tokens best by the mean vector's density,
// twice split.identity of them), with their budgets.
// REQUIRES: scored has mean_density.
void IdentityUnits(const TokenStageOutput& scored,
                   const std::vector<uint64_t>& anchors,
                   const IdentitySplit& split, ScoredSet* out);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_IDENTITY_CHANNEL_H_
