#include "engine/recall/top_select.h"

#include <algorithm>

#include "base/thread_scratch.h"

namespace kvmem {
namespace {

// The levels: bits of the key each counts (top 12, next 12, last 8).
constexpr int kLevels = 3;
constexpr int kShift[kLevels] = {20, 8, 0};
constexpr uint32_t kBuckets[kLevels] = {4096, 4096, 256};
// A boundary bucket this small is sorted rather than counted again.
constexpr size_t kSortBelow = 48;

struct Scratch {
  std::vector<uint32_t> key;         // [candidate]
  std::vector<uint32_t> edge, next;  // The boundary bucket's candidates.
  std::vector<uint64_t> hist;
};

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
  for (size_t i = 0; i < n; ++i) {
    key[i] = OrderKey(value[i]);
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
    // least `need`, and every candidate before them in the order is in *out.
    uint64_t need = budget;
    bool all = true;  // The candidates left are [0, n).
    sc.edge.clear();
    for (int level = 0; level < kLevels; ++level) {
      const int shift = kShift[level];
      const uint32_t mask = kBuckets[level] - 1;
      std::vector<uint64_t>& hist = sc.hist;
      hist.assign(kBuckets[level], 0);
      const size_t m = all ? n : sc.edge.size();
      for (size_t k = 0; k < m; ++k) {
        const uint32_t i = all ? static_cast<uint32_t>(k) : sc.edge[k];
        hist[key[i] >> shift & mask] += weight == nullptr ? 1 : weight[i];
      }
      // From the top bucket down to the one where `need` is reached.
      uint64_t above = 0;
      uint32_t edge = mask;
      while (above + hist[edge] < need) above += hist[edge--];
      need -= above;
      sc.next.clear();
      for (size_t k = 0; k < m; ++k) {
        const uint32_t i = all ? static_cast<uint32_t>(k) : sc.edge[k];
        const uint32_t b = key[i] >> shift & mask;
        if (b > edge) {
          out->push_back(i);
        } else if (b == edge) {
          sc.next.push_back(i);
        }
      }
      sc.edge.swap(sc.next);
      all = false;
      if (sc.edge.size() <= kSortBelow) break;
    }
    // The boundary's candidates in order until `need` (> 0) is held.
    std::sort(sc.edge.begin(), sc.edge.end(), before);
    uint64_t held = 0;
    for (uint32_t i : sc.edge) {
      if (held >= need) break;
      out->push_back(i);
      held += weight == nullptr ? 1 : weight[i];
    }
  }
  if (sorted) std::sort(out->begin(), out->end(), before);
}

}  // namespace kvmem
