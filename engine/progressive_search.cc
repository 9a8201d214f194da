#include "engine/progressive_search.h"

#include <algorithm>
#include <cmath>

#include "engine/dot.h"

namespace kvmem {
namespace {

// Symmetric int8 quantisation; returns the scale (0 for a zero vector).
float Quantize(const float* x, size_t n, int8_t* out, float* l1) {
  float mx = 0;
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, std::fabs(x[i]));
  const float s = mx / 127.0f;
  float sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const int v = s > 0 ? static_cast<int>(std::lround(x[i] / s)) : 0;
    out[i] = static_cast<int8_t>(std::clamp(v, -127, 127));
    sum += std::abs(static_cast<int>(out[i]));
  }
  if (l1 != nullptr) *l1 = sum;
  return s;
}

}  // namespace

ProgressiveIndex::ProgressiveIndex(uint32_t dim, uint32_t max_candidates)
    : dim_(dim), max_candidates_(max_candidates) {}

void ProgressiveIndex::Add(uint64_t id, const float* vec) {
  row_[id] = ids_.size();
  ids_.push_back(id);
  full_.insert(full_.end(), vec, vec + dim_);
  codes_.resize(codes_.size() + dim_);
  float l1 = 0;
  scale_.push_back(
      Quantize(vec, dim_, codes_.data() + codes_.size() - dim_, &l1));
  l1_.push_back(l1);
}

bool ProgressiveIndex::Remove(uint64_t id) {
  auto it = row_.find(id);
  if (it == row_.end()) return false;
  const size_t r = it->second, last = ids_.size() - 1;
  row_.erase(it);
  if (r != last) {  // Move the last row into the hole.
    ids_[r] = ids_[last];
    std::copy_n(full_.begin() + last * dim_, dim_, full_.begin() + r * dim_);
    std::copy_n(codes_.begin() + last * dim_, dim_, codes_.begin() + r * dim_);
    scale_[r] = scale_[last];
    l1_[r] = l1_[last];
    row_[ids_[r]] = r;
  }
  ids_.pop_back();
  full_.resize(last * dim_);
  codes_.resize(last * dim_);
  scale_.pop_back();
  l1_.pop_back();
  return true;
}

std::vector<ScoredId> ProgressiveIndex::Search(const float* query, uint32_t k,
                                               ProgressiveStats* stats) const {
  std::vector<ScoredId> out;
  const size_t n = ids_.size();
  ProgressiveStats st;
  if (n == 0 || k == 0) {
    if (stats != nullptr) *stats = st;
    return out;
  }
  k = static_cast<uint32_t>(std::min<size_t>(k, n));
  std::vector<int8_t> qc(dim_);
  float ql1 = 0;
  const float t = Quantize(query, dim_, qc.data(), &ql1);
  // Stage 1: int8 scores with their error bounds.
  std::vector<float> lower(n), upper(n);
  for (size_t i = 0; i < n; ++i) {
    const float ts = t * scale_[i];
    const float approx = ts * static_cast<float>(DotInt8(
                                  qc.data(), codes_.data() + i * dim_, dim_));
    // A little slack for float rounding of the products above.
    const float bound = ts * (0.5f * ql1 + 0.5f * l1_[i] + 0.25f * dim_) +
                        1e-4f * std::fabs(approx);
    lower[i] = approx - bound;
    upper[i] = approx + bound;
  }
  st.scanned = static_cast<uint32_t>(n);
  std::vector<float> kth(lower);
  std::nth_element(kth.begin(), kth.begin() + (k - 1), kth.end(),
                   std::greater<float>());
  const float theta = kth[k - 1];
  std::vector<uint32_t> cand;
  for (size_t i = 0; i < n; ++i) {
    if (upper[i] >= theta) cand.push_back(static_cast<uint32_t>(i));
  }
  if (max_candidates_ > 0 && cand.size() > max_candidates_) {
    std::nth_element(
        cand.begin(), cand.begin() + max_candidates_, cand.end(),
        [&](uint32_t a, uint32_t b) { return upper[a] > upper[b]; });
    cand.resize(max_candidates_);
    st.exact = false;
  }
  st.candidates = static_cast<uint32_t>(cand.size());
  // Stage 2: exact scores of the survivors.
  out.reserve(cand.size());
  for (uint32_t i : cand) {
    out.push_back({ids_[i], Dot(query, full_.data() + i * dim_, dim_)});
  }
  const size_t keep = std::min<size_t>(k, out.size());
  std::partial_sort(out.begin(), out.begin() + keep, out.end(),
                    [](const ScoredId& a, const ScoredId& b) {
                      return a.score != b.score ? a.score > b.score
                                                : a.id < b.id;
                    });
  out.resize(keep);
  if (stats != nullptr) *stats = st;
  return out;
}

}  // namespace kvmem
