// Score MASS ("mass", the default): recall by estimated attention mass per
// KV head (the formula is in mass_estimate.h and kvmem.v1.ScoreMode).
//
// One recall: scan the candidate index once per query vector (every unit's
// score per head: int8 with proven bounds on Progressive, exact on Flat),
// estimate every unit's attention mass per token with each head's softmax
// normaliser, find the lowest lower bound that could still be needed to fill
// the budget, rescore exactly the units whose upper bound reaches it, rank
// those by priority = model_weight * ln(mass per token) + semantic, with the
// re-identification anchors first, fill the budget, and fill what is left
// with the best remaining units that fit. With per_layer, a set per indexed
// layer; with per_head, a set per indexed layer and KV head.
//
// With token_stage ("mass", the default), the fill is at token resolution:
// a pool of the best groups, kTokenPoolFactor times the budget, has each
// of its tokens scored from its token codes (engine/recall/token_stage.h),
// and the set takes the best tokens; the anchors stay whole groups.
// Without it ("mass_groups"), the set takes whole groups.
#ifndef KVMEM_ENGINE_RECALL_MASS_SCORER_H_
#define KVMEM_ENGINE_RECALL_MASS_SCORER_H_

#include <memory>

#include "engine/recall/scorer.h"

namespace kvmem {

std::unique_ptr<RecallScorer> NewMassScorer(bool token_stage);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_MASS_SCORER_H_
