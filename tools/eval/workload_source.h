// What the evaluation replays: one or more cameras' frames (their KV as a
// front end appends them) and the queries asked after each frame, with the
// labels that score re-identification. Two sources: the synthetic video
// workload (video_workload.h) and a recorded trace (trace_workload.h).
//
// Thread safety: a source is immutable after construction; its methods are
// safe from any thread.
#ifndef KVMEM_TOOLS_EVAL_WORKLOAD_SOURCE_H_
#define KVMEM_TOOLS_EVAL_WORKLOAD_SOURCE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tools/eval/video_workload_types.h"

namespace kvmem {

class WorkloadSource {
 public:
  virtual ~WorkloadSource() = default;

  // The geometry (layers, kv_heads, head_dim, tokens_per_frame), cameras,
  // frames, fps, sink_tokens, query_heads_per_kv and frame_query_tokens
  // the evaluation reads; a trace fills them from its header.
  virtual const VideoWorkloadOptions& options() const = 0;
  // Frame f of camera c (deterministic; any order).
  virtual WorkloadFrame Frame(uint32_t camera, uint64_t f) const = 0;
  // Queries issued after frame f of camera c; `frame` is Frame(camera, f).
  virtual std::vector<WorkloadQuery> Queries(
      uint32_t camera, uint64_t f, const WorkloadFrame& frame) const = 0;
  // Facts about the schedule, for the report (0 where unknown).
  virtual uint64_t shots(uint32_t camera) const = 0;
  virtual uint64_t walks() const = 0;
  // False for a trace recorded without values: its payload's values are
  // zeros, and attention outputs (and their errors) mean nothing.
  virtual bool has_values() const { return true; }

  // KV bytes of one token (all layers, K and V, fp16).
  uint64_t bytes_per_token() const;
  // Query vectors per query (WorkloadQuery::q_heads).
  uint32_t query_vectors() const {
    return options().query_heads_per_kv *
           std::max<uint32_t>(1, options().frame_query_tokens);
  }
  // Keys and values of a frame as the oracle reads them (its fp16 payload
  // as floats), [token][layer][kv_head][head_dim] each.
  void FrameKV(const WorkloadFrame& frame, std::vector<float>* keys,
               std::vector<float>* values) const;
};

// A query's mean vector (WorkloadQuery::q: what a front end sending one
// vector sends) of its `dim`-float vectors. Every source computes it here,
// so that a trace replays its workload's queries bit for bit.
std::vector<float> MeanQueryVector(
    const std::vector<std::vector<float>>& vectors, size_t dim);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_EVAL_WORKLOAD_SOURCE_H_
