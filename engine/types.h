// Plain value types the memory engine speaks: stream configuration, frames,
// blocks, recall queries and results, statistics. They mirror kvmem.v1 but
// carry no gRPC or protobuf dependency. All are copyable values; none is
// internally synchronised.
#ifndef KVMEM_ENGINE_TYPES_H_
#define KVMEM_ENGINE_TYPES_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "engine/codec/dtype.h"

namespace kvmem {

struct Geometry {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kUnspecified;
  uint32_t max_tokens_per_frame = 0;
};

enum class SegmentMode : uint32_t { kUnspecified = 0, kFixed = 1, kShot = 2 };
enum class Replacement : uint32_t { kUnspecified = 0, kLru = 1, kHeat = 2 };

// How a block is kept on disk once it leaves RAM; see
// kvmem.v1.ColdPrecision.
enum class ColdPrecision : uint32_t {
  kUnspecified = 0,
  kFull = 1,
  kInt8 = 2,
  kInt4 = 3
};

// Tier budgets and background work; see kvmem.v1.TierPolicy.
struct TierConfig {
  uint64_t warm_budget_bytes = 0;
  uint64_t cold_budget_bytes = 0;
  uint64_t storage_cap_bytes = 0;
  Replacement replacement = Replacement::kUnspecified;
  uint32_t heat_half_life_frames = 0;
  uint32_t prefetch_blocks = 0;
  uint64_t stage_budget_bytes = 0;
  uint32_t rebuild_every_blocks = 0;
  uint32_t rebuild_every_seconds = 0;
  ColdPrecision cold_precision = ColdPrecision::kUnspecified;
  // How frames are written when appended (engine/codec/frame_codec.h).
  ColdPrecision ingest_precision = ColdPrecision::kUnspecified;
};

// How recall scores candidates; see kvmem.v1.ScoreMode.
enum class ScoreMode : uint32_t { kUnspecified = 0, kMass = 1, kSummed = 2 };

// Which channel of a recall chose a token (kvmem.v1.RecallChannels):
// attention mass, the query as a whole (its mean vector), or the query's
// tracks (their last appearance outside the window).
enum class RecallChannel : uint8_t { kAttention = 0, kQuery = 1, kTrack = 2 };

// Weights of the recall signals; see kvmem.v1.RecallPolicy.
struct RecallWeights {
  float model = 0;  // 0: 1.
  float track = 0;
  float iou = 0;
  float scene = 0;
  ScoreMode score = ScoreMode::kUnspecified;  // Unspecified: kMass.
  // The scorer by name (engine/recall/scorer.h): "mass", "summed", or one
  // the program registered; empty: the one `score` names.
  std::string scorer;
  // The identity channel's share of each recall set's budget, in [0, 1];
  // unset: the default (engine/recall/identity_channel.h).
  std::optional<float> identity_share;
};

struct StreamConfig {
  Geometry geometry;
  uint32_t hot_window_tokens = 0;
  uint32_t frames_per_block = 0;  // 0: default.
  SegmentMode segment_mode = SegmentMode::kUnspecified;
  float shot_similarity_threshold = 0;   // 0: 0.8.
  uint32_t max_tokens_per_block = 0;     // 0: no limit.
  std::vector<uint32_t> indexed_layers;  // Empty: all layers.
  std::string index_factory;             // Empty: "Progressive".
  uint32_t groups_per_block = 0;         // 0: ~1 per 8 block tokens; 1: none.
  uint32_t default_top_k = 0;            // 0: no cap on blocks.
  uint32_t default_max_tokens = 0;       // 0: 20 % of the hot window.
  float gate_temperature = 0.0f;         // 0: 1.0.
  std::map<std::string, std::string> labels;
  TierConfig tiers;
  RecallWeights weights;

