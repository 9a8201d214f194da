#include "tools/eval/eval_policies.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "engine/index/dot.h"

namespace kvmem {

std::vector<Span> SpansOf(const std::vector<uint64_t>& sorted_positions) {
  std::vector<Span> out;
  for (uint64_t p : sorted_positions) {
    if (!out.empty() && out.back().end == p) {
      ++out.back().end;
    } else {
      out.push_back({p, p + 1});
    }
  }
  return out;
}

std::vector<Span> ClipMerge(std::vector<Span> spans, uint64_t lo, uint64_t hi) {
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  std::vector<Span> out;
  for (Span s : spans) {
    s.begin = std::max(s.begin, lo);
    s.end = std::min(s.end, hi);
    if (s.begin >= s.end) continue;
    if (!out.empty() && s.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, s.end);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

namespace {

uint64_t Total(const std::vector<Span>& spans) {
  uint64_t n = 0;
  for (const Span& s : spans) n += s.size();
  return n;
}

// Sinks + window, bounded by what exists.
uint64_t BaseResident(const PolicyBudget& b, const CameraTokens& cam) {
  return std::min<uint64_t>(cam.sink_tokens, cam.tokens) +
         std::min<uint64_t>(
             b.window,
             cam.tokens - std::min<uint64_t>(cam.sink_tokens, cam.tokens));
}

class FullPolicy : public EvalPolicy {
 public:
  explicit FullPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "full"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens&) override {
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery&, const CameraTokens& cam,
                      const QueryOracle&, Selection* out) override {
    out->everything = true;
    out->recalled = ClipMerge({{0, cam.tokens}}, cam.sink_tokens,
                              b_.WindowStart(cam.tokens));
    return absl::OkStatus();
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return cam.tokens;
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return cam.tokens * b_.bytes_per_token;
  }

 private:
  PolicyBudget b_;
};

class StreamingLlmPolicy : public EvalPolicy {
 public:
  explicit StreamingLlmPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "streaming_llm"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens&) override {
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery&, const CameraTokens& cam,
                      const QueryOracle&, Selection* out) override {
    const uint64_t ws = b_.WindowStart(cam.tokens);
    out->recalled = ClipMerge({{ws > b_.recall ? ws - b_.recall : 0, ws}},
                              cam.sink_tokens, ws);
    return absl::OkStatus();
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    PolicyBudget wide = b_;
    wide.window += b_.recall;
    return BaseResident(wide, cam);
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return ResidentTokens(cam) * b_.bytes_per_token;
  }

 private:
  PolicyBudget b_;
};

// Grid block b covers [b * block_tokens, (b + 1) * block_tokens), minus sinks.
Span GridBlock(const PolicyBudget& b, uint64_t block, uint32_t sinks) {
  Span s{block * b.block_tokens, (block + 1) * b.block_tokens};
  s.begin = std::max<uint64_t>(s.begin, sinks);
  return s;
}

class WindowLruPolicy : public EvalPolicy {
 public:
  explicit WindowLruPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "window_lru"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens& cam) override {
    const uint64_t ws = b_.WindowStart(cam.tokens);
    // Blocks that have left the window enter the cache as most recent.
    while ((next_ + 1) * b_.block_tokens <= ws) {
      const Span s = GridBlock(b_, next_, cam.sink_tokens);
      if (s.size() <= b_.recall && s.size() > 0) {
        lru_.push_front(next_);
        where_[next_] = lru_.begin();
        cached_ += s.size();
      }
      ++next_;
      while (cached_ > b_.recall) {
        const uint64_t victim = lru_.back();
        lru_.pop_back();
        where_.erase(victim);
        cached_ -= GridBlock(b_, victim, cam.sink_tokens).size();
      }
    }
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery&, const CameraTokens& cam,
                      const QueryOracle&, Selection* out) override {
    for (uint64_t blk : lru_) {
      out->units.push_back(GridBlock(b_, blk, cam.sink_tokens));
    }
    out->recalled =
        ClipMerge(out->units, cam.sink_tokens, b_.WindowStart(cam.tokens));
    return absl::OkStatus();
  }
  void Observe(const Selection& sel, const std::vector<double>& pbar,
               double mass, const CameraTokens&) override {
    if (mass <= 0) return;
    for (const Span& u : sel.units) {
      double m = 0;
      for (uint64_t p = u.begin; p < u.end; ++p) m += pbar[p];
      if (m / mass < 0.01) continue;
      const uint64_t blk = u.begin / b_.block_tokens;
      auto it = where_.find(blk);
      if (it == where_.end()) continue;
      lru_.splice(lru_.begin(), lru_, it->second);
    }
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return BaseResident(b_, cam) + cached_;
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return ResidentTokens(cam) * b_.bytes_per_token;
  }

 private:
  PolicyBudget b_;
  uint64_t next_ = 0;  // Next grid block to leave the window.
  std::list<uint64_t> lru_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
  uint64_t cached_ = 0;
};

class H2oPolicy : public EvalPolicy {
 public:
  explicit H2oPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "h2o"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens& cam) override {
    acc_.resize(cam.tokens, 0.0);
    const uint64_t ws = b_.WindowStart(cam.tokens);
    for (uint64_t p = std::max<uint64_t>(left_, cam.sink_tokens); p < ws; ++p) {
      pool_.push_back(p);
    }
    left_ = std::max(left_, ws);
    if (pool_.size() > b_.recall) {
      // Keep the R heaviest; ties go to the newer token.
      std::nth_element(pool_.begin(), pool_.begin() + b_.recall, pool_.end(),
                       [&](uint64_t x, uint64_t y) {
                         return acc_[x] != acc_[y] ? acc_[x] > acc_[y] : x > y;
                       });
      pool_.resize(b_.recall);
    }
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery&, const CameraTokens& cam,
                      const QueryOracle&, Selection* out) override {
    std::vector<uint64_t> sorted = pool_;
    std::sort(sorted.begin(), sorted.end());
    out->recalled = SpansOf(sorted);
    // Units: the grid blocks the kept tokens fall in.
    for (const Span& s : out->recalled) {
      for (uint64_t p = s.begin; p < s.end;) {
        const uint64_t end = std::min<uint64_t>(
            s.end, (p / b_.block_tokens + 1) * b_.block_tokens);
        if (!out->units.empty() &&
            out->units.back().begin / b_.block_tokens == p / b_.block_tokens) {
          out->units.back().end = end;  // Same block: extend the unit.
        } else {
          out->units.push_back({p, end});
        }
        p = end;
      }
    }
    (void)cam;
    return absl::OkStatus();
  }
  void Observe(const Selection& sel, const std::vector<double>& pbar,
               double mass, const CameraTokens& cam) override {
    if (mass <= 0) return;
    const double k = 1.0 / mass;
    for (uint64_t p = 0; p < cam.sink_tokens && p < cam.tokens; ++p)
      acc_[p] += pbar[p] * k;
    for (uint64_t p = b_.WindowStart(cam.tokens); p < cam.tokens; ++p)
      acc_[p] += pbar[p] * k;
    for (uint64_t p : pool_) acc_[p] += pbar[p] * k;
    (void)sel;
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return BaseResident(b_, cam) + pool_.size();
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return ResidentTokens(cam) * b_.bytes_per_token;
  }

