// RowChunks: rows of `dim` floats kept in chunks of a fixed number of rows,
// so room for more rows is a new chunk and never a copy of the rows held.
//
// Why: ProgressiveIndex keeps every summary at fp32 for its exact stage.
// At 7B's summary width (32 layers x 8 KV heads x 128 = 32,768 dims, 128
// KiB a row, 33 rows a sealed block) a vector's doubling copied the whole
// array and faulted in twice its pages at every doubling: 11 % of a
// two-camera server's samples (docs/benchmarks.md, cameras). Rows do not
// move here; a chunk is about kRowChunkBytes (at least one row).
//
// Thread safety: const members may run concurrently; Append, Adopt and
// Trim need exclusive access. MakeRoom and FaultIn only read (a writer's
// growth prepared beside readers, adopted under its lock).
#ifndef KVMEM_ENGINE_INDEX_ROW_CHUNKS_H_
#define KVMEM_ENGINE_INDEX_ROW_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

namespace kvmem {

inline constexpr size_t kRowChunkBytes = size_t{256} << 10;

// Faults in the pages of [p, p + bytes) for writing, writing nothing
// (MADV_POPULATE_WRITE, Linux 5.14; elsewhere the writes fault them).
void FaultInBytes(const void* p, size_t bytes);

class RowChunks {
 public:
  struct FreeChunk {
    void operator()(float* p) const { std::free(p); }
  };
  using Chunk = std::unique_ptr<float, FreeChunk>;

  explicit RowChunks(uint32_t dim);

  float* row(size_t r) {
    return chunks_[r >> shift_].get() + (r & mask_) * size_t{dim_};
  }
  const float* row(size_t r) const {
    return chunks_[r >> shift_].get() + (r & mask_) * size_t{dim_};
  }
  // Rows the chunks have room for.
  size_t capacity() const { return chunks_.size() << shift_; }
  size_t rows_per_chunk() const { return size_t{1} << shift_; }
  // RAM the chunks hold.
  uint64_t bytes() const;

  // New chunks that bring the room to `rows` rows, the pages of the rows
  // up to `rows` faulted in; empty when the room is there (or an
  // allocation failed: Reserve then allocates as it goes).
  std::vector<Chunk> MakeRoom(size_t rows) const;
  // Faults in the pages of rows [from, from + n) that the chunks hold (no
  // row is written: readers of the others go on).
  void FaultIn(size_t from, size_t n) const;
  // Appends chunks MakeRoom made (moved from *more).
  void Adopt(std::vector<Chunk>* more);
  // Room for `rows` rows, allocated here. Throws std::bad_alloc as a
  // vector's growth would.
  void Reserve(size_t rows);
  // Frees the chunks past those `rows` rows use and one spare.
  void Trim(size_t rows);

 private:
  Chunk NewChunk() const;

  uint32_t dim_;
  uint32_t shift_;  // log2 of the rows per chunk.
  size_t mask_;
  std::vector<Chunk> chunks_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_ROW_CHUNKS_H_
