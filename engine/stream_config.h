// Validation and derived sizes of a stream's configuration. Pure functions.
#ifndef KVMEM_ENGINE_STREAM_CONFIG_H_
#define KVMEM_ENGINE_STREAM_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

inline constexpr uint32_t kDefaultFramesPerBlock = 4;
inline constexpr uint32_t kDefaultShotMaxFrames = 32;
inline constexpr uint32_t kMaxTopK = 4096;
// Default token groups: about one per this many tokens of a full block, at
// most kMaxDefaultGroups (k-means on the append path: 1.5 ms for a block of
// 512 tokens into 32 groups over 512 summary dims, kvmem_engine_bench
// BM_TokenGroups).
inline constexpr uint32_t kTokensPerGroup = 8;
// The identity channel's share of a recall set's budget when neither the
// stream nor the query sets one (engine/recall/identity_channel.h).
inline constexpr float kDefaultIdentityShare = 0.25f;
inline constexpr uint32_t kMaxDefaultGroups = 32;
// Query vectors one recall may carry (kvmem.v1.RecallRequest.query), and
// their floats in all (16 MiB); recall scores at most kMaxScoredVectors of
// them (engine/recall/query_reduction.h).
inline constexpr uint32_t kMaxQueryVectors = 1024;
inline constexpr uint64_t kMaxQueryFloats = uint64_t{1} << 22;
// Scores one MASS recall may compute: query vectors x heads (indexed layers
// x KV heads) x recall units in the index. Each is a float held during the
// recall (2^25: 128 MiB), so this bounds a recall's memory and time; above
// it Recall answers RESOURCE_EXHAUSTED. 16 vectors (the most scored) x 32
// heads reach it at 65,536 units (4,096 blocks of 16 token groups).
inline constexpr uint64_t kMaxScoresPerRecall = uint64_t{1} << 25;
// A recall's budget (budget.max_tokens, recall_defaults.max_tokens).
inline constexpr uint32_t kMaxRecallTokens = 1u << 24;
// A per_head or per_layer recall answers a set per KV head or layer, each
// listing its blocks (and their tokens) within the budget: sets x budget
// tokens at most this, else RESOURCE_EXHAUSTED. 2^22 admits a per-head
// recall of every layer of a 7B model with 32 KV heads a layer (1,024
// sets) at 4,096 tokens, or of one with 8 (256 sets) at 16,384. Unbounded,
// 1,024 heads x 2,000 blocks of 16M tokens built a 91 MB answer that gRPC
// then refused to send.
inline constexpr uint64_t kMaxSetTokensPerRecall = uint64_t{1} << 22;
inline constexpr size_t kMaxStreamIdBytes = 128;

// OK when id is 1..128 bytes of [A-Za-z0-9._:-]; otherwise INVALID_ARGUMENT
// naming `field` and the value.
absl::Status ValidateStreamId(absl::string_view id,
                              absl::string_view field = "stream_id");
// The engine's ids: a stream id, or "<tenant>/<stream id>" (the server's
// tenant namespaces, server/ops/tenancy.h), each part a valid stream id.
absl::Status ValidateEngineStreamId(absl::string_view id);

// OK when share is unset or in [0, 1]; else INVALID_ARGUMENT naming `field`
// and the value.
absl::Status CheckShare(absl::string_view field,
                        const std::optional<float>& share);

// Returns config with every zero/empty default filled in. Does not validate.
StreamConfig WithDefaults(const StreamConfig& config);

// Returns requested with its zero/empty policy fields taken from defaults
// (a server's [stream_defaults]: window, blocks, index, recall and tier
// settings). The geometry, indexed layers and labels are the client's alone.
// Apply before WithDefaults.
StreamConfig WithServerDefaults(const StreamConfig& requested,
                                const StreamConfig& defaults);

// OK when config (after WithDefaults) describes a usable stream; otherwise
// INVALID_ARGUMENT naming the field (as in kvmem.v1, e.g.
// "config.geometry.head_dim") and the offending value.
absl::Status ValidateStreamConfig(const StreamConfig& config);

// Payload bytes of a frame of token_count tokens.
uint64_t FramePayloadBytes(const Geometry& g, uint32_t token_count);

// OK when `tokens` (a request's token offsets of block `block_id`, in
// append order) are strictly increasing and below token_count;
// INVALID_ARGUMENT naming `field`, the block and the first offending offset
// otherwise.
absl::Status ValidateTokenList(const std::vector<uint32_t>& tokens,
                               uint32_t token_count, uint64_t block_id,
                               const char* field);

// OK when `layers` (a request's layer list, BLOCK_LAYER_MAJOR) names each
// of the geometry's layers at most once; INVALID_ARGUMENT naming the first
// that is out of range or repeated, as `field`.
absl::Status ValidateLayerList(const Geometry& g,
                               const std::vector<uint32_t>& layers,
                               absl::string_view field = "layers");

// Bytes of a block of token_count tokens as FetchBlocks sends it: all its
// frames (kFrameMajor), or `layers` layer records, K then V each
// (kBlockLayerMajor; 0 layers: all of them).
uint64_t BlockPayloadBytes(const Geometry& g, uint32_t token_count,
                           PayloadLayout layout, size_t layers);

// Elements of one layer's K (or V) for token_count tokens.
uint64_t LayerSliceElements(const Geometry& g, uint32_t token_count);

// Dimension of a block summary (and of a query).
uint32_t SummaryDim(const StreamConfig& config);

// The recall scorer the weights name (engine/recall/scorer.h): `scorer`,
// or when empty the built-in one `score` names ("summed" for SUMMED, else
// "mass").
std::string ScorerName(const RecallWeights& w);
// The score mode that names a built-in scorer ("mass": MASS, "summed":
// SUMMED); kUnspecified for any other scorer.
ScoreMode ScoreModeOf(const std::string& scorer);

// Whether a stream of this config (after defaults) keeps one index per
// indexed layer (when its scorer asks for them, as SUMMED's per-layer recall
// over several layers does; MASS scores layers from the summary index's
// scan) and a token-group index.
bool HasPerLayerIndexes(const StreamConfig& config);
bool HasGroupIndex(const StreamConfig& config);

// Dimension of each vector index a stream of this config builds: the
// summary index, then the per-layer and token-group ones when it has them.
std::vector<uint32_t> IndexDims(const StreamConfig& config);

// Indexed layers after defaults (all layers when the list is empty).
std::vector<uint32_t> EffectiveIndexedLayers(const StreamConfig& config);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_STREAM_CONFIG_H_
