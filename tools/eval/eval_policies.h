// The policies `kvmem eval` runs side by side. Each one sees the same
// stream and keeps, besides the attention sinks and the hot window of W
// tokens, at most R more tokens its own way; it answers a query with the
// spans of older tokens it lets attention read ("recalled").
//
//   full           every token (unbounded; the reference).
//   streaming_llm  sinks + a window of W + R (StreamingLLM, Xiao et al. 2023).
//   window_lru     window + an LRU cache of R tokens of the blocks leaving the
//                  window; a cached block is touched when it gets >= 1 % of
//                  the attention the policy computes over what it holds.
//   h2o            window + the R heavy hitters by accumulated attention
//                  among tokens that left the window (H2O, Zhang et al. 2023);
//                  evicted tokens are gone.
//   mean_key_topk  every block offloaded; window + the top-k blocks by
//                  query . mean key, up to R tokens (InfLLM / ReKV style: no
//                  heat, no semantic signals).
//   kvmem          the real engine (in process, or a kvmem-server over gRPC)
//                  with its configured policy (and variants: kvmem_*).
//   oracle_tokens, exact_keys_per_head  reference selections (eval.h).
//
// Blocks of the baselines are a fixed grid of frames_per_block frames.
// Thread safety: one thread drives all policies.
#ifndef KVMEM_TOOLS_EVAL_EVAL_POLICIES_H_
#define KVMEM_TOOLS_EVAL_EVAL_POLICIES_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/kvmem_client.h"
#include "tools/eval/video_workload.h"

