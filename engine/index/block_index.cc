#include "engine/index/block_index.h"

#include <faiss/IndexFlat.h>
#include <faiss/IndexIDMap.h>
#include <faiss/IndexIVF.h>
#include <faiss/impl/IDSelector.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <unordered_set>

#include "engine/index/dot.h"
#include "engine/index/faiss_make.h"
#include "engine/index/progressive_search.h"

namespace kvmem {
namespace {

constexpr uint64_t kSampleEvery = 16;

bool ByScore(const ScoredId& a, const ScoredId& b) {
  return a.score != b.score ? a.score > b.score : a.id < b.id;
}

std::vector<ScoredId> TopK(std::vector<ScoredId> v, uint32_t k) {
  const size_t keep = std::min<size_t>(k, v.size());
  std::partial_sort(v.begin(), v.begin() + keep, v.end(), ByScore);
  v.resize(keep);
  return v;
}

}  // namespace

class BlockIndex::Impl {
 public:
  virtual ~Impl() = default;
  virtual void Add(uint64_t id, const float* v) = 0;
  virtual bool Remove(uint64_t id) = 0;
  virtual void Reserve(size_t /*n*/) {}
  virtual std::vector<ScoredId> Search(const float* q, uint32_t k) const = 0;
  virtual uint64_t size() const = 0;
  virtual IndexQuality quality() const { return {}; }
  virtual std::unique_ptr<BlockIndex::Growth> Grow(size_t /*extra*/) const {
    return nullptr;
  }
  virtual bool Adopt(BlockIndex::Growth* /*g*/) { return false; }
  virtual uint64_t copied_in_place() const { return 0; }
  virtual uint64_t memory_bytes() const = 0;
  // BlockIndex::ScanSegments of `vectors` queries; false: cannot scan.
  virtual bool ScanSegments(const float* /*q*/, size_t /*vectors*/,
                            uint32_t /*segment_dim*/, ScanMode /*mode*/,
                            SegmentScan* /*out*/) const {
    return false;
  }
};

namespace {

class FlatImpl : public BlockIndex::Impl {
 public:
  explicit FlatImpl(uint32_t dim) {
    auto* flat = new faiss::IndexFlatIP(static_cast<faiss::Index::idx_t>(dim));
    auto* idmap = new faiss::IndexIDMap2(flat);
    idmap->own_fields = true;
    index_.reset(idmap);
  }
  void Add(uint64_t id, const float* v) override {
    const faiss::Index::idx_t fid = static_cast<faiss::Index::idx_t>(id);
    index_->add_with_ids(1, v, &fid);
  }
  bool Remove(uint64_t id) override {
    const faiss::Index::idx_t fid = static_cast<faiss::Index::idx_t>(id);
    faiss::IDSelectorArray sel(1, &fid);
    return index_->remove_ids(sel) == 1;
  }
  std::vector<ScoredId> Search(const float* q, uint32_t k) const override {
    std::vector<ScoredId> out;
    const auto n = index_->ntotal;
    if (n == 0 || k == 0) return out;
    const faiss::Index::idx_t kk =
        std::min<faiss::Index::idx_t>(static_cast<faiss::Index::idx_t>(k), n);
    omp_set_num_threads(1);
    std::vector<float> scores(kk);
    std::vector<faiss::Index::idx_t> ids(kk);
    index_->search(1, q, kk, scores.data(), ids.data());
    for (faiss::Index::idx_t i = 0; i < kk && ids[i] >= 0; ++i) {
      out.push_back({static_cast<uint64_t>(ids[i]), scores[i]});
    }
    return out;
  }
  uint64_t size() const override { return index_->ntotal; }
  uint64_t memory_bytes() const override {
    const auto n = static_cast<uint64_t>(index_->ntotal);
    // Vectors, the id map, and IDMap2's reverse map (a node a vector).
    return n * index_->d * sizeof(float) + n * sizeof(int64_t) + n * 32;
  }
  bool ScanSegments(const float* queries, size_t vectors, uint32_t segment_dim,
                    ScanMode /*mode*/, SegmentScan* outs) const override {
    for (size_t j = 0; j < vectors; ++j) {
      ScanOne(queries + j * index_->d, segment_dim, &outs[j]);
    }
    return true;
  }

 private:
  void ScanOne(const float* q, uint32_t segment_dim, SegmentScan* out) const {
    const auto* idmap = static_cast<const faiss::IndexIDMap2*>(index_.get());
    const auto* flat = static_cast<const faiss::IndexFlatIP*>(idmap->index);
    const size_t n = idmap->ntotal, dim = idmap->d;
    const size_t S = dim / segment_dim;
    const float* xb = flat->get_xb();
    out->segments = static_cast<uint32_t>(S);
    out->ids.assign(idmap->id_map.begin(), idmap->id_map.end());
    out->dots.resize(n * S);
    out->exact = true;
    out->bound.clear();
    for (size_t i = 0; i < n; ++i) {
      for (size_t h = 0; h < S; ++h) {
        out->dots[h * n + i] = Dot(q + h * segment_dim,
                                   xb + i * dim + h * segment_dim, segment_dim);
      }
    }
  }