  bool operator==(const StreamConfig& o) const;
};

struct Detection {
  uint64_t track_id = 0;
  uint32_t class_id = 0;
  float x_min = 0, y_min = 0, x_max = 0, y_max = 0;
  float score = 0;
};

struct FrameSignals {
  std::vector<Detection> detections;
  std::vector<float> scene_embedding;
};

// One frame's KV. payload is layer-major (see kvmem.v1.StreamGeometry).
struct Frame {
  uint64_t index = 0;
  int64_t timestamp_us = 0;
  uint64_t first_token_position = 0;
  uint32_t token_count = 0;
  std::string payload;
  FrameSignals signals;
};

enum class Tier : uint32_t {
  kUnspecified = 0,
  kWarm = 1,
  kCold = 2,
  kDegraded = 3,
  kEvicted = 4
};

// A sealed block: consecutive frames, recalled as a unit.
struct BlockInfo {
  uint64_t id = 0;
  uint64_t first_frame = 0;
  uint64_t last_frame = 0;  // Inclusive.
  uint64_t first_token_position = 0;
  uint64_t end_token_position = 0;  // One past the last token's position.
  uint32_t token_count = 0;
  uint64_t payload_bytes = 0;  // Full-precision KV bytes of the block.
  Tier tier = Tier::kCold;
  bool degraded = false;  // Its KV is an int8 approximation.
};

struct AppendResult {
  int64_t last_durable_frame = -1;
  // This frame completed a block (EngineOptions::seal_after_ack: its
  // seal may follow the append) or its shot cut sealed the one before.
  bool sealed_block = false;
};

struct RecallQuery {
  // n query vectors of summary_dim floats each, back to back.
  std::vector<float> query;
  // Empty, or n x (indexed layers x kv_heads) log-sum-exps of each vector
  // over what the front end holds (see kvmem.v1.RecallRequest.window_lse).
  std::vector<float> window_lse;
  uint32_t top_k = 0;                   // 0: stream default.
  uint32_t max_tokens = 0;              // 0: stream default.
  uint64_t current_token_position = 0;  // 0: newest appended token.
  float window_fraction = 0;            // Budget as a fraction of the window.
  // Score MASS, in [0, 1], 0 off: each set stops once its estimated share
  // of the cold mass reaches it (kvmem.v1.RecallBudget.mass_target).
  float mass_target = 0;
  bool per_layer = false;
  bool per_head = false;  // Score mass: a set per indexed layer and KV head.
  // The identity channel's share of the budget for this recall, in [0, 1];
  // unset: the stream's.
  std::optional<float> identity_share;
  FrameSignals signals;
  // Served first when recalls of several streams contend for the
  // accelerator (the sim's queue); higher first.
  uint32_t priority = 0;
};

// What accelerator calls cost (engine/accel/accelerator.h).
struct CallCost {
  double measured_us = 0;     // Host wall time.
  double modelled_us = 0;     // Modelled backends: time on the device,
  double queue_us = 0;        //   of which waiting behind other calls,
  uint64_t dram_bytes = 0;    //   DRAM bytes the bursts moved,
  double energy_uj = 0;       //   and energy.
  uint32_t searches = 0;      // Search calls.
  uint32_t injections = 0;    // Staging injections.
  uint32_t repartitions = 0;  // SRAM re-partitions the calls caused.
  CallCost& operator+=(const CallCost& o);
};

struct RecalledBlock {
  BlockInfo block;
  float score = 0;           // Inner product of query and summary.
  float priority = 0;        // Combined score the plan ranks by.
  float semantic_score = 0;  // Weighted semantic part of priority.
  float gate_weight = 0;
  float mass = 0;  // Score mass: estimated attention share of its tokens.
  bool was_staged = false;
  // Offsets (append order within the block) of the tokens chosen, sorted;
  // empty means every token of the block.
  std::vector<uint32_t> token_offsets;
  // The chosen tokens the identity channel took (sorted, among the chosen):
  // for the query as a whole, and for the query's tracks. The others came
  // from attention mass.
  std::vector<uint32_t> query_offsets;
  std::vector<uint32_t> track_offsets;
};

// Tokens of a recall set by the channel that chose them, and the identity
// channel's reserved share of the budget (what it could take).
struct ChannelTokens {
  uint32_t attention = 0;
  uint32_t query = 0;
  uint32_t track = 0;
  uint32_t identity_budget = 0;
  ChannelTokens& operator+=(const ChannelTokens& o) {
    attention += o.attention;
    query += o.query;
    track += o.track;
    identity_budget += o.identity_budget;
    return *this;
  }
};

// Tokens a recalled block contributes to the budget.
inline uint32_t RecalledTokens(const RecalledBlock& b) {
  return b.token_offsets.empty()
             ? b.block.token_count
             : static_cast<uint32_t>(b.token_offsets.size());
}

struct LayerRecallSet {
  uint32_t layer = 0;
  uint32_t kv_head = 0;  // per_head sets.
  std::vector<RecalledBlock> blocks;
  uint32_t total_tokens = 0;
  ChannelTokens channels;
  float cold_share = 0;  // Its estimated share of the cold mass.
};

struct RecallResult {
  std::vector<RecalledBlock> blocks;
  uint32_t total_tokens = 0;
  uint32_t candidates = 0;
  uint32_t budget_tokens = 0;
  uint32_t top_k = 0;  // 0: no cap.
  uint32_t query_vectors = 0;
  // The vectors scored: query_vectors, or the representatives a larger
  // query was reduced to (engine/recall/query_reduction.h), and the time
  // the reduction took.
  uint32_t scored_vectors = 0;
  uint32_t reduce_us = 0;
  float recalled_mass = 0;  // Score mass: sum of the sets' mass.
  // Score mass: the set's estimated share of the attention mass outside
  // the window (its mass over every recallable unit's); with layer sets,
  // their mean.
  float cold_share = 0;
  bool window_estimated = false;  // Score mass: no window_lse was given.
  uint32_t search_us = 0;
  uint32_t plan_us = 0;
  uint32_t total_us = 0;
  // Token-resolution recall (scorer "mass"): tokens scored from their
  // codes, over every set, and the time that took (within plan_us).
  uint64_t tokens_scored = 0;
  uint32_t token_us = 0;
  // The answer's tokens by channel (summed over layer_sets when there are).
  ChannelTokens channels;
  std::vector<LayerRecallSet> layer_sets;
  // The accelerator's cost of this recall: its searches and the staging of
  // the chosen KV (modelled fields: the sim backend only; 0 on cpu).
  CallCost accel;
};

struct TierCount {
  uint64_t blocks = 0;
  uint64_t bytes = 0;
};

struct PolicyCounters {
  uint64_t demotions = 0;
  uint64_t degradations = 0;
  uint64_t evictions = 0;
  uint64_t promotions = 0;
  uint64_t promotions_declined = 0;  // Hits that did not earn a promotion.
  uint64_t staged = 0;
  uint64_t stage_hits = 0;
  uint64_t stage_misses = 0;
  uint64_t stage_bytes = 0;
  uint64_t rebuilds = 0;
  uint64_t shot_cuts = 0;
  uint32_t recall_us_p50 = 0;
  uint32_t recall_us_p99 = 0;
  uint32_t recall_us_max = 0;
};

// The stages of the append path whose CPU time a stream counts
// (StreamStats::ingest_cpu_ns; engine/stream/ingest_cpu.h measures them).
enum class IngestStage : int {
  kValidate = 0,  // The frame and its signals checked, the open block ready.
  kSummarize,     // The open block takes the frame (running key sums).
  kTokenGroups,   // Seal: token groups, their summaries and token codes.
  kWarmCopy,      // Seal: the block's layer-major copy in RAM.
  kSealRest,      // Seal: the block's summary, tracks, its record encoded.
  kEncode,        // The frame split in parts (and quantised with
                  // tier_policy.ingest_precision), signals and state
                  // encoded.
  kCommit,        // ColdStore::Commit on this thread (checksums, the WAL).
  kInstall,       // The block into the view and indexes; tier moves.
  kCount
};
inline constexpr int kIngestStages = static_cast<int>(IngestStage::kCount);

// The names JSON and proto fields use, in IngestStage order.
inline constexpr const char* kIngestStageNames[kIngestStages] = {
    "validate",  "summarize", "token_groups", "warm_copy",
    "seal_rest", "encode",    "commit",       "install"};

struct StreamStats {
  std::string stream_id;
  StreamConfig config;  // With defaults filled in.
  bool closed = false;
  int64_t last_durable_frame = -1;
  uint64_t next_token_position = 0;
  uint64_t frames = 0;
  uint64_t tokens = 0;
  uint64_t sealed_blocks = 0;
  uint32_t open_block_frames = 0;
  uint64_t payload_bytes = 0;
  uint64_t summary_bytes = 0;
  uint64_t token_code_bytes = 0;  // Token codes in RAM, besides summaries.
  // Tracks with a history in RAM: those shown by a kept block (they go
  // with the last of their blocks to leave RAM).
  uint64_t track_histories = 0;
  // RAM the signals hold: the kept blocks' (scene means, track presences
  // and their track map entries: SignalRamBytes) and the open block's
  // (BlockSemanticsBuilder::RamBytes), counted with the payload against
  // the byte limits.
  uint64_t signal_bytes = 0;
  // Index vectors copied by appends that outgrew the index's arrays under
  // the stream's writer lock (0 with "Progressive": it grows beside
  // recalls, StreamIndexes::Grow).
  uint64_t index_copied_in_place = 0;
  // RAM the indexes hold besides summary_bytes (StreamIndexes::memory_bytes).
  uint64_t index_bytes = 0;
  uint32_t summary_dim = 0;
  uint64_t recalls = 0;
  uint64_t recalled_blocks = 0;
  uint64_t recalled_tokens = 0;
  uint64_t warm_bytes = 0;
  uint64_t cold_bytes = 0;
  TierCount warm, cold, degraded, evicted;
  PolicyCounters policy;
  // Sampled recall@k of the index against exact search (approximate
  // index_factory kinds only; 0 samples otherwise).
  uint64_t index_recall_samples = 0;
  double index_recall_at_k = 1.0;
  // The append path's own CPU time by stage, in IngestStage order
  // (engine/stream/ingest_cpu.h), nanoseconds, since the stream was opened
  // in this server.
  std::array<uint64_t, kIngestStages> ingest_cpu_ns{};
  // The accelerator: this stream's calls, and the device's state.
  struct Accel {
    std::string backend;
    CallCost cost;  // Sum over this stream's calls.
    uint64_t sram_bytes = 0;
    uint64_t sram_hot_bytes = 0;
    uint64_t sram_staging_bytes = 0;
    uint64_t sram_repartitions = 0;  // Device-wide.
    double recall_floor = 0;         // 0: none.
    // Set when the index's sampled recall@k is below recall_floor.
    std::string warning;
  } accel;
};

// One piece of a block's payload, as FetchBlocks sends it.
struct PayloadPiece {
  uint64_t frame_index = 0;  // FRAME_MAJOR: the frame; else the block's first.
  uint32_t layer = 0;        // BLOCK_LAYER_MAJOR: the layer.
  // The bytes: parts back to back, in memory that `keep` holds alive (a
  // warm block's own, or a buffer made for the read), so a sender can hand
  // them on without copying.
  std::vector<absl::string_view> parts;
  std::shared_ptr<const void> keep;

  size_t size() const {
    size_t n = 0;
    for (absl::string_view p : parts) n += p.size();
    return n;
  }
  std::string ToString() const {
    std::string out;
    out.reserve(size());
    for (absl::string_view p : parts) out.append(p.data(), p.size());
    return out;
  }
  // A piece owning `bytes`.
  static PayloadPiece Owning(uint64_t frame_index, uint32_t layer,
                             std::string bytes) {
    auto owned = std::make_shared<const std::string>(std::move(bytes));
    PayloadPiece p;
    p.frame_index = frame_index;
    p.layer = layer;
    p.parts = {*owned};
    p.keep = std::move(owned);
    return p;
  }
};

enum class PayloadLayout { kFrameMajor, kBlockLayerMajor };

}  // namespace kvmem

#endif  // KVMEM_ENGINE_TYPES_H_