 private:
  PolicyBudget b_;
  std::vector<double> acc_;     // Accumulated attention per position.
  std::vector<uint64_t> pool_;  // Kept tokens outside the window.
  uint64_t left_ = 0;           // Positions below this left the window.
};

class MeanKeyTopkPolicy : public EvalPolicy {
 public:
  explicit MeanKeyTopkPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "mean_key_topk"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens& cam) override {
    // Seal every complete grid block: its summary is the mean key.
    while ((sealed_ + 1) * b_.block_tokens <= cam.tokens) {
      const Span s = GridBlock(b_, sealed_, cam.sink_tokens);
      std::vector<double> sum(cam.per_token, 0.0);
      for (uint64_t p = s.begin; p < s.end; ++p) {
        const float* k = cam.keys.data() + p * cam.per_token;
        for (uint32_t i = 0; i < cam.per_token; ++i) sum[i] += k[i];
      }
      for (double& x : sum) x /= std::max<uint64_t>(1, s.size());
      means_.insert(means_.end(), sum.begin(), sum.end());
      ++sealed_;
    }
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery& q, const CameraTokens& cam,
                      const QueryOracle&, Selection* out) override {
    const uint64_t ws = b_.WindowStart(cam.tokens);
    std::vector<std::pair<double, uint64_t>> scored;
    for (uint64_t blk = 0; blk < sealed_ && (blk + 1) * b_.block_tokens <= ws;
         ++blk) {
      const float* m = means_.data() + blk * cam.per_token;
      double dot = 0;
      for (uint32_t i = 0; i < cam.per_token; ++i) dot += m[i] * q.q[i];
      scored.emplace_back(dot, blk);
    }
    std::sort(scored.begin(), scored.end(),
              [](const auto& x, const auto& y) { return x.first > y.first; });
    uint64_t left = b_.recall;
    for (size_t i = 0; i < scored.size() && i < b_.top_k; ++i) {
      const Span s = GridBlock(b_, scored[i].second, cam.sink_tokens);
      if (s.size() == 0 || s.size() > left) continue;
      left -= s.size();
      out->units.push_back(s);
    }
    out->recalled = ClipMerge(out->units, cam.sink_tokens, ws);
    recalled_now_ = Total(out->recalled);
    return absl::OkStatus();
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return BaseResident(b_, cam) + recalled_now_;
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return cam.tokens * b_.bytes_per_token + means_.size() * sizeof(float);
  }

 private:
  PolicyBudget b_;
  uint64_t sealed_ = 0;
  std::vector<float> means_;  // [block][per_token]
  uint64_t recalled_now_ = 0;
};

