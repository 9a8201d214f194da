#include "engine/recall/token_groups.h"

#include <algorithm>

#include "base/bounded_pool.h"
#include "base/split_mix.h"
#include "base/sync.h"
#include "base/thread_scratch.h"
#include "engine/codec/dtype.h"
#include "engine/index/dot.h"
#include "engine/recall/spherical_kmeans.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

// Assignment passes of the k-means, the seeding's included.
constexpr int kPasses = 6;

// Clustering compares tokens by the cosine of their keys over every indexed
// layer. Past kClusterDim floats a token (a 7B model with every layer
// indexed: 32,768) the k-means runs on a fold of the keys to kClusterDim
// floats (FoldRows), not on the keys: its dots were ~95 % of a 7B seal's
// token groups (kvmem_engine_bench BM_TokenGroups7B). Summaries and codes
// still come from the full keys; only which tokens go together is decided on
// the fold. Streams of at most kClusterDim floats a token cluster their keys
// as before, bit for bit.
constexpr size_t kClusterDim = 2048;
constexpr size_t kKeptFoldBytes = size_t{8} << 20;

// Key buffers shared by all seals: a 7B block's keys are tens of megabytes
// (every layer indexed: 64 MiB), and a fresh buffer each seal was page
// faults (the kernel zeroing each new page: a fifth of a RADOS ingest's
// server CPU). Seals run on whichever worker appends, so the pool, not each
// thread, keeps them: at most kPooledBuffers of at most kPooledFloats (64
// MiB) each, 128 MiB in all whatever the thread count; a seal beyond them
// uses a fresh buffer. Clustering reads the keys through their norms and
// the codes through a row order, so they are the seal's one large buffer.
constexpr size_t kPooledBuffers = 2;
constexpr size_t kPooledFloats = size_t{1} << 24;

BoundedPool<std::vector<float>>& KeyBuffers() {
  static auto* pool = new BoundedPool<std::vector<float>>(
      kPooledBuffers, kPooledFloats * sizeof(float));
  return *pool;
}

// Returns a seal's key buffer to the pool.
void GiveBackKeys(std::vector<float> keys) {
  const size_t bytes = keys.capacity() * sizeof(float);
  KeyBuffers().GiveBack(std::move(keys), bytes);
}

// The n rows of dim floats folded to out_dim floats each (dim > out_dim): a
// count sketch (Charikar, Chen and Farach-Colton, 2002) whose buckets keep
// runs of coordinates together. Coordinate i of run b = i / out_dim goes,
// with a fixed pseudo-random sign, to bucket (i + shift_b) mod out_dim
// (shift_0 = 0, the others pseudo-random), so the dot of two folds is the
// dot of their rows plus cross terms of mean zero, whose spread shrinks as
// 1 / sqrt(out_dim). The shifts keep one head's coordinates that are large
// in every layer (RoPE's low frequencies) out of one bucket. Deterministic.
void FoldRows(const float* rows, size_t n, size_t dim, size_t out_dim,
              std::vector<float>* out) {
  std::vector<float> sign(dim);
  for (size_t i = 0; i < dim; ++i)
    sign[i] = (SplitMix64(i) & 1) != 0 ? 1.0f : -1.0f;
  const size_t runs = (dim + out_dim - 1) / out_dim;
  std::vector<size_t> shift(runs, 0);
  for (size_t b = 1; b < runs; ++b)
    shift[b] = SplitMix64(~uint64_t{b}) % out_dim;
  out->assign(n * out_dim, 0.0f);
  for (size_t t = 0; t < n; ++t) {
    const float* x = rows + t * dim;
    float* y = out->data() + t * out_dim;
    for (size_t b = 0; b < runs; ++b) {
      const size_t begin = b * out_dim;
      const size_t len = std::min(out_dim, dim - begin);
      // Buckets shift_b .. out_dim - 1, then 0 onwards.
      const size_t head = std::min(len, out_dim - shift[b]);
      AddSigned(x + begin, sign.data() + begin, y + shift[b], head);
      AddSigned(x + begin + head, sign.data() + begin + head, y, len - head);
    }
  }
}

