#include "engine/codec/block_layout.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "engine/stream_config.h"

namespace kvmem {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

WarmBlock::WarmBlock(const Geometry& g, uint32_t tokens)
    : geometry_(g),
      tokens_(tokens),
      slice_bytes_(LayerSliceElements(g, tokens) * DTypeBytes(g.dtype)),
      padded_slice_(RoundUp(slice_bytes_, kSliceAlign)),
      layer_stride_(RoundUp(2 * padded_slice_, kLayerAlign)) {
  const size_t bytes = allocated_bytes() == 0 ? kLayerAlign : allocated_bytes();
  data_ = static_cast<uint8_t*>(std::aligned_alloc(kLayerAlign, bytes));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, bytes);  // Padding is deterministic.
}

WarmBlock::~WarmBlock() { std::free(data_); }

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
