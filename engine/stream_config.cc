#include "engine/stream_config.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <type_traits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "engine/index/block_index.h"
#include "engine/recall/scorer.h"
#include "engine/recall/token_groups.h"

namespace kvmem {

bool StreamConfig::operator==(const StreamConfig& o) const {
  const Geometry& a = geometry;
  const Geometry& b = o.geometry;
  return a.layers == b.layers && a.kv_heads == b.kv_heads &&
         a.head_dim == b.head_dim && a.dtype == b.dtype &&
         a.max_tokens_per_frame == b.max_tokens_per_frame &&
         hot_window_tokens == o.hot_window_tokens &&
         frames_per_block == o.frames_per_block &&
         indexed_layers == o.indexed_layers &&
         index_factory == o.index_factory &&
         groups_per_block == o.groups_per_block &&
         default_top_k == o.default_top_k &&
         default_max_tokens == o.default_max_tokens &&
         gate_temperature == o.gate_temperature && labels == o.labels &&
         segment_mode == o.segment_mode &&
         shot_similarity_threshold == o.shot_similarity_threshold &&
         max_tokens_per_block == o.max_tokens_per_block &&
         tiers.warm_budget_bytes == o.tiers.warm_budget_bytes &&
         tiers.cold_budget_bytes == o.tiers.cold_budget_bytes &&
         tiers.storage_cap_bytes == o.tiers.storage_cap_bytes &&
         tiers.replacement == o.tiers.replacement &&
         tiers.heat_half_life_frames == o.tiers.heat_half_life_frames &&
         tiers.prefetch_blocks == o.tiers.prefetch_blocks &&
         tiers.stage_budget_bytes == o.tiers.stage_budget_bytes &&
         tiers.rebuild_every_blocks == o.tiers.rebuild_every_blocks &&
         tiers.rebuild_every_seconds == o.tiers.rebuild_every_seconds &&
         tiers.cold_precision == o.tiers.cold_precision &&
         tiers.ingest_precision == o.tiers.ingest_precision &&
         weights.model == o.weights.model && weights.track == o.weights.track &&
         weights.iou == o.weights.iou && weights.scene == o.weights.scene &&
         weights.score == o.weights.score &&
         weights.scorer == o.weights.scorer &&
         weights.identity_share == o.weights.identity_share;
}

absl::Status ValidateEngineStreamId(absl::string_view id) {
  const size_t slash = id.find('/');
  if (slash == absl::string_view::npos) return ValidateStreamId(id);
  KVMEM_RETURN_IF_ERROR(ValidateStreamId(id.substr(0, slash), "tenant"));
  return ValidateStreamId(id.substr(slash + 1));
}

absl::Status ValidateStreamId(absl::string_view id, absl::string_view field) {
  if (id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  }
  if (id.size() > kMaxStreamIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", id.size(), " bytes; at most ",
                     kMaxStreamIdBytes, " allowed"));
  }
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                    c == ':' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", absl::CHexEscape(id),
                       "\" has a character outside [A-Za-z0-9._:-]"));
    }
  }
  return absl::OkStatus();
}

