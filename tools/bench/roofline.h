// Roofline arithmetic of decode attention over a streaming video KV cache,
// for full KV and for kvmem's budgeted recall (hot window + recall budget).
// The source article's check before any hardware work: is the workload
// memory-bound at the target sequence length?
//
// Per decode step, attention reads every attended token's K and V of every
// layer (bytes = tokens * kv_bytes_per_token) and does, per layer and query
// head, q.K (2 * head_dim * tokens FLOPs) and p.V (the same): FLOPs =
// 4 * layers * q_heads * head_dim * tokens. Arithmetic intensity is their
// ratio (independent of the token count: 2 * q_heads / (kv_heads * dtype
// bytes)); the device's ridge point is peak FLOP/s over DRAM bytes/s; below
// the ridge the step is memory-bound.
#ifndef KVMEM_TOOLS_BENCH_ROOFLINE_H_
#define KVMEM_TOOLS_BENCH_ROOFLINE_H_

#include <cstdint>
#include <string>

namespace kvmem {

struct RooflineInput {
  uint32_t layers = 32;
  uint32_t kv_heads = 8;
  uint32_t q_heads = 32;  // Query heads (grouped-query attention).
  uint32_t head_dim = 128;
  uint32_t dtype_bytes = 2;
  double fps = 3;
  uint32_t tokens_per_frame = 128;
  uint64_t context = 10000;  // Tokens a full-KV step attends to.
  // Device; 0 means unknown (the figures that need it are omitted).
  double memory_bytes = 0;  // Memory available to the KV cache.
  double bandwidth_bytes_per_s = 0;
  double peak_flops = 0;
  // kvmem: attended tokens = hot window + recall budget (fraction of it).
  uint32_t window = 2048;
  double recall_fraction = 0.3;
};

struct RooflineCase {
  uint64_t tokens = 0;  // Attended per decode step.
  double bytes_per_step = 0;
  double flops_per_step = 0;
  double intensity = 0;       // FLOP per byte.
  double memory_time_s = 0;   // bytes / bandwidth.
  double compute_time_s = 0;  // FLOPs / peak.
  bool memory_bound = false;
};

struct RooflineResult {
  uint64_t kv_bytes_per_token = 0;
  double kv_growth_bytes_per_s = 0;
  double seconds_until_full = 0;  // 0 when the memory size is unknown.
  double ridge = 0;               // FLOP per byte; 0 when unknown.
  uint32_t recall_tokens = 0;
  double recall_bytes_per_frame = 0;  // Recalled KV moved per query.
  RooflineCase full, kvmem;
};

RooflineResult ComputeRoofline(const RooflineInput& in);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_ROOFLINE_H_