// Keys per token of the frames into *keys (every element written):
// [token][indexed_layer][kv_head][head_dim].
void GatherKeys(const StreamConfig& config,
                const std::vector<absl::string_view>& frames,
                const std::vector<uint32_t>& frame_tokens,
                std::vector<float>* keys_out) {
  const Geometry& g = config.geometry;
  const std::vector<uint32_t> layers = EffectiveIndexedLayers(config);
  const size_t dim = SummaryDim(config);
  size_t n = 0;
  for (uint32_t t : frame_tokens) n += t;
  std::vector<float>& keys = *keys_out;
  if (keys.capacity() < n * dim) {
    // Exactly what is needed (growth by doubling would outgrow the pool).
    keys = std::vector<float>();
    keys.reserve(n * dim);
  }
  keys.resize(n * dim);
  const size_t width = DTypeBytes(g.dtype);
  size_t token0 = 0;
  for (size_t f = 0; f < frames.size(); ++f) {
    const uint32_t tc = frame_tokens[f];
    const uint64_t slice_bytes = LayerSliceElements(g, tc) * width;
    const uint64_t row_bytes = static_cast<uint64_t>(g.head_dim) * width;
    const auto* base = reinterpret_cast<const uint8_t*>(frames[f].data());
    for (size_t li = 0; li < layers.size(); ++li) {
      const uint8_t* k = base + 2 * slice_bytes * layers[li];
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t t = 0; t < tc; ++t) {
          float* dst = keys.data() + (token0 + t) * dim +
                       (li * g.kv_heads + h) * g.head_dim;
          DecodeToFloat(k + (static_cast<uint64_t>(h) * tc + t) * row_bytes,
                        g.head_dim, g.dtype, dst);
        }
      }
    }
    token0 += tc;
  }
}

// The raw mean key of each non-empty group, renumbered densely.
TokenGroups Summaries(const std::vector<float>& keys,
                      const std::vector<uint8_t>& assign, size_t n, size_t dim,
                      size_t k) {
  TokenGroups out;
  std::vector<double> sums(k * dim, 0.0);
  std::vector<uint32_t> count(k, 0);
  for (size_t i = 0; i < n; ++i) {
    ++count[assign[i]];
    AddAsDouble(keys.data() + i * dim, sums.data() + assign[i] * dim, dim);
  }
  std::vector<uint8_t> dense(k, 0);
  uint8_t groups = 0;
  for (size_t c = 0; c < k; ++c) groups += count[c] > 0;
  out.summaries.resize(size_t{groups} * dim);
  groups = 0;
  for (size_t c = 0; c < k; ++c) {
    if (count[c] == 0) continue;
    DivideToFloat(sums.data() + c * dim, count[c],
                  out.summaries.data() + size_t{groups} * dim, dim);
    dense[c] = groups++;
  }
  out.token_group.resize(n);
  for (size_t i = 0; i < n; ++i) out.token_group[i] = dense[assign[i]];
  return out;
}

}  // namespace

TokenGroups BuildTokenGroups(const StreamConfig& config,
                             const std::vector<absl::string_view>& frames,
                             const std::vector<uint32_t>& frame_tokens,
                             uint32_t max_groups) {
  const size_t dim = SummaryDim(config);
  std::vector<float> keys = KeyBuffers().Take();
  GatherKeys(config, frames, frame_tokens, &keys);
  const size_t n = keys.size() / std::max<size_t>(dim, 1);
  if (n == 0) {
    GiveBackKeys(std::move(keys));
    return TokenGroups();
  }
  const size_t k = std::min<size_t>(std::max<uint32_t>(1, max_groups), n);
  // The rows the k-means compares: the keys, or their fold (kClusterDim).
  struct Fold {
    std::vector<float> rows;
  };
  const float* rows = keys.data();
  size_t cdim = dim;
  if (dim > kClusterDim) {
    std::vector<float>& folded = ThreadScratch<Fold>().rows;
    FoldRows(keys.data(), n, dim, kClusterDim, &folded);
    rows = folded.data();
    cdim = kClusterDim;
  }
  std::vector<uint8_t> assign = SphericalKMeans(rows, n, cdim, k, kPasses);
  // A thread keeps its fold for the next seal (4 MiB for a 7B block of 512
  // tokens), not a rare larger one's.
  if (cdim != dim &&
      ThreadScratch<Fold>().rows.capacity() * sizeof(float) > kKeptFoldBytes) {
    ReleaseThreadScratch<Fold>();
  }
  TokenGroups groups = Summaries(keys, assign, n, dim, k);
  // The codes in group order (a group's tokens are one run: recall reads
  // them in sequence).
  std::vector<uint32_t> order;
  order.reserve(n);
  const uint8_t used = static_cast<uint8_t>(groups.summaries.size() / dim);
  for (uint8_t g = 0; g < used; ++g) {
    for (size_t t = 0; t < n; ++t) {
      if (groups.token_group[t] == g) order.push_back(static_cast<uint32_t>(t));
    }
  }
  groups.codes =
      EncodeTokenCodes(TokenCodeShapeOf(config), keys.data(), n, order.data());
  GiveBackKeys(std::move(keys));
  return groups;
}

TokenCodeShape TokenCodeShapeOf(const StreamConfig& config) {
  TokenCodeShape shape;
  shape.head_dim = config.geometry.head_dim;
  shape.segments = SummaryDim(config) / std::max<uint32_t>(shape.head_dim, 1);
  return shape;
}

}  // namespace kvmem
