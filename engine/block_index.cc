#include "engine/block_index.h"

#include <faiss/IndexFlat.h>
#include <faiss/IndexIDMap.h>
#include <faiss/impl/IDSelector.h>
#include <omp.h>

namespace kvmem {

BlockIndex::BlockIndex(uint32_t dim) : dim_(dim) {
  auto* flat = new faiss::IndexFlatIP(static_cast<faiss::Index::idx_t>(dim));
  auto* idmap = new faiss::IndexIDMap2(flat);
  idmap->own_fields = true;
  index_.reset(idmap);
}

BlockIndex::~BlockIndex() = default;

void BlockIndex::Add(uint64_t id, const float* summary) {
  const faiss::Index::idx_t fid = static_cast<faiss::Index::idx_t>(id);
  index_->add_with_ids(1, summary, &fid);
}

bool BlockIndex::Remove(uint64_t id) {
  const faiss::Index::idx_t fid = static_cast<faiss::Index::idx_t>(id);
  faiss::IDSelectorArray sel(1, &fid);
  return index_->remove_ids(sel) == 1;
}

std::vector<ScoredId> BlockIndex::Search(const float* query, uint32_t k) const {
  std::vector<ScoredId> out;
  const auto n = index_->ntotal;
  if (n == 0 || k == 0) return out;
  const faiss::Index::idx_t kk =
      std::min<faiss::Index::idx_t>(static_cast<faiss::Index::idx_t>(k), n);
  omp_set_num_threads(1);
  std::vector<float> scores(kk);
  std::vector<faiss::Index::idx_t> ids(kk);
  index_->search(1, query, kk, scores.data(), ids.data());
  out.reserve(kk);
  for (faiss::Index::idx_t i = 0; i < kk; ++i) {
    if (ids[i] < 0) break;
    out.push_back({static_cast<uint64_t>(ids[i]), scores[i]});
  }
  return out;
}

uint64_t BlockIndex::size() const { return index_->ntotal; }

}  // namespace kvmem
