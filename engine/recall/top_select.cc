#include "engine/recall/top_select.h"

#include <algorithm>

#include "base/thread_scratch.h"

namespace kvmem {
namespace {

// A level counts the candidates' keys in at most this many buckets, over
// the span of keys they have (a level narrows the span 2048-fold: floats of
// a few octaves, as densities are, spread over many buckets at once).
constexpr int kBucketBits = 11;
// A boundary bucket this small is sorted rather than counted again.
constexpr size_t kSortBelow = 48;

struct Scratch {
  std::vector<uint32_t> key;         // [candidate]
  std::vector<uint32_t> edge, next;  // The boundary bucket's candidates.
  std::vector<uint64_t> hist;
  std::vector<uint64_t> packed, other;  // ~key << 32 | candidate: the sort.
};

// *ids in the order: larger key first, equal keys by tie_better. The ids go
// through a stable radix sort on their keys, a byte per pass (no comparator
// call, no branch the CPU cannot predict); only runs of equal keys, rare in
// floats, call tie_better.
void SortByKey(const std::vector<uint32_t>& key,
               absl::FunctionRef<bool(uint32_t, uint32_t)> tie_better,
               std::vector<uint32_t>* ids, std::vector<uint64_t>* packed,
               std::vector<uint64_t>* other) {
  const size_t n = ids->size();
  if (n < 2) return;
  // ~key, so ascending passes give the larger key first.
  packed->resize(n);
  other->resize(n);
  for (size_t k = 0; k < n; ++k) {
    (*packed)[k] = uint64_t{~key[(*ids)[k]]} << 32 | (*ids)[k];
  }
  for (int shift = 32; shift < 64; shift += 8) {
    size_t count[257] = {};
    for (uint64_t v : *packed) ++count[(v >> shift & 255) + 1];
    if (count[((*packed)[0] >> shift & 255) + 1] == n) continue;  // One byte.
    for (size_t b = 1; b < 257; ++b) count[b] += count[b - 1];
    for (uint64_t v : *packed) (*other)[count[v >> shift & 255]++] = v;
    packed->swap(*other);
  }
  for (size_t k = 0; k < n; ++k) {
    (*ids)[k] = static_cast<uint32_t>((*packed)[k]);
  }
  for (size_t a = 0; a < n;) {
    size_t b = a + 1;
    while (b < n && (*packed)[b] >> 32 == (*packed)[a] >> 32) ++b;
    if (b - a > 1) std::sort(ids->begin() + a, ids->begin() + b, tie_better);
    a = b;
  }
}

}  // namespace

void SelectTop(const float* value, const uint32_t* weight, size_t n,
               uint64_t budget,
               absl::FunctionRef<bool(uint32_t, uint32_t)> tie_better,
               bool sorted, std::vector<uint32_t>* out) {
  out->clear();
  if (n == 0 || budget == 0) return;
  Scratch& sc = ThreadScratch<Scratch>();
  std::vector<uint32_t>& key = sc.key;
  key.resize(n);
  uint64_t total = 0;
  uint32_t lo = UINT32_MAX, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    key[i] = OrderKey(value[i]);
    lo = std::min(lo, key[i]);
    hi = std::max(hi, key[i]);
    total += weight == nullptr ? 1 : weight[i];
  }
  const auto before = [&](uint32_t a, uint32_t b) {
    return key[a] != key[b] ? key[a] > key[b] : tie_better(a, b);
  };
  if (total < budget) {  // All of them.
    out->resize(n);
    for (size_t i = 0; i < n; ++i) (*out)[i] = static_cast<uint32_t>(i);
  } else {
    // Invariant: the candidates left (all of them, then sc.edge) hold at
    // least `need`, their keys lie in [lo, hi], and every candidate before
    // them in the order is in *out.
    uint64_t need = budget;
    bool all = true;  // The candidates left are [0, n).
    sc.edge.clear();
    out->resize(n);
    size_t taken = 0;
    while (hi > lo) {
      int shift = 0;
      while (((hi - lo) >> shift) >= (1u << kBucketBits)) ++shift;
      const uint32_t buckets = ((hi - lo) >> shift) + 1;
      std::vector<uint64_t>& hist = sc.hist;
      hist.assign(buckets, 0);
      const size_t m = all ? n : sc.edge.size();
      for (size_t k = 0; k < m; ++k) {
        const uint32_t i = all ? static_cast<uint32_t>(k) : sc.edge[k];
        hist[(key[i] - lo) >> shift] += weight == nullptr ? 1 : weight[i];
      }
      // From the top bucket down to the one where `need` is reached.
      uint64_t above = 0;
      uint32_t edge = buckets - 1;
      while (above + hist[edge] < need) above += hist[edge--];
      need -= above;
      // Branchless: each candidate is written to both lists, and kept in
      // the one its bucket says.
      sc.next.resize(m);
      size_t kept = 0;
      for (size_t k = 0; k < m; ++k) {
        const uint32_t i = all ? static_cast<uint32_t>(k) : sc.edge[k];
        const uint32_t b = (key[i] - lo) >> shift;
        (*out)[taken] = i;
        taken += b > edge;
        sc.next[kept] = i;
        kept += b == edge;
      }
      sc.next.resize(kept);
      sc.edge.swap(sc.next);
      all = false;
      // The edge bucket's keys.
      const uint32_t base = lo + (edge << shift);
      hi = std::min<uint64_t>(hi, uint64_t{base} + (uint64_t{1} << shift) - 1);
      lo = base;
      if (sc.edge.size() <= kSortBelow) break;
    }
    if (all) {  // One key: every candidate ties.
      sc.edge.resize(n);
      for (size_t i = 0; i < n; ++i) sc.edge[i] = static_cast<uint32_t>(i);
    }
    out->resize(taken);
    // The boundary's candidates in order until `need` (> 0) is held.
    std::sort(sc.edge.begin(), sc.edge.end(), before);
    uint64_t held = 0;
    for (uint32_t i : sc.edge) {
      if (held >= need) break;
      out->push_back(i);
      held += weight == nullptr ? 1 : weight[i];
    }
  }
  if (sorted) SortByKey(key, tie_better, out, &sc.packed, &sc.other);
}

}  // namespace kvmem
