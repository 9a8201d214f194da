// BlockIndex's factory strings: which kinds are exact, and the validation
// of FAISS descriptions (parsed, sized, and built once at each dimension
// before a stream may use them); MakeFaiss, which both this check and the
// FAISS kinds of block_index.cc build with.
#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexPQ.h>
#include <faiss/impl/FaissException.h>
#include <faiss/index_factory.h>
#include <omp.h>

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "engine/index/block_index.h"
#include "engine/index/faiss_make.h"

namespace kvmem {

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

}  // namespace kvmem
