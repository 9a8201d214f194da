#include "engine/recall/query_reduction.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/index/dot.h"

namespace kvmem {
namespace {

// The vectors and their squared norms.
struct Points {
  const float* x = nullptr;
  uint32_t n = 0, dim = 0;
  std::vector<float> norm;
  const float* at(uint32_t j) const { return x + size_t{j} * dim; }
};

// |x - c|^2 as |x|^2 - 2 x.c + |c|^2.
float Distance(const float* x, float x_norm, const float* c, float c_norm,
               uint32_t dim) {
  return x_norm - 2.0f * Dot(x, c, dim) + c_norm;
}

// k seeds, farthest-first from the vectors' mean, into centre and its norms.
void Seed(const Points& p, uint32_t k, std::vector<float>* centre,
          std::vector<float>* centre_norm) {
  const uint32_t n = p.n, dim = p.dim;
  std::vector<float> mean(dim, 0.0f);
  for (uint32_t j = 0; j < n; ++j) Axpy(1.0f / n, p.at(j), mean.data(), dim);
  const float mean_norm = Dot(mean.data(), mean.data(), dim);
  std::vector<float> nearest(n);
  for (uint32_t j = 0; j < n; ++j) {
    nearest[j] = Distance(p.at(j), p.norm[j], mean.data(), mean_norm, dim);
  }
  centre->assign(size_t{k} * dim, 0.0f);
  centre_norm->assign(k, 0.0f);
  for (uint32_t c = 0; c < k; ++c) {
    const uint32_t far = static_cast<uint32_t>(
        std::max_element(nearest.begin(), nearest.end()) - nearest.begin());
    std::copy(p.at(far), p.at(far) + dim, centre->begin() + size_t{c} * dim);
    (*centre_norm)[c] = p.norm[far];
    for (uint32_t j = 0; j < n; ++j) {
      nearest[j] = std::min(nearest[j], Distance(p.at(j), p.norm[j], p.at(far),
                                                 p.norm[far], dim));
    }
    nearest[far] = -1.0f;  // A seed once.
  }
}

// Lloyd's rounds: each vector to its nearest centre (ties to the lower),
// each centre to its members' mean (an empty one keeps its place). The
// members per centre into *count.
void Cluster(const Points& p, uint32_t k, std::vector<float>* centre,
             std::vector<float>* centre_norm, std::vector<uint32_t>* cluster,
             std::vector<uint32_t>* count) {
  const uint32_t n = p.n, dim = p.dim;
  cluster->assign(n, 0);
  count->assign(k, 0);
  std::vector<float> sum(size_t{k} * dim);
  for (int round = 0; round <= kReductionRounds; ++round) {
    for (uint32_t j = 0; j < n; ++j) {
      float best = std::numeric_limits<float>::infinity();
      for (uint32_t c = 0; c < k; ++c) {
        const float d =
            Distance(p.at(j), p.norm[j], centre->data() + size_t{c} * dim,
                     (*centre_norm)[c], dim);
        if (d < best) {
          best = d;
          (*cluster)[j] = c;
        }
      }
    }
    std::fill(count->begin(), count->end(), 0);
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (uint32_t j = 0; j < n; ++j) {
      ++(*count)[(*cluster)[j]];
      Axpy(1.0f, p.at(j), sum.data() + size_t{(*cluster)[j]} * dim, dim);
    }
    for (uint32_t c = 0; c < k; ++c) {
      if ((*count)[c] == 0) continue;
      float* dst = centre->data() + size_t{c} * dim;
      for (uint32_t i = 0; i < dim; ++i) {
        dst[i] = sum[size_t{c} * dim + i] / (*count)[c];
      }
      (*centre_norm)[c] = Dot(dst, dst, dim);
    }
  }
}

// Each representative's window term: per head, -ln(mean over its members
// of exp(-w)), with the members' largest -w factored out.
std::vector<float> CombineWindows(const std::vector<float>& window_lse,
                                  const std::vector<uint32_t>& cluster,
                                  const std::vector<uint32_t>& members,
                                  uint32_t heads) {
  const size_t kept = members.size();
  std::vector<double> top(kept * heads,
                          -std::numeric_limits<double>::infinity());
  std::vector<double> acc(kept * heads, 0.0);
  for (size_t j = 0; j < cluster.size(); ++j) {
    for (uint32_t h = 0; h < heads; ++h) {
      double& t = top[size_t{cluster[j]} * heads + h];
      t = std::max(t, -double(window_lse[j * heads + h]));
    }
  }
  for (size_t j = 0; j < cluster.size(); ++j) {
    for (uint32_t h = 0; h < heads; ++h) {
      const size_t r = size_t{cluster[j]} * heads + h;
      acc[r] += std::exp(-double(window_lse[j * heads + h]) - top[r]);
    }
  }
  std::vector<float> out(kept * heads);
  for (size_t c = 0; c < kept; ++c) {
    for (uint32_t h = 0; h < heads; ++h) {
      const size_t r = c * heads + h;
      out[r] = static_cast<float>(-(top[r] + std::log(acc[r] / members[c])));
    }
  }
  return out;
}

}  // namespace

ReducedQuery ReduceQuery(const std::vector<float>& query,
                         const std::vector<float>& window_lse, uint32_t dim,
                         uint32_t heads, uint32_t k) {
  Points p;
  p.x = query.data();
  p.dim = dim;
  p.n = static_cast<uint32_t>(query.size() / dim);
  k = std::min(k, p.n);
  p.norm.resize(p.n);
  for (uint32_t j = 0; j < p.n; ++j) p.norm[j] = Dot(p.at(j), p.at(j), dim);
  std::vector<float> centre, centre_norm;
  std::vector<uint32_t> count;
  ReducedQuery out;
  Seed(p, k, &centre, &centre_norm);
  Cluster(p, k, &centre, &centre_norm, &out.cluster, &count);
  // The non-empty clusters, in order.
  std::vector<uint32_t> index(k, 0), members;
  for (uint32_t c = 0; c < k; ++c) {
    if (count[c] == 0) continue;
    index[c] = static_cast<uint32_t>(members.size());
    members.push_back(count[c]);
    out.query.insert(out.query.end(), centre.begin() + size_t{c} * dim,
                     centre.begin() + size_t{c + 1} * dim);
    out.weight.push_back(static_cast<float>(count[c]) / p.n);
  }
  for (uint32_t& c : out.cluster) c = index[c];
  if (!window_lse.empty()) {
    out.window_lse = CombineWindows(window_lse, out.cluster, members, heads);
  }
  return out;
}

}  // namespace kvmem