  std::unique_ptr<faiss::Index> index_;
};

class ProgressiveImpl : public BlockIndex::Impl {
 public:
  ProgressiveImpl(uint32_t dim, uint32_t segment_dim)
      : index_(dim, 0, segment_dim) {}
  bool ScanSegments(const float* q, size_t vectors, uint32_t /*segment_dim*/,
                    ScanMode mode, SegmentScan* out) const override {
    index_.ScanSegments(q, vectors, out, mode);
    return true;
  }
  void Add(uint64_t id, const float* v) override { index_.Add(id, v); }
  bool Remove(uint64_t id) override { return index_.Remove(id); }
  void Reserve(size_t n) override { index_.Reserve(n); }
  std::vector<ScoredId> Search(const float* q, uint32_t k) const override {
    return index_.Search(q, k);
  }
  uint64_t size() const override { return index_.size(); }
  std::unique_ptr<BlockIndex::Growth> Grow(size_t extra) const override {
    std::unique_ptr<ProgressiveIndex::Growth> g = index_.Grow(extra);
    if (g == nullptr) return nullptr;
    auto out = std::make_unique<Grown>();
    out->owner = this;
    out->arrays = std::move(g);
    return out;
  }
  bool Adopt(BlockIndex::Growth* g) override {
    auto* grown = dynamic_cast<Grown*>(g);
    return grown != nullptr && grown->owner == this &&
           index_.Adopt(grown->arrays.get());
  }
  uint64_t copied_in_place() const override { return index_.copied_in_place(); }
  uint64_t memory_bytes() const override { return index_.memory_bytes(); }

 private:
  struct Grown : BlockIndex::Growth {
    const ProgressiveImpl* owner = nullptr;
    std::unique_ptr<ProgressiveIndex::Growth> arrays;
  };
  ProgressiveIndex index_;
};

// Any FAISS description, over a copy of the vectors (see the header).
class FaissImpl : public BlockIndex::Impl {
 public:
  FaissImpl(uint32_t dim, std::string factory)
      : dim_(dim),
        factory_(std::move(factory)),
        needs_training_(!MakeFaiss(factory_, dim_)->is_trained) {}

  void Add(uint64_t id, const float* v) override {
    row_[id] = ids_.size();
    ids_.push_back(id);
    vecs_.insert(vecs_.end(), v, v + dim_);
    if (built_ != nullptr) {  // FAISS adds incrementally; label = position.
      omp_set_num_threads(1);
      built_->add(1, v);
      built_ids_.push_back(id);
    }
    MaybeRebuild();
  }
  bool Remove(uint64_t id) override {
    auto it = row_.find(id);
    if (it == row_.end()) return false;
    const size_t r = it->second, last = ids_.size() - 1;
    row_.erase(it);
    if (r != last) {
      ids_[r] = ids_[last];
      std::copy_n(vecs_.begin() + last * dim_, dim_, vecs_.begin() + r * dim_);
      row_[ids_[r]] = r;
    }
    ids_.pop_back();
    vecs_.resize(last * dim_);
    if (built_ != nullptr) dead_.insert(id);
    MaybeRebuild();
    return true;
  }

  std::vector<ScoredId> Search(const float* q, uint32_t k) const override {
    if (ids_.empty() || k == 0) return {};
    if (built_ == nullptr) return Exact(q, k);
    omp_set_num_threads(1);
    const faiss::Index::idx_t kk = std::min<faiss::Index::idx_t>(
        static_cast<faiss::Index::idx_t>(k + dead_.size()), built_->ntotal);
    std::vector<float> scores(kk);
    std::vector<faiss::Index::idx_t> labels(kk);
    built_->search(1, q, kk, scores.data(), labels.data());
    std::vector<ScoredId> out;
    for (faiss::Index::idx_t i = 0; i < kk; ++i) {
      if (labels[i] < 0) continue;
      const uint64_t id = built_ids_[labels[i]];
      if (!dead_.count(id)) out.push_back({id, scores[i]});
    }
    out = TopK(std::move(out), k);
    if (searches_.fetch_add(1, std::memory_order_relaxed) % kSampleEvery == 0) {
      const std::vector<ScoredId> exact = Exact(q, k);
      std::unordered_set<uint64_t> got;
      for (const ScoredId& h : out) got.insert(h.id);
      uint64_t hits = 0;
      for (const ScoredId& h : exact) hits += got.count(h.id);
      samples_.fetch_add(1, std::memory_order_relaxed);
      hits_.fetch_add(hits, std::memory_order_relaxed);
      wanted_.fetch_add(exact.size(), std::memory_order_relaxed);
    }
    return out;
  }
  uint64_t size() const override { return ids_.size(); }
  uint64_t memory_bytes() const override {
    return vecs_.capacity() * sizeof(float) +
           (ids_.capacity() + built_ids_.capacity()) * sizeof(uint64_t) +
           row_.size() * 32;
  }
  IndexQuality quality() const override {
    IndexQuality q;
    q.samples = samples_.load();
    q.hits = hits_.load();
    q.wanted = wanted_.load();
    return q;
  }

