// Token groups: a sealed block's tokens clustered by their keys, so recall
// can fetch the part of a block a query attends to (one object's tokens)
// instead of the whole block. A block's single mean key blurs a few strongly
// matching tokens into many others; a group's mean key keeps them apart.
// Recall at cluster granularity follows ClusterKV (Liu et al., "ClusterKV:
// Manipulating LLM KV Cache in Semantic Space for Recallable Compression",
// 2024).
//
// Clustering: spherical k-means over each token's keys of the indexed layers
// (concatenated, as in the summary), farthest-point initialisation from the
// first token, a fixed number of Lloyd iterations; deterministic. Keys of
// more than 2,048 floats a token (a 7B model with every layer indexed:
// 32,768) are clustered on a signed fold of them to 2,048 floats (a count
// sketch: the fold's cosines are the keys' up to an error of about
// 1/sqrt(2048)), which costs a sixteenth of the dots; the summaries and codes
// are of the full keys either way. A group's
// summary is the plain mean key of its tokens (so query . summary is the
// group's mean logit, times sqrt(head_dim), summed over heads).
//
// Pure functions, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_TOKEN_GROUPS_H_
#define KVMEM_ENGINE_RECALL_TOKEN_GROUPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "engine/index/token_codes.h"
#include "engine/types.h"

namespace kvmem {

inline constexpr uint32_t kMaxGroupsPerBlock = 64;

struct TokenGroups {
  std::vector<float> summaries;      // [group][summary_dim]
  std::vector<uint8_t> token_group;  // Group of each token, in append order.
  // Every token's keys as token codes (engine/index/token_codes.h) in group
  // order: group 0's tokens in append order, then group 1's, and so on (a
  // group's records are one run). What token-resolution recall scores.
  std::string codes;
};

// The token-code shape of a stream's keys: a segment per indexed layer and
// KV head.
TokenCodeShape TokenCodeShapeOf(const StreamConfig& config);

// REQUIRES: config passed ValidateStreamConfig; frames hold the block's
// frame payloads (full precision, as appended) with their token counts;
// 1 <= max_groups <= kMaxGroupsPerBlock. Empty groups are dropped, so a block
// has between 1 and min(max_groups, tokens) groups.
TokenGroups BuildTokenGroups(const StreamConfig& config,
                             const std::vector<absl::string_view>& frames,
                             const std::vector<uint32_t>& frame_tokens,
                             uint32_t max_groups);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_TOKEN_GROUPS_H_