StreamConfig WithDefaults(const StreamConfig& config) {
  StreamConfig c = config;
  if (c.segment_mode == SegmentMode::kUnspecified) {
    c.segment_mode = SegmentMode::kFixed;
  }
  if (c.frames_per_block == 0) {
    c.frames_per_block = c.segment_mode == SegmentMode::kShot
                             ? kDefaultShotMaxFrames
                             : kDefaultFramesPerBlock;
  }
  if (c.shot_similarity_threshold == 0.0f) c.shot_similarity_threshold = 0.8f;
  if (c.tiers.replacement == Replacement::kUnspecified) {
    c.tiers.replacement = Replacement::kHeat;
  }
  if (c.tiers.heat_half_life_frames == 0) c.tiers.heat_half_life_frames = 300;
  if (c.tiers.cold_precision == ColdPrecision::kUnspecified) {
    c.tiers.cold_precision = ColdPrecision::kFull;
  }
  if (c.tiers.ingest_precision == ColdPrecision::kUnspecified) {
    c.tiers.ingest_precision = ColdPrecision::kFull;
  }
  if (c.weights.model == 0.0f) c.weights.model = 1.0f;
  if (c.indexed_layers.empty()) {
    for (uint32_t l = 0; l < c.geometry.layers && l < 1024; ++l) {
      c.indexed_layers.push_back(l);
    }
  }
  if (c.index_factory.empty()) c.index_factory = "Progressive";
  if (c.groups_per_block == 0) {
    // About one group per kTokensPerGroup tokens of a full block: enough
    // that an object's few tokens over the block's frames get a group of
    // their own instead of a share of the background's mean.
    uint64_t tokens = static_cast<uint64_t>(c.frames_per_block) *
                      c.geometry.max_tokens_per_frame;
    if (c.max_tokens_per_block > 0) {
      tokens = std::min<uint64_t>(tokens, c.max_tokens_per_block);
    }
    c.groups_per_block = static_cast<uint32_t>(
        std::clamp<uint64_t>((tokens + kTokensPerGroup - 1) / kTokensPerGroup,
                             1, kMaxDefaultGroups));
  }
  if (c.default_max_tokens == 0) {
    c.default_max_tokens = c.hot_window_tokens / 5;
    if (c.default_max_tokens == 0) c.default_max_tokens = 1;
  }
  if (c.gate_temperature == 0.0f) c.gate_temperature = 1.0f;
  // The scorer's name and the score mode say the same for the built-in
  // scorers; a registered one has no score mode.
  c.weights.scorer = ScorerName(c.weights);
  if (c.weights.score == ScoreMode::kUnspecified) {
    c.weights.score = ScoreModeOf(c.weights.scorer);
  }
  return c;
}

StreamConfig WithServerDefaults(const StreamConfig& requested,
                                const StreamConfig& defaults) {
  StreamConfig c = requested;
  auto fill = [](auto* field, const auto& fallback) {
    using T = std::decay_t<decltype(*field)>;
    if (*field == T{}) *field = fallback;
  };
  const StreamConfig& d = defaults;
  fill(&c.hot_window_tokens, d.hot_window_tokens);
  fill(&c.frames_per_block, d.frames_per_block);
  fill(&c.segment_mode, d.segment_mode);
  fill(&c.shot_similarity_threshold, d.shot_similarity_threshold);
  fill(&c.max_tokens_per_block, d.max_tokens_per_block);
  fill(&c.index_factory, d.index_factory);
  fill(&c.groups_per_block, d.groups_per_block);
  fill(&c.default_top_k, d.default_top_k);
  fill(&c.default_max_tokens, d.default_max_tokens);
  fill(&c.gate_temperature, d.gate_temperature);
  fill(&c.tiers.warm_budget_bytes, d.tiers.warm_budget_bytes);
  fill(&c.tiers.cold_budget_bytes, d.tiers.cold_budget_bytes);
  fill(&c.tiers.storage_cap_bytes, d.tiers.storage_cap_bytes);
  fill(&c.tiers.replacement, d.tiers.replacement);
  fill(&c.tiers.heat_half_life_frames, d.tiers.heat_half_life_frames);
  fill(&c.tiers.prefetch_blocks, d.tiers.prefetch_blocks);
  fill(&c.tiers.stage_budget_bytes, d.tiers.stage_budget_bytes);
  fill(&c.tiers.rebuild_every_blocks, d.tiers.rebuild_every_blocks);
  fill(&c.tiers.rebuild_every_seconds, d.tiers.rebuild_every_seconds);
  fill(&c.tiers.cold_precision, d.tiers.cold_precision);
  fill(&c.tiers.ingest_precision, d.tiers.ingest_precision);
  // The scorer as a whole: by mode or by name, never half of each.
  if (c.weights.score == ScoreMode::kUnspecified && c.weights.scorer.empty()) {
    c.weights.score = d.weights.score;
    c.weights.scorer = d.weights.scorer;
  }
  if (!c.weights.identity_share) {
    c.weights.identity_share = d.weights.identity_share;
  }
  return c;
}

