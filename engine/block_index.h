// BlockIndex: the per-stream vector index over block summaries. v1 wraps an
// exact inner-product FAISS index (IndexFlatIP under an IndexIDMap2) so block
// ids survive later removals.
//
// Thread safety: Search may run concurrently with other Search calls; Add must
// not run concurrently with anything (the owning Stream's writer lock ensures
// it). FAISS is pinned to one OpenMP thread per calling thread for searches:
// a single-query scan is far below the size where threads pay off, and a
// server must not oversubscribe its cores.
#ifndef KVMEM_ENGINE_BLOCK_INDEX_H_
#define KVMEM_ENGINE_BLOCK_INDEX_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace faiss {
struct Index;
}

namespace kvmem {

struct ScoredId {
  uint64_t id;
  float score;
};

class BlockIndex {
 public:
  // REQUIRES: dim > 0 and factory == "Flat" (checked by stream validation).
  BlockIndex(uint32_t dim);
  ~BlockIndex();
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // Adds one summary of dim() floats under id.
  void Add(uint64_t id, const float* summary);
  // Removes id; false when it was not there.
  bool Remove(uint64_t id);

  // Returns up to k ids with the highest inner product with query (dim()
  // floats), best first.
  std::vector<ScoredId> Search(const float* query, uint32_t k) const;

  uint32_t dim() const { return dim_; }
  uint64_t size() const;

 private:
  uint32_t dim_;
  std::unique_ptr<faiss::Index> index_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_BLOCK_INDEX_H_