 private:
  std::vector<ScoredId> Exact(const float* q, uint32_t k) const {
    std::vector<ScoredId> all;
    all.reserve(ids_.size());
    for (size_t r = 0; r < ids_.size(); ++r) {
      all.push_back({ids_[r], Dot(q, vecs_.data() + r * dim_, dim_)});
    }
    return TopK(std::move(all), k);
  }

  // (Re)builds from the vector copy: first once there are enough vectors to
  // train on; then to drop tombstones once they are an eighth of the index;
  // and, for kinds that train (IVF, SQ), to retrain when the vectors doubled.
  void MaybeRebuild() {
    const uint64_t n = ids_.size();
    const bool first = built_ == nullptr && n >= std::max(kMinBuild, retry_at_);
    const bool compact =
        built_ != nullptr &&
        dead_.size() >= std::max<uint64_t>(kMinBuild, built_->ntotal / 8);
    const bool retrain = built_ != nullptr && needs_training_ &&
                         n >= 2 * std::max<uint64_t>(trained_on_, kMinBuild);
    if (!first && !compact && !retrain) return;
    std::unique_ptr<faiss::Index> index = MakeFaiss(factory_, dim_);
    const auto count = static_cast<faiss::Index::idx_t>(n);
    omp_set_num_threads(1);
    try {
      if (!index->is_trained) index->train(count, vecs_.data());
      index->add(count, vecs_.data());
    } catch (const std::exception&) {  // FaissException, bad_alloc.
      retry_at_ = 2 * n;  // Too few to train on yet: stay exact, retry later.
      return;
    }
    // FAISS's IVF default probes one list of nlist; a memory that must not
    // forget probes a quarter of them (the sampled recall shows the effect).
    if (auto* ivf = dynamic_cast<faiss::IndexIVF*>(index.get())) {
      ivf->nprobe = std::max<size_t>(1, ivf->nlist / 4);
    }
    built_ = std::move(index);
    built_ids_ = ids_;
    dead_.clear();
    trained_on_ = n;
  }

  const uint32_t dim_;
  const std::string factory_;
  std::vector<uint64_t> ids_;
  std::vector<float> vecs_;
  std::unordered_map<uint64_t, size_t> row_;
  const bool needs_training_;
  std::unique_ptr<faiss::Index> built_;
  std::vector<uint64_t> built_ids_;    // FAISS label -> id.
  std::unordered_set<uint64_t> dead_;  // In built_, removed since.
  uint64_t trained_on_ = 0;            // Vectors at the last build.
  uint64_t retry_at_ = 0;              // After a failed first training.
  mutable std::atomic<uint64_t> searches_{0}, samples_{0}, hits_{0}, wanted_{0};
};

}  // namespace

BlockIndex::BlockIndex(uint32_t dim, const std::string& factory,
                       uint32_t segment_dim)
    : dim_(dim),
      segment_dim_(segment_dim == 0 ? dim : segment_dim),
      factory_(factory.empty() ? "Flat" : factory) {
  if (factory_ == "Flat") {
    impl_ = std::make_unique<FlatImpl>(dim);
  } else if (factory_ == "Progressive") {
    impl_ = std::make_unique<ProgressiveImpl>(dim, segment_dim_);
  } else {
    impl_ = std::make_unique<FaissImpl>(dim, factory_);
  }
}

BlockIndex::~BlockIndex() = default;

void BlockIndex::Add(uint64_t id, const float* summary) {
  impl_->Add(id, summary);
}
bool BlockIndex::Remove(uint64_t id) { return impl_->Remove(id); }
void BlockIndex::Reserve(size_t n) { impl_->Reserve(n); }
std::unique_ptr<BlockIndex::Growth> BlockIndex::Grow(size_t extra) const {
  return impl_->Grow(extra);
}
bool BlockIndex::Adopt(Growth* g) { return g != nullptr && impl_->Adopt(g); }
uint64_t BlockIndex::copied_in_place() const {
  return impl_->copied_in_place();
}
uint64_t BlockIndex::memory_bytes() const { return impl_->memory_bytes(); }
std::vector<ScoredId> BlockIndex::Search(const float* query, uint32_t k) const {
  return impl_->Search(query, k);
}
uint64_t BlockIndex::size() const { return impl_->size(); }
bool BlockIndex::ScanSegments(const float* query, SegmentScan* out,
                              ScanMode mode) const {
  return impl_->ScanSegments(query, 1, segment_dim_, mode, out);
}
bool BlockIndex::ScanSegments(const float* queries, size_t vectors,
                              SegmentScan* out, ScanMode mode) const {
  return impl_->ScanSegments(queries, vectors, segment_dim_, mode, out);
}
IndexQuality BlockIndex::quality() const { return impl_->quality(); }

}  // namespace kvmem
