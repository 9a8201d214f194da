#include "engine/index/block_index.h"

#include <faiss/IndexFlat.h>
#include <faiss/IndexIDMap.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexPQ.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/IDSelector.h>
#include <faiss/index_factory.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "engine/index/dot.h"
#include "engine/index/progressive_search.h"

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
  std::unique_ptr<faiss::Index> index(faiss::index_factory(
      static_cast<int>(dim), factory.c_str(), faiss::METRIC_INNER_PRODUCT));
  // index_factory turns on polysemous training for PQ: an annealing of
  // the code order for Hamming filtering that kvmem never uses, and 1.8 s
  // of a 64-vector build at 12 dimensions (PQ3x4).
  if (auto* pq = dynamic_cast<faiss::IndexPQ*>(index.get())) {
    pq->do_polysemous_training = false;
  }
  if (auto* ivfpq = dynamic_cast<faiss::IndexIVFPQ*>(index.get())) {
    ivfpq->do_polysemous_training = false;
  }
  return index;
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

bool BlockIndex::IsExact(const std::string& factory) {
  return factory.empty() || factory == "Flat" || factory == "Progressive";
}

namespace {

// Parses an unsigned decimal of 1..6 digits at *pos; advances *pos.
bool ParseSmall(const std::string& s, size_t* pos, uint32_t* out) {
  size_t j = *pos;
  while (j < s.size() && j - *pos < 7 &&
         absl::ascii_isdigit(static_cast<unsigned char>(s[j]))) {
    ++j;
  }
  if (j == *pos || j - *pos > 6) return false;
  *out = static_cast<uint32_t>(std::stoul(s.substr(*pos, j - *pos)));
  *pos = j;
  return true;
}

bool Eat(const std::string& s, size_t* pos, absl::string_view word) {
  if (s.compare(*pos, word.size(), word.data(), word.size()) != 0) {
    return false;
  }
  *pos += word.size();
  return true;
}

// The approximate kinds kvmem builds (see block_index.h): a FAISS
// description is accepted only when it parses as one of them, so a
// description FAISS would accept and then crash on (NSG's SIGFPE at its
// first build, fast-scan PQ's constraints, OPQ and PCA pre-transforms,
// LSH's bit widths) never reaches a committed config.
struct FaissSpec {
  uint32_t hnsw_m = 0;   // HNSW<M>.
  uint32_t nlist = 0;    // IVF<n>.
  uint32_t pq_m = 0;     // PQ<m>.
  uint32_t pq_bits = 8;  // PQ<m>x<bits>.
  bool sq = false;       // SQ4, SQ6, SQ8, SQfp16.
};

constexpr char kAllowed[] =
    "Flat, Progressive, HNSW<M> (4..64, optionally \",Flat\"), SQ4, SQ6, "
    "SQ8, SQfp16, PQ<m>[x<bits>] (bits 1..8), or IVF<n>,<Flat|SQ4|SQ6|SQ8|"
    "SQfp16|PQ<m>[x<bits>]> (n 1..1024)";

// Parses "PQ<m>[x<bits>]" or an SQ kind at *pos into spec.
bool ParseCodec(const std::string& s, size_t* pos, FaissSpec* spec) {
  if (Eat(s, pos, "SQfp16") || Eat(s, pos, "SQ4") || Eat(s, pos, "SQ6") ||
      Eat(s, pos, "SQ8")) {
    spec->sq = true;
    return true;
  }
  if (!Eat(s, pos, "PQ") || !ParseSmall(s, pos, &spec->pq_m)) return false;
  if (Eat(s, pos, "x") && !ParseSmall(s, pos, &spec->pq_bits)) return false;
  return spec->pq_m >= 1 && spec->pq_bits >= 1 && spec->pq_bits <= 8;
}

bool ParseSpec(const std::string& s, FaissSpec* spec) {
  size_t pos = 0;
  if (Eat(s, &pos, "HNSW")) {
    if (!ParseSmall(s, &pos, &spec->hnsw_m)) return false;
    Eat(s, &pos, ",Flat");
    return pos == s.size() && spec->hnsw_m >= 4 && spec->hnsw_m <= 64;
  }
  if (Eat(s, &pos, "IVF")) {
    if (!ParseSmall(s, &pos, &spec->nlist) || !Eat(s, &pos, ",")) return false;
    if (spec->nlist < 1 || spec->nlist > 1024) return false;
    if (Eat(s, &pos, "Flat")) return pos == s.size();
  }
  return ParseCodec(s, &pos, spec) && pos == s.size();
}

// Float parameters a FaissSpec index holds whatever its size (coarse
// centroids, PQ codebooks) at dimension dim.
uint64_t FixedFloats(const FaissSpec& spec, uint32_t dim) {
  uint64_t n = static_cast<uint64_t>(spec.nlist) * dim;
  if (spec.pq_m > 0) n += (uint64_t{1} << spec.pq_bits) * dim;
  if (spec.sq) n += 2ull * dim;
  return n;
}

// Builds the index as a stream's first build would (64 vectors, trained
// when FAISS can train on that many), inside a catch-all: what FAISS
// throws is an answer, not a crash. A (factory, dim) that built once is
// not built again (every reopen validates its config): remembered, up to
// 4096 of them.
absl::Status Probe(const std::string& factory, uint32_t dim) {
  static kvmem::Mutex mu;
  static auto* built = new std::set<std::string>();
  const std::string key = absl::StrCat(factory, "@", dim);
  {
    kvmem::MutexLock lock(&mu);
    if (built->count(key)) return absl::OkStatus();
  }
  try {
    std::unique_ptr<faiss::Index> index = MakeFaiss(factory, dim);
    std::vector<float> v(static_cast<size_t>(kMinBuild) * dim);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (float& f : v) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      f = static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) / 1000.0f;
    }
    omp_set_num_threads(1);
    const auto n = static_cast<faiss::Index::idx_t>(kMinBuild);
    if (!index->is_trained) {
      try {
        index->train(n, v.data());
      } catch (const faiss::FaissException&) {
        return absl::OkStatus();  // Too few to train on: the stream waits.
      }
    }
    index->add(n, v.data());
    float score;
    faiss::Index::idx_t label;
    index->search(1, v.data(), 1, &score, &label);
    kvmem::MutexLock lock(&mu);
    if (built->size() < 4096) built->insert(key);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.index_policy.index_factory \"", absl::CHexEscape(factory),
        "\" fails to build at dimension ", dim, ": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BlockIndex::ValidateFactory(const std::string& factory,
                                         const std::vector<uint32_t>& dims) {
  if (IsExact(factory)) return absl::OkStatus();
  FaissSpec spec;
  if (factory.size() > 64 || !ParseSpec(factory, &spec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.index_policy.index_factory \"",
        absl::CHexEscape(factory.substr(0, 64)),
        factory.size() > 64 ? "...\"" : "\"", " is not one of: ", kAllowed));
  }
  uint64_t fixed = 0;
  for (uint32_t dim : dims) {
    if (spec.pq_m > 0 && (spec.pq_m > dim || dim % spec.pq_m != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.index_policy.index_factory \"", factory, "\" splits ", dim,
          "-dimensional vectors into ", spec.pq_m,
          " sub-quantizers; the count must divide every index dimension (",
          absl::StrJoin(dims, ", "),
          ": the summary, and per indexed layer kv_heads x head_dim)"));
    }
    fixed += FixedFloats(spec, dim) * sizeof(float);
  }
  if (fixed > kMaxFixedIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.index_policy.index_factory \"", factory, "\" holds ", fixed,
        " bytes of centroids and codebooks over this stream's indexes "
        "(dimensions ",
        absl::StrJoin(dims, ", "), "); at most ", kMaxFixedIndexBytes));
  }
  std::vector<uint32_t> distinct = dims;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (uint32_t dim : distinct) {
    KVMEM_RETURN_IF_ERROR(Probe(factory, dim));
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
void BlockIndex::Reserve(size_t n) { impl_->Reserve(n); }
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