namespace kvmem {

struct Span {
  uint64_t begin = 0, end = 0;  // Token positions [begin, end).
  uint64_t size() const { return end - begin; }
};

// What the runner keeps of one camera's stream: every token's key, for the
// oracle and for policies that read keys (mean_key_topk, h2o scores).
struct CameraTokens {
  uint64_t tokens = 0;       // Appended so far (positions 0..tokens-1).
  uint32_t sink_tokens = 0;  // Positions [0, sink_tokens) are sinks.
  uint32_t per_token = 0;    // Floats per token: layers * kv_heads * head_dim.
  std::vector<float> keys;   // [token][layer][kv_head][head_dim]
  std::vector<float> values;
};

struct PolicyBudget {
  uint32_t window = 0;        // W: hot window tokens.
  uint32_t recall = 0;        // R: tokens beyond the window and the sinks.
  uint32_t block_tokens = 0;  // Grid block size of the baselines.
  uint32_t top_k = 0;
  uint64_t bytes_per_token = 0;
  // The first position of the hot window when `tokens` are held.
  uint64_t WindowStart(uint64_t tokens) const {
    return tokens > window ? tokens - window : 0;
  }
};

struct Selection {
  bool everything = false;       // full: every token.
  std::vector<Span> recalled;    // Sorted, disjoint, outside sinks and window.
  std::vector<Span> units;       // Recalled blocks (for useless-hit counts).
  uint32_t degraded_blocks = 0;  // kvmem: recalled blocks held as int8.
  // kvmem: each recalled block's tokens and gate weight (parallel to
  // units), and the set's estimated share of attention (< 0: none).
  std::vector<std::vector<Span>> unit_spans;
  std::vector<float> unit_gates;
  float estimated_mass = -1;
  // kvmem: the set as returned broke the budget (bit 0) or held hot-window
  // tokens (bit 1); `recalled` is clipped either way.
  uint8_t violations = 0;
  // When >= 0, the selection's own time (kvmem: the recall call, without
  // the front end's window log-sum-exp), else the runner times Select.
  float latency_us = -1;
  // kvmem with per-head sets: the tokens each KV head ([layer][kv_head])
  // attends besides sinks and window; `recalled` is then their union.
  std::vector<std::vector<Span>> head_recalled;
  // kvmem: the set's tokens the identity channel chose (per set with
  // per-head sets), for the query as a whole and for its tracks.
  float query_tokens = 0, track_tokens = 0;
};

// What the runner knows of a query besides the workload: the oracle's
// attention per token (mean over query heads), for oracle_tokens.
struct QueryOracle {
  const std::vector<double>* attention = nullptr;
};

class EvalPolicy {
 public:
  virtual ~EvalPolicy() = default;
  virtual const char* name() const = 0;
  // After the frame was appended to `cam`.
  virtual absl::Status OnFrame(const WorkloadFrame& frame,
                               const CameraTokens& cam) = 0;
  virtual absl::Status Select(const WorkloadQuery& q, const CameraTokens& cam,
                              const QueryOracle& oracle, Selection* out) = 0;
  // The attention (oracle probabilities averaged over heads, whole stream)
  // and the mass of what the policy attended; policies that learn from
  // their own attention (h2o, window_lru) use it.
  virtual void Observe(const Selection& /*sel*/,
                       const std::vector<double>& /*pbar*/, double /*mass*/,
                       const CameraTokens& /*cam*/) {}
  // Tokens held in accelerator memory now (sinks, window, recalled or cached).
  virtual uint64_t ResidentTokens(const CameraTokens& cam) const = 0;
  // Bytes the policy keeps anywhere (accelerator, host RAM, disk).
  virtual uint64_t StoredBytes(const CameraTokens& cam) const = 0;
};

// Connection to kvmem for the kvmem policy: in-process engine or gRPC.
class KvmemBackend {
 public:
  virtual ~KvmemBackend() = default;
  virtual absl::Status Open(const std::string& id,
                            const v1::StreamConfig& config) = 0;
  virtual absl::Status Append(const std::string& id,
                              const OutgoingFrame& frame) = 0;
  virtual absl::Status Recall(const std::string& id,
                              const v1::RecallRequest& req,
                              v1::RecallResponse* resp) = 0;
  virtual absl::Status Stats(const std::string& id, v1::StreamStats* out) = 0;
  // Lets background work (tier moves, rebuilds) catch up; for determinism.
  virtual void Settle() {}
};

// An in-process MemoryEngine over RocksDB in `data_dir`.
absl::StatusOr<std::unique_ptr<KvmemBackend>> OpenInProcessBackend(
    const std::string& data_dir);
// A kvmem-server at `target` (unix:/path or host:port), one Session per
// stream.
absl::StatusOr<std::unique_ptr<KvmemBackend>> OpenGrpcBackend(
    const std::string& target);

std::unique_ptr<EvalPolicy> MakeFullPolicy(const PolicyBudget& b);
std::unique_ptr<EvalPolicy> MakeStreamingLlmPolicy(const PolicyBudget& b);
std::unique_ptr<EvalPolicy> MakeWindowLruPolicy(const PolicyBudget& b);
std::unique_ptr<EvalPolicy> MakeH2oPolicy(const PolicyBudget& b);
std::unique_ptr<EvalPolicy> MakeMeanKeyTopkPolicy(const PolicyBudget& b);
std::unique_ptr<EvalPolicy> MakeOracleTokensPolicy(const PolicyBudget& b);
// head_dim: of the workload's KV heads (cam.per_token / head_dim of them).
std::unique_ptr<EvalPolicy> MakeExactKeysPerHeadPolicy(const PolicyBudget& b,
                                                       uint32_t head_dim);

// How the kvmem policy queries its stream (eval.h's KvmemKnobs).
struct KvmemRequestOptions {
  uint32_t top_k = 0;        // 0: the stream's default.
  bool send_budget = true;   // Else max_tokens 0: the stream's default.
  bool window_lse = true;    // Send the sinks + window log-sum-exp.
  bool query_heads = false;  // One vector per query head, not the mean.
  bool per_head = false;     // A recall set per KV head.
  uint32_t head_dim = 0;
  uint32_t kv_heads = 0;  // Per layer (per_head sets' index).
};
// The stream is opened on `backend` (not owned) as `stream_id` with config;
// `name` is the policy's.
absl::StatusOr<std::unique_ptr<EvalPolicy>> MakeKvmemPolicy(
    const std::string& name, const PolicyBudget& b, KvmemBackend* backend,
    const std::string& stream_id, const v1::StreamConfig& config,
    const KvmemRequestOptions& request);

// The natural log of sum over the sinks and the hot window of exp(q . k /
// sqrt(head_dim)), per query vector and KV head: what a front end sends as
// RecallRequest.window_lse. q_vectors[j] is [kv_head][head_dim].
std::vector<float> WindowLogSumExp(
    const std::vector<std::vector<float>>& q_vectors, const CameraTokens& cam,
    uint64_t window_start, uint32_t head_dim);

// Tokens in spans; sinks + window bounded by what exists.
uint64_t TotalTokens(const std::vector<Span>& spans);
uint64_t BaseResidentTokens(const PolicyBudget& b, const CameraTokens& cam);

// Sorted, disjoint spans of a sorted list of positions.
std::vector<Span> SpansOf(const std::vector<uint64_t>& sorted_positions);
// Clips spans to [lo, hi) and merges them; input in any order.
std::vector<Span> ClipMerge(std::vector<Span> spans, uint64_t lo, uint64_t hi);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_EVAL_EVAL_POLICIES_H_
