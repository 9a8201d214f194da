#include "tools/eval/workload_source.h"

#include <algorithm>

#include "engine/codec/dtype.h"

namespace kvmem {

uint64_t WorkloadSource::bytes_per_token() const {
  const VideoWorkloadOptions& o = options();
  return static_cast<uint64_t>(o.layers) * 2 * o.kv_heads * o.head_dim * 2;
}

void WorkloadSource::FrameKV(const WorkloadFrame& frame,
                             std::vector<float>* keys,
                             std::vector<float>* values) const {
  const VideoWorkloadOptions& o = options();
  const size_t T = frame.frame.header.token_count(), d = o.head_dim,
               H = o.kv_heads;
  const size_t per = static_cast<size_t>(o.layers) * H * d;
  keys->assign(T * per, 0.0f);
  values->assign(T * per, 0.0f);
  const auto* src =
      reinterpret_cast<const uint8_t*>(frame.frame.payload.data());
  std::vector<float> buf(H * T * d);
  for (uint32_t l = 0; l < o.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      DecodeToFloat(src, buf.size(), DType::kFp16, buf.data());
      src += buf.size() * 2;
      std::vector<float>* out = kv == 0 ? keys : values;
      for (size_t h = 0; h < H; ++h)
        for (size_t t = 0; t < T; ++t)
          std::copy_n(buf.data() + (h * T + t) * d, d,
                      out->data() + t * per + (l * H + h) * d);
    }
  }
}

std::vector<float> MeanQueryVector(
    const std::vector<std::vector<float>>& vectors, size_t dim) {
  std::vector<float> q(dim, 0.0f);
  const float k = 1.0f / static_cast<float>(vectors.size());
  for (const auto& v : vectors) {
    for (size_t i = 0; i < dim; ++i) q[i] += k * v[i];
  }
  return q;
}

}  // namespace kvmem