absl::Status CheckShare(absl::string_view field,
                        const std::optional<float>& share) {
  if (!share || (*share >= 0.0f && *share <= 1.0f)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", *share, "; must be in [0, 1] (or unset)"));
}

namespace {
absl::Status CheckRange(absl::string_view field, uint64_t value, uint64_t lo,
                        uint64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", value, "; must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}
// The geometry, the index's shape and the fields sized by them.
absl::Status CheckShape(const StreamConfig& config) {
  const Geometry& g = config.geometry;
  for (auto st : {CheckRange("config.geometry.layers", g.layers, 1, 1024),
                  CheckRange("config.geometry.kv_heads", g.kv_heads, 1, 1024),
                  CheckRange("config.geometry.head_dim", g.head_dim, 1, 4096),
                  CheckRange("config.geometry.max_tokens_per_frame",
                             g.max_tokens_per_frame, 1, 65536),
                  CheckRange("config.hot_window_tokens",
                             config.hot_window_tokens, 1, 1u << 24),
                  CheckRange("config.block_policy.frames_per_block",
                             config.frames_per_block, 1, 4096),
                  CheckRange("config.recall_defaults.top_k",
                             config.default_top_k, 0, kMaxTopK),
                  // As a recall's budget.max_tokens (recall_query.cc).
                  CheckRange("config.recall_defaults.max_tokens",
                             config.default_max_tokens, 0, kMaxRecallTokens)}) {
    if (!st.ok()) return st;
  }
  if (DTypeBytes(g.dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.geometry.dtype is ", static_cast<uint32_t>(g.dtype), " (",
        DTypeName(g.dtype), "); use FP16, BF16 or FP32"));
  }
  // One frame must fit comfortably in memory: 1 GiB cap.
  const uint64_t frame_bytes = FramePayloadBytes(g, g.max_tokens_per_frame);
  if (frame_bytes > (1ull << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.geometry describes ", frame_bytes,
        " payload bytes per frame at max_tokens_per_frame; at most 1 GiB"));
  }
  std::set<uint32_t> seen;
  for (uint32_t layer : config.indexed_layers) {
    if (layer >= g.layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.index_policy.indexed_layers has layer ", layer,
                       "; the geometry has ", g.layers, " layers"));
    }
    if (!seen.insert(layer).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.index_policy.indexed_layers lists layer ", layer, " twice"));
    }
  }
  if (static_cast<uint64_t>(config.indexed_layers.size()) * g.kv_heads *
          g.head_dim >
      (1u << 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary dimension ",
                     static_cast<uint64_t>(config.indexed_layers.size()) *
                         g.kv_heads * g.head_dim,
                     " (indexed_layers x kv_heads x head_dim) exceeds 65536"));
  }
  if (config.groups_per_block > kMaxGroupsPerBlock) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.index_policy.groups_per_block is ", config.groups_per_block,
        "; must be in [0, ", kMaxGroupsPerBlock, "]"));
  }
  KVMEM_RETURN_IF_ERROR(
      BlockIndex::ValidateFactory(config.index_factory, IndexDims(config)));
  return absl::OkStatus();
}

// The score mode and the scorer's name (after defaults): a registered
// scorer, and for the built-in ones the mode that names it.
absl::Status CheckScorer(const RecallWeights& w) {
  const ScoreMode want = ScoreModeOf(w.scorer);
  if (w.score != ScoreMode::kUnspecified && w.score != ScoreMode::kMass &&
      w.score != ScoreMode::kSummed) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.recall_policy.score is ",
                     static_cast<uint32_t>(w.score), "; use MASS or SUMMED"));
  }
  if (w.scorer.size() > 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.recall_policy.scorer has ", w.scorer.size(),
                     " bytes; a scorer's name has at most 32"));
  }
  if (FindRecallScorer(w.scorer) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.recall_policy.scorer is \"", w.scorer,
                     "\"; this server has the scorers ",
                     absl::StrJoin(RecallScorerNames(), ", ")));
  }
  if (w.score != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.recall_policy.scorer is \"", w.scorer,
        "\" and config.recall_policy.score is ", static_cast<uint32_t>(w.score),
        " (1: MASS names scorer \"mass\", 2: SUMMED \"summed\"); set one of "
        "the two, or both alike"));
  }
  return absl::OkStatus();
}