// The r positions of [lo, hi) with the largest score, as sorted spans.
std::vector<Span> TopTokens(const std::vector<double>& score, uint64_t lo,
                            uint64_t hi, uint32_t r) {
  std::vector<uint64_t> pos;
  for (uint64_t p = lo; p < hi; ++p) pos.push_back(p);
  if (pos.size() > r) {
    std::nth_element(
        pos.begin(), pos.begin() + r, pos.end(), [&](uint64_t a, uint64_t b) {
          return score[a] != score[b] ? score[a] > score[b] : a > b;
        });
    pos.resize(r);
  }
  std::sort(pos.begin(), pos.end());
  return SpansOf(pos);
}

// Holds every token (it must, to choose among them) and attends to the R
// cold ones a score ranks first.
class TopTokensPolicy : public EvalPolicy {
 public:
  explicit TopTokensPolicy(const PolicyBudget& b) : b_(b) {}
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens&) override {
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery& q, const CameraTokens& cam,
                      const QueryOracle& oracle, Selection* out) override {
    const std::vector<double>& score = Score(q, cam, oracle);
    out->recalled = TopTokens(
        score, cam.sink_tokens,
        std::max<uint64_t>(cam.sink_tokens, b_.WindowStart(cam.tokens)),
        b_.recall);
    recalled_now_ = Total(out->recalled);
    return absl::OkStatus();
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return BaseResident(b_, cam) + recalled_now_;
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return cam.tokens * b_.bytes_per_token;
  }

 protected:
  // The score of every position so far.
  virtual const std::vector<double>& Score(const WorkloadQuery& q,
                                           const CameraTokens& cam,
                                           const QueryOracle& oracle) = 0;
  PolicyBudget b_;
  uint64_t recalled_now_ = 0;
};

class OracleTokensPolicy : public TopTokensPolicy {
 public:
  using TopTokensPolicy::TopTokensPolicy;
  const char* name() const override { return "oracle_tokens"; }

 protected:
  const std::vector<double>& Score(const WorkloadQuery&, const CameraTokens&,
                                   const QueryOracle& oracle) override {
    return *oracle.attention;
  }
};

class ExactKeysPerHeadPolicy : public TopTokensPolicy {
 public:
  ExactKeysPerHeadPolicy(const PolicyBudget& b, uint32_t head_dim)
      : TopTokensPolicy(b), d_(head_dim) {}
  const char* name() const override { return "exact_keys_per_head"; }

 protected:
  // Mean over KV heads of the softmax of the query kvmem receives (q)
  // against the exact keys of every token.
  const std::vector<double>& Score(const WorkloadQuery& q,
                                   const CameraTokens& cam,
                                   const QueryOracle&) override {
    const size_t n = cam.tokens, heads = cam.per_token / d_;
    const float inv = 1.0f / std::sqrt(static_cast<float>(d_));
    score_.assign(n, 0.0);
    logit_.resize(n);
    for (size_t h = 0; h < heads; ++h) {
      double mx = -INFINITY, sum = 0;
      for (size_t i = 0; i < n; ++i) {
        logit_[i] = inv * Dot(q.q.data() + h * d_,
                              cam.keys.data() + i * cam.per_token + h * d_, d_);
        mx = std::max<double>(mx, logit_[i]);
      }
      for (size_t i = 0; i < n; ++i) sum += std::exp(logit_[i] - mx);
      for (size_t i = 0; i < n; ++i) {
        score_[i] += std::exp(logit_[i] - mx) / (sum * heads);
      }
    }
    return score_;
  }

 private:
  uint32_t d_;
  std::vector<double> score_;
  std::vector<float> logit_;
};

}  // namespace

uint64_t TotalTokens(const std::vector<Span>& spans) { return Total(spans); }
uint64_t BaseResidentTokens(const PolicyBudget& b, const CameraTokens& cam) {
  return BaseResident(b, cam);
}

std::unique_ptr<EvalPolicy> MakeOracleTokensPolicy(const PolicyBudget& b) {
  return std::make_unique<OracleTokensPolicy>(b);
}
std::unique_ptr<EvalPolicy> MakeExactKeysPerHeadPolicy(const PolicyBudget& b,
                                                       uint32_t head_dim) {
  return std::make_unique<ExactKeysPerHeadPolicy>(b, head_dim);
}

std::unique_ptr<EvalPolicy> MakeFullPolicy(const PolicyBudget& b) {
  return std::make_unique<FullPolicy>(b);
}
std::unique_ptr<EvalPolicy> MakeStreamingLlmPolicy(const PolicyBudget& b) {
  return std::make_unique<StreamingLlmPolicy>(b);
}
std::unique_ptr<EvalPolicy> MakeWindowLruPolicy(const PolicyBudget& b) {
  return std::make_unique<WindowLruPolicy>(b);
}
std::unique_ptr<EvalPolicy> MakeH2oPolicy(const PolicyBudget& b) {
  return std::make_unique<H2oPolicy>(b);
}
std::unique_ptr<EvalPolicy> MakeMeanKeyTopkPolicy(const PolicyBudget& b) {
  return std::make_unique<MeanKeyTopkPolicy>(b);
}

}  // namespace kvmem
