#include "engine/index/row_chunks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>

namespace kvmem {

void FaultInBytes(const void* p, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto from = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = from & ~(page - 1);
  (void)madvise(reinterpret_cast<void*>(start), from + bytes - start,
                MADV_POPULATE_WRITE);
}

RowChunks::RowChunks(uint32_t dim) : dim_(std::max<uint32_t>(dim, 1)) {
  // The most rows, a power of two, whose floats fit kRowChunkBytes.
  const size_t row_bytes = size_t{dim_} * sizeof(float);
  shift_ = 0;
  while ((row_bytes << (shift_ + 1)) <= kRowChunkBytes) ++shift_;
  mask_ = (size_t{1} << shift_) - 1;
}

uint64_t RowChunks::bytes() const {
  return uint64_t{chunks_.size()} * (size_t{dim_} << shift_) * sizeof(float);
}

RowChunks::Chunk RowChunks::NewChunk() const {
  const size_t bytes = (size_t{dim_} << shift_) * sizeof(float);
  // 64-byte rows for the kernels' loads (bytes is a multiple of 64 from
  // dim 16; aligned_alloc wants a multiple of the alignment).
  return Chunk(
      static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
}

std::vector<RowChunks::Chunk> RowChunks::MakeRoom(size_t rows) const {
  std::vector<Chunk> out;
  const size_t want = (rows + mask_) >> shift_;
  for (size_t c = chunks_.size(); c < want; ++c) {
    Chunk chunk = NewChunk();
    if (chunk == nullptr) return {};
    // Only the rows asked for: a small index's one chunk stays mostly
    // untouched (no RSS) until rows come.
    const size_t used = std::min(rows - (c << shift_), mask_ + 1);
    FaultInBytes(chunk.get(), used * size_t{dim_} * sizeof(float));
    out.push_back(std::move(chunk));
  }
  return out;
}

void RowChunks::FaultIn(size_t from, size_t n) const {
  const size_t end = std::min(from + n, capacity());
  for (size_t r = from; r < end;) {
    // The rows of r's chunk from r on, up to end.
    const size_t stop = std::min(end, ((r >> shift_) + 1) << shift_);
    FaultInBytes(row(r), (stop - r) * size_t{dim_} * sizeof(float));
    r = stop;
  }
}

void RowChunks::Adopt(std::vector<Chunk>* more) {
  for (Chunk& c : *more) chunks_.push_back(std::move(c));
  more->clear();
}

void RowChunks::Reserve(size_t rows) {
  const size_t want = (rows + mask_) >> shift_;
  while (chunks_.size() < want) {
    Chunk chunk = NewChunk();
    if (chunk == nullptr) throw std::bad_alloc();
    chunks_.push_back(std::move(chunk));
  }
}

void RowChunks::Trim(size_t rows) {
  const size_t keep = ((rows + mask_) >> shift_) + 1;
  if (chunks_.size() > keep) chunks_.resize(keep);
}

}  // namespace kvmem