// The recall, segmentation and tier policies.
absl::Status CheckPrecision(absl::string_view field, ColdPrecision p) {
  if (p == ColdPrecision::kFull || p == ColdPrecision::kInt8 ||
      p == ColdPrecision::kInt4) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "config.tier_policy.", field, " is ", static_cast<uint32_t>(p),
      "; use COLD_PRECISION_FULL, COLD_PRECISION_INT8 or COLD_PRECISION_INT4"));
}

absl::Status CheckPolicies(const StreamConfig& config) {
  // Below 1e-3 a gate's softmax divides log-masses (down to -104) into
  // values past float; above 1e6 every gate is uniform anyway.
  if (!(config.gate_temperature >= 1e-3f && config.gate_temperature <= 1e6f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.recall_defaults.gate_temperature is ",
                     config.gate_temperature, "; must be in [0.001, 1e6]"));
  }
  KVMEM_RETURN_IF_ERROR(CheckScorer(config.weights));
  if (config.segment_mode != SegmentMode::kFixed &&
      config.segment_mode != SegmentMode::kShot) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.block_policy.mode is ",
        static_cast<uint32_t>(config.segment_mode), "; use FIXED or SHOT"));
  }
  if (!(config.shot_similarity_threshold >= -1.0f &&
        config.shot_similarity_threshold <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.block_policy.shot_similarity_threshold is ",
                     config.shot_similarity_threshold, "; must be in [-1, 1]"));
  }
  if (config.tiers.replacement != Replacement::kLru &&
      config.tiers.replacement != Replacement::kHeat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.tier_policy.replacement is ",
        static_cast<uint32_t>(config.tiers.replacement), "; use LRU or HEAT"));
  }
  KVMEM_RETURN_IF_ERROR(
      CheckPrecision("cold_precision", config.tiers.cold_precision));
  KVMEM_RETURN_IF_ERROR(
      CheckPrecision("ingest_precision", config.tiers.ingest_precision));
  if (config.tiers.prefetch_blocks > 0 &&
      config.tiers.stage_budget_bytes == 0) {
    return absl::InvalidArgumentError(
        "config.tier_policy.stage_budget_bytes is 0 while prefetch_blocks is " +
        std::to_string(config.tiers.prefetch_blocks) +
        "; staging needs a budget");
  }
  for (auto st :
       {CheckRange("config.tier_policy.prefetch_blocks",
                   config.tiers.prefetch_blocks, 0, 64),
        CheckRange("config.tier_policy.heat_half_life_frames",
                   config.tiers.heat_half_life_frames, 1, 1u << 24)}) {
    if (!st.ok()) return st;
  }
  const std::pair<const char*, float> weights[] = {
      {"model_weight", config.weights.model},
      {"track_weight", config.weights.track},
      {"iou_weight", config.weights.iou},
      {"scene_weight", config.weights.scene}};
  for (const auto& [name, w] : weights) {
    if (!std::isfinite(w) || w < 0.0f || w > 1e6f) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.recall_policy.", name, " is ", w,
                       "; must be finite and in [0, 1e6]"));
    }
  }
  return CheckShare("config.recall_policy.identity_share",
                    config.weights.identity_share);
}

