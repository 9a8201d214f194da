#include "engine/block_index.h"

#include <faiss/IndexFlat.h>
#include <faiss/IndexIDMap.h>
#include <faiss/IndexIVF.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/IDSelector.h>
#include <faiss/index_factory.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "engine/dot.h"
#include "engine/progressive_search.h"

namespace kvmem {
namespace {

constexpr uint64_t kSampleEvery = 16;
// Vectors before an approximate index is first built (exact search until).
constexpr uint64_t kMinBuild = 64;

bool ByScore(const ScoredId& a, const ScoredId& b) {
  return a.score != b.score ? a.score > b.score : a.id < b.id;
}

std::vector<ScoredId> TopK(std::vector<ScoredId> v, uint32_t k) {
  const size_t keep = std::min<size_t>(k, v.size());
  std::partial_sort(v.begin(), v.begin() + keep, v.end(), ByScore);
  v.resize(keep);
  return v;
}

std::unique_ptr<faiss::Index> MakeFaiss(const std::string& factory,
                                        uint32_t dim) {
  return std::unique_ptr<faiss::Index>(faiss::index_factory(
      static_cast<int>(dim), factory.c_str(), faiss::METRIC_INNER_PRODUCT));
}

}  // namespace

class BlockIndex::Impl {
 public:
  virtual ~Impl() = default;
  virtual void Add(uint64_t id, const float* v) = 0;
  virtual bool Remove(uint64_t id) = 0;
  virtual std::vector<ScoredId> Search(const float* q, uint32_t k) const = 0;
  virtual uint64_t size() const = 0;
  virtual IndexQuality quality() const { return {}; }
  virtual bool ScanSegments(const float* /*q*/, uint32_t /*segment_dim*/,
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
  bool ScanSegments(const float* q, uint32_t segment_dim,
                    SegmentScan* out) const override {
    const auto* idmap = static_cast<const faiss::IndexIDMap2*>(index_.get());
    const auto* flat = static_cast<const faiss::IndexFlatIP*>(idmap->index);
    const size_t n = idmap->ntotal, dim = idmap->d;
    const size_t S = dim / segment_dim;
    const float* xb = flat->get_xb();
    out->segments = static_cast<uint32_t>(S);
    out->ids.assign(idmap->id_map.begin(), idmap->id_map.end());
    out->dots.resize(n * S);
    out->bound.clear();
    for (size_t i = 0; i < n; ++i) {
      for (size_t h = 0; h < S; ++h) {
        out->dots[h * n + i] = Dot(q + h * segment_dim,
                                   xb + i * dim + h * segment_dim, segment_dim);
      }
    }
    return true;
  }

 private:
  std::unique_ptr<faiss::Index> index_;
};

class ProgressiveImpl : public BlockIndex::Impl {
 public:
  ProgressiveImpl(uint32_t dim, uint32_t segment_dim)
      : index_(dim, 0, segment_dim) {}
  bool ScanSegments(const float* q, uint32_t /*segment_dim*/,
                    SegmentScan* out) const override {
    index_.ScanSegments(q, out);
    return true;
  }
  void Add(uint64_t id, const float* v) override { index_.Add(id, v); }
  bool Remove(uint64_t id) override { return index_.Remove(id); }
  std::vector<ScoredId> Search(const float* q, uint32_t k) const override {
    return index_.Search(q, k);
  }
  uint64_t size() const override { return index_.size(); }

 private:
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
    } catch (const faiss::FaissException&) {
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

bool BlockIndex::IsExact(const std::string& factory) {
  return factory.empty() || factory == "Flat" || factory == "Progressive";
}

absl::Status BlockIndex::ValidateFactory(const std::string& factory,
                                         uint32_t dim) {
  if (IsExact(factory)) return absl::OkStatus();
  // Bounded sizes first: FAISS would accept "HNSW100000" or "IVF10000000"
  // and then allocate per vector or train for ever, and its parser throws
  // std::out_of_range (not FaissException) on numbers beyond int.
  if (factory.size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.index_policy.index_factory has ", factory.size(),
                     " characters; at most 256"));
  }
  for (size_t i = 0; i < factory.size();) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(factory[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < factory.size() &&
           absl::ascii_isdigit(static_cast<unsigned char>(factory[j]))) {
      ++j;
    }
    const bool hnsw = i >= 4 && factory.compare(i - 4, 4, "HNSW") == 0;
    const uint64_t limit = hnsw ? 256 : 65536;
    if (j - i > 6 || std::stoull(factory.substr(i, j - i)) > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.index_policy.index_factory \"", absl::CHexEscape(factory),
          "\" has the number ", factory.substr(i, j - i), "; at most ", limit,
          hnsw ? " (HNSW links per node)" : " (lists, codes or dimensions)"));
    }
    i = j;
  }
  try {
    MakeFaiss(factory, dim);
  } catch (const std::exception& e) {  // FaissException, or the parser's.
    return absl::InvalidArgumentError(absl::StrCat(
        "config.index_policy.index_factory \"", absl::CHexEscape(factory),
        "\" is not \"Flat\", \"Progressive\" or a FAISS index_factory "
        "description FAISS accepts for dimension ",
        dim));
  }
  return absl::OkStatus();
}

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
std::vector<ScoredId> BlockIndex::Search(const float* query, uint32_t k) const {
  return impl_->Search(query, k);
}
uint64_t BlockIndex::size() const { return impl_->size(); }
bool BlockIndex::ScanSegments(const float* query, SegmentScan* out) const {
  return impl_->ScanSegments(query, segment_dim_, out);
}
IndexQuality BlockIndex::quality() const { return impl_->quality(); }

}  // namespace kvmem
