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

// One level of the selection over m candidates (ids[k], or k when ids is
// null) whose keys lie in [lo, hi]: counts them in buckets of the span, finds
// the bucket holding the budget's edge (`*need` left, from the top), appends
// those above it to out (at *taken) and those in it to *next; returns the
// edge bucket's keys in *lo, *hi and what it still must hold in *need.
void Level(const uint32_t* key, const uint32_t* weight, const uint32_t* ids,
           size_t m, uint32_t* lo, uint32_t* hi, uint64_t* need,
           std::vector<uint64_t>* hist, uint32_t* out, size_t* taken,
           std::vector<uint32_t>* next) {
  int shift = 0;
  while (((*hi - *lo) >> shift) >= (1u << kBucketBits)) ++shift;
  const uint32_t buckets = ((*hi - *lo) >> shift) + 1, base = *lo;
  hist->assign(buckets, 0);
  uint64_t* h = hist->data();
  const auto id = [ids](size_t k) {
    return ids == nullptr ? static_cast<uint32_t>(k) : ids[k];
  };
  if (weight == nullptr) {
    for (size_t k = 0; k < m; ++k) ++h[(key[id(k)] - base) >> shift];
  } else {
    for (size_t k = 0; k < m; ++k) {
      const uint32_t i = id(k);
      h[(key[i] - base) >> shift] += weight[i];
    }
  }
  // From the top bucket down to the one where `need` is reached.
  uint64_t above = 0;
  uint32_t edge = buckets - 1;
  while (above + h[edge] < *need) above += h[edge--];
  *need -= above;
  const uint32_t edge_lo = base + (edge << shift);
  const uint32_t edge_hi = static_cast<uint32_t>(
      std::min<uint64_t>(*hi, uint64_t{edge_lo} + (uint64_t{1} << shift) - 1));
  // Branchless: each candidate is written to both lists and kept in the one
  // its key says.
  next->resize(m);
  uint32_t* nx = next->data();
  size_t t = *taken, kept = 0;
  for (size_t k = 0; k < m; ++k) {
    const uint32_t i = id(k), x = key[i];
    out[t] = i;
    t += x > edge_hi;
    nx[kept] = i;
    kept += x >= edge_lo && x <= edge_hi;
  }
  next->resize(kept);
  *taken = t;
  *lo = edge_lo;
  *hi = edge_hi;
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
  uint64_t total = n;
  if (weight != nullptr) {
    total = 0;
    for (size_t i = 0; i < n; ++i) total += weight[i];
  }
  uint32_t lo = UINT32_MAX, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t k = OrderKey(value[i]);
    key[i] = k;
    lo = std::min(lo, k);
    hi = std::max(hi, k);
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
      Level(key.data(), weight, all ? nullptr : sc.edge.data(),
            all ? n : sc.edge.size(), &lo, &hi, &need, &sc.hist, out->data(),
            &taken, &sc.next);
      sc.edge.swap(sc.next);
      all = false;
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
