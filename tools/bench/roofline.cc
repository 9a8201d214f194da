#include "tools/bench/roofline.h"

#include <algorithm>
#include <cmath>

namespace kvmem {
namespace {

RooflineCase Case(const RooflineInput& in, uint64_t bytes_per_token,
                  uint64_t tokens, double ridge) {
  RooflineCase c;
  c.tokens = tokens;
  c.bytes_per_step = static_cast<double>(tokens) * bytes_per_token;
  c.flops_per_step =
      4.0 * in.layers * in.q_heads * in.head_dim * static_cast<double>(tokens);
  c.intensity = c.bytes_per_step > 0 ? c.flops_per_step / c.bytes_per_step : 0;
  if (in.bandwidth_bytes_per_s > 0)
    c.memory_time_s = c.bytes_per_step / in.bandwidth_bytes_per_s;
  if (in.peak_flops > 0) c.compute_time_s = c.flops_per_step / in.peak_flops;
  c.memory_bound = ridge > 0 && c.intensity < ridge;
  return c;
}

}  // namespace

RooflineResult ComputeRoofline(const RooflineInput& in) {
  RooflineResult r;
  r.kv_bytes_per_token = static_cast<uint64_t>(in.layers) * 2 * in.kv_heads *
                         in.head_dim * in.dtype_bytes;
  r.kv_growth_bytes_per_s =
      in.fps * in.tokens_per_frame * static_cast<double>(r.kv_bytes_per_token);
  if (in.memory_bytes > 0 && r.kv_growth_bytes_per_s > 0)
    r.seconds_until_full = in.memory_bytes / r.kv_growth_bytes_per_s;
  if (in.bandwidth_bytes_per_s > 0 && in.peak_flops > 0)
    r.ridge = in.peak_flops / in.bandwidth_bytes_per_s;
  r.recall_tokens =
      static_cast<uint32_t>(std::lround(in.recall_fraction * in.window));
  r.recall_bytes_per_frame =
      static_cast<double>(r.recall_tokens) * r.kv_bytes_per_token;
  r.full = Case(in, r.kv_bytes_per_token, in.context, r.ridge);
  r.kvmem =
      Case(in, r.kv_bytes_per_token,
           std::min<uint64_t>(
               in.context, static_cast<uint64_t>(in.window) + r.recall_tokens),
           r.ridge);
  return r;
}

}  // namespace kvmem
