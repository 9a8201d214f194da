#include "engine/codec/block_layout.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "base/bounded_pool.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Warm copies' memory, kept a while when a block leaves RAM: the next seal
// (with warm budgets of a block or two per stream, a demotion frees one
// about when a seal needs one) writes into pages it has, where a fresh
// 64 MiB copy of a 7B block was page faults (the kernel zeroing each
// page). At most two of at most 64 MiB (plus a layer's alignment) are
// kept (base/bounded_pool.h): RAM no stream's budget counts.
struct FreeBytes {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::pair<size_t, std::unique_ptr<uint8_t, FreeBytes>>;
constexpr size_t kPooledWarmCopies = 2;
constexpr size_t kPooledWarmBytes = (64ull << 20) + kLayerAlign;

BoundedPool<Buffer>& WarmBuffers() {
  static auto* pool =
      new BoundedPool<Buffer>(kPooledWarmCopies, kPooledWarmBytes);
  return *pool;
}

// A new buffer of a block of at least a huge page starts on one, and the
// kernel is asked to back it with huge pages (MADV_HUGEPAGE: Debian's
// kernels use them only where asked). A 7B block's 64 MiB copy was 16,384
// page faults, and each fault traps into the kernel: ~200 ms of a seal on
// a 2-vCPU VM (the copy itself ~10 ms); 32 faults of 2 MiB each instead.
// Whatever kvmem-server --huge_pages does with the rest of the heap
// (server/ops/huge_pages.h), which is off by default on RocksDB.
constexpr size_t kHugePage = size_t{2} << 20;

uint8_t* NewBuffer(size_t bytes) {
  if (bytes < kHugePage) {
    return static_cast<uint8_t*>(std::aligned_alloc(kLayerAlign, bytes));
  }
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, bytes) != 0) return nullptr;
  (void)madvise(p, bytes, MADV_HUGEPAGE);  // Advice: 4 KiB pages otherwise.
  return static_cast<uint8_t*>(p);
}

// A kept buffer of exactly `bytes`, else a new one (null on failure).
uint8_t* TakeBuffer(size_t bytes) {
  Buffer b = WarmBuffers().Take();
  if (b.second != nullptr && b.first == bytes) return b.second.release();
  return NewBuffer(bytes);
}

}  // namespace

WarmBlock::WarmBlock(const Geometry& g, uint32_t tokens)
    : geometry_(g),
      tokens_(tokens),
      slice_bytes_(LayerSliceElements(g, tokens) * DTypeBytes(g.dtype)),
      padded_slice_(RoundUp(slice_bytes_, kSliceAlign)),
      layer_stride_(RoundUp(2 * padded_slice_, kLayerAlign)) {
  const size_t bytes = buffer_bytes();
  data_ = TakeBuffer(bytes);
  if (data_ == nullptr) throw std::bad_alloc();
  // Padding is deterministic; the slices are written whole by the makers
  // (FromFrames, FromLayers): zeroing them too was a pass over every byte
  // of each sealed block.
  if (allocated_bytes() == 0) {
    std::memset(data_, 0, bytes);
    return;
  }
  for (uint32_t l = 0; l < g.layers; ++l) {
    uint8_t* layer = data_ + LayerOffset(l);
    std::memset(layer + slice_bytes_, 0, padded_slice_ - slice_bytes_);
    std::memset(layer + padded_slice_ + slice_bytes_, 0,
                layer_stride_ - padded_slice_ - slice_bytes_);
  }
}

WarmBlock::~WarmBlock() {
  const size_t bytes = buffer_bytes();
  WarmBuffers().GiveBack(
      Buffer(bytes, std::unique_ptr<uint8_t, FreeBytes>(data_)), bytes);
}

size_t WarmBlock::AllocatedBytes(const Geometry& g, uint32_t tokens) {
  const size_t slice = LayerSliceElements(g, tokens) * DTypeBytes(g.dtype);
  return RoundUp(2 * RoundUp(slice, kSliceAlign), kLayerAlign) * g.layers;
}