absl::Status CheckLabels(const StreamConfig& config) {
  if (config.labels.size() > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.labels has ", config.labels.size(), " entries; at most 16"));
  }
  for (const auto& [k, v] : config.labels) {
    if (k.empty() || k.size() > 128 || v.size() > 128) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.labels entry \"", absl::CHexEscape(k.substr(0, 64)),
          "\" must have a 1..128-byte key and a value of at most "
          "128 bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateStreamConfig(const StreamConfig& config) {
  KVMEM_RETURN_IF_ERROR(CheckShape(config));
  KVMEM_RETURN_IF_ERROR(CheckPolicies(config));
  return CheckLabels(config);
}

uint64_t LayerSliceElements(const Geometry& g, uint32_t token_count) {
  return static_cast<uint64_t>(g.kv_heads) * token_count * g.head_dim;
}

uint64_t FramePayloadBytes(const Geometry& g, uint32_t token_count) {
  return static_cast<uint64_t>(g.layers) * 2 *
         LayerSliceElements(g, token_count) * DTypeBytes(g.dtype);
}

absl::Status ValidateLayerList(const Geometry& g,
                               const std::vector<uint32_t>& layers,
                               absl::string_view field) {
  std::vector<bool> seen(g.layers, false);
  for (uint32_t l : layers) {
    if (l >= g.layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " has ", l, "; the stream has ", g.layers, " layers"));
    }
    if (seen[l]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " names layer ", l, " twice"));
    }
    seen[l] = true;
  }
  return absl::OkStatus();
}

absl::Status ValidateTokenList(const std::vector<uint32_t>& tokens,
                               uint32_t token_count, uint64_t block_id,
                               const char* field) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= token_count) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " of block ", block_id, " has offset ", tokens[i],
                       "; the block holds ", token_count, " tokens"));
    }
    if (i > 0 && tokens[i] <= tokens[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " of block ", block_id, " has ", tokens[i], " after ",
          tokens[i - 1], "; offsets must be strictly increasing"));
    }
  }
  return absl::OkStatus();
}

uint64_t BlockPayloadBytes(const Geometry& g, uint32_t token_count,
                           PayloadLayout layout, size_t layers) {
  if (layout == PayloadLayout::kFrameMajor || layers == 0) {
    return FramePayloadBytes(g, token_count);
  }
  return layers * 2 * LayerSliceElements(g, token_count) * DTypeBytes(g.dtype);
}

uint32_t SummaryDim(const StreamConfig& config) {
  return static_cast<uint32_t>(EffectiveIndexedLayers(config).size()) *
         config.geometry.kv_heads * config.geometry.head_dim;
}

ScoreMode ScoreModeOf(const std::string& scorer) {
  if (scorer == kMassScorer || scorer == kMassGroupsScorer) {
    return ScoreMode::kMass;
  }
  if (scorer == kSummedScorer) return ScoreMode::kSummed;
  return ScoreMode::kUnspecified;
}

std::string ScorerName(const RecallWeights& w) {
  if (!w.scorer.empty()) return w.scorer;
  return std::string(w.score == ScoreMode::kSummed ? kSummedScorer
                                                   : kMassScorer);
}

bool HasPerLayerIndexes(const StreamConfig& config) {
  const RecallScorer* scorer = FindRecallScorer(ScorerName(config.weights));
  return scorer != nullptr && scorer->wants_layer_indexes() &&
         config.indexed_layers.size() > 1;
}

bool HasGroupIndex(const StreamConfig& config) {
  return config.groups_per_block > 1;
}

std::vector<uint32_t> IndexDims(const StreamConfig& config) {
  const StreamConfig c = WithDefaults(config);
  const uint32_t summary = SummaryDim(c);
  std::vector<uint32_t> dims = {summary};
  if (HasPerLayerIndexes(c)) {
    dims.insert(dims.end(), c.indexed_layers.size(),
                c.geometry.kv_heads * c.geometry.head_dim);
  }
  if (HasGroupIndex(c)) dims.push_back(summary);
  return dims;
}

std::vector<uint32_t> EffectiveIndexedLayers(const StreamConfig& config) {
  return WithDefaults(config).indexed_layers;
}

}  // namespace kvmem