std::unique_ptr<WarmBlock> WarmBlock::FromFrames(
    const Geometry& g, const std::vector<absl::string_view>& frames,
    const std::vector<uint32_t>& tokens) {
  uint32_t total = 0;
  for (uint32_t t : tokens) total += t;
  std::unique_ptr<WarmBlock> b(new WarmBlock(g, total));
  const size_t row = static_cast<size_t>(g.head_dim) * DTypeBytes(g.dtype);
  // Frame f's rows of head h go after the rows of the frames before it.
  size_t token_offset = 0;
  for (size_t f = 0; f < frames.size(); ++f) {
    const size_t frame_slice =
        static_cast<size_t>(g.kv_heads) * tokens[f] * row;
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const char* src = frames[f].data() + (2 * l + kv) * frame_slice;
        uint8_t* dst = b->MutableSlice(l, kv);
        for (uint32_t h = 0; h < g.kv_heads; ++h) {
          std::memcpy(
              dst + (static_cast<size_t>(h) * total + token_offset) * row,
              src + static_cast<size_t>(h) * tokens[f] * row, tokens[f] * row);
        }
      }
    }
    token_offset += tokens[f];
  }
  return b;
}

std::unique_ptr<WarmBlock> WarmBlock::FromLayers(
    const Geometry& g, uint32_t tokens,
    const std::vector<std::string>& layers) {
  std::unique_ptr<WarmBlock> b(new WarmBlock(g, tokens));
  for (uint32_t l = 0; l < g.layers; ++l) {
    std::memcpy(b->MutableSlice(l, 0), layers[l].data(), b->slice_bytes_);
    std::memcpy(b->MutableSlice(l, 1), layers[l].data() + b->slice_bytes_,
                b->slice_bytes_);
  }
  return b;
}

absl::string_view WarmBlock::K(uint32_t layer) const {
  return absl::string_view(
      reinterpret_cast<const char*>(data_ + LayerOffset(layer)), slice_bytes_);
}

absl::string_view WarmBlock::V(uint32_t layer) const {
  return absl::string_view(
      reinterpret_cast<const char*>(data_ + LayerOffset(layer) + padded_slice_),
      slice_bytes_);
}

std::string WarmBlock::LayerRecord(uint32_t layer) const {
  std::string out(2 * slice_bytes_, '\0');
  CopyLayerRecord(layer, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

void WarmBlock::CopyLayerRecord(uint32_t layer, uint8_t* dst) const {
  std::memcpy(dst, K(layer).data(), slice_bytes_);
  std::memcpy(dst + slice_bytes_, V(layer).data(), slice_bytes_);
}

uint8_t* WarmBlock::CopyFrame(size_t token_offset, uint32_t t,
                              uint8_t* dst) const {
  const Geometry& g = geometry_;
  const size_t row = static_cast<size_t>(g.head_dim) * DTypeBytes(g.dtype);
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const uint8_t* src = data_ + LayerOffset(l) + kv * padded_slice_;
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        std::memcpy(
            dst, src + (static_cast<size_t>(h) * tokens_ + token_offset) * row,
            t * row);
        dst += t * row;
      }
    }
  }
  return dst;
}

std::vector<std::string> WarmBlock::ToFrames(
    const std::vector<uint32_t>& frame_tokens) const {
  const Geometry& g = geometry_;
  const size_t row = static_cast<size_t>(g.head_dim) * DTypeBytes(g.dtype);
  std::vector<std::string> frames;
  frames.reserve(frame_tokens.size());
  size_t token_offset = 0;
  for (uint32_t t : frame_tokens) {
    std::string& out = frames.emplace_back(
        static_cast<size_t>(2) * g.layers * g.kv_heads * t * row, '\0');
    CopyFrame(token_offset, t, reinterpret_cast<uint8_t*>(out.data()));
    token_offset += t;
  }
  return frames;
}

void WarmBlock::CopyFrames(const std::vector<uint32_t>& frame_tokens,
                           uint8_t* dst) const {
  size_t token_offset = 0;
  for (uint32_t t : frame_tokens) {
    dst = CopyFrame(token_offset, t, dst);
    token_offset += t;
  }
}

}  // namespace kvmem
