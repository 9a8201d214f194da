// StreamModel: the test's own model of a stream with fixed frames per block,
// kept from the floats the test generated. Its Recall is the brute-force
// oracle that engine and server answers are checked against: exact inner
// products with mean-key summaries, blocks entirely outside the hot window,
// top-k by score, then the token budget filled in score order.
#ifndef KVMEM_TESTS_STREAM_MODEL_H_
#define KVMEM_TESTS_STREAM_MODEL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace kvmem::testing {

struct ModelFrame {
  FloatFrame kv;
  uint64_t first_pos = 0;
  std::string bytes;  // Encoded payload as sent.
};

struct OracleHit {
  uint64_t block_id;
  double score;
  uint32_t tokens;
  double mass = 0;  // MassRecall: the block's estimated attention share.
};

class StreamModel {
 public:
  StreamModel(TestGeometry g, uint32_t frames_per_block, uint32_t hot_window,
              std::vector<uint32_t> indexed_layers)
      : g_(g),
        fpb_(frames_per_block),
        window_(hot_window),
        layers_(std::move(indexed_layers)) {}

  // A new frame of `tokens` tokens starting `gap` positions after the
  // previous one's end.
  const ModelFrame& AddFrame(std::mt19937_64& rng, uint32_t tokens,
                             uint32_t gap = 0) {
    ModelFrame f;
    f.kv = RandomFrame(rng, g_, tokens);
    f.first_pos = next_pos_ + gap;
    f.bytes = Encode(f.kv, g_.dtype);
    next_pos_ = f.first_pos + tokens;
    frames_.push_back(std::move(f));
    return frames_.back();
  }

  // Keeps the first n frames (a crash lost the rest before they were
  // durable); later frames continue from the n-th's end.
  void Truncate(size_t n) {
    if (n >= frames_.size()) return;
    frames_.resize(n);
    next_pos_ =
        n == 0 ? 0 : frames_.back().first_pos + frames_.back().kv.tokens;
  }

  // Seals the partial block, as CloseStream does.
  void Close() {
    if (frames_.size() > block_starts_end())
      sealed_extra_.push_back(frames_.size());
  }

  size_t sealed_blocks() const { return BlockRanges().size(); }
  uint64_t next_pos() const { return next_pos_; }
  const std::vector<ModelFrame>& frames() const { return frames_; }
  size_t summary_dim() const {
    return layers_.size() * g_.kv_heads * g_.head_dim;
  }
  // Indexed layers x KV heads: the heads of a query vector.
  size_t heads() const { return layers_.size() * g_.kv_heads; }

  // [first_frame, end_frame) of each sealed block.
  std::vector<std::pair<size_t, size_t>> BlockRanges() const {
    std::vector<std::pair<size_t, size_t>> r;
    size_t start = 0;
    size_t extra = 0;
    while (true) {
      size_t end = start + fpb_;
      if (extra < sealed_extra_.size() && sealed_extra_[extra] <= end &&
          sealed_extra_[extra] > start) {
        end = sealed_extra_[extra++];
      } else if (end > frames_.size()) {
        break;
      }
      r.emplace_back(start, end);
      start = end;
    }
    return r;
  }

  std::string BlockBytes(size_t block) const {
    const auto [a, b] = BlockRanges()[block];
    std::string out;
    for (size_t f = a; f < b; ++f) out += frames_[f].bytes;
    return out;
  }

  // The sealed blocks wholly before the hot window that ends at current_pos
  // (0: the newest position), in id order, with their token counts (score
  // 0): what any scorer may recall.
  std::vector<OracleHit> Eligible(uint64_t current_pos = 0) const {
    const uint64_t window_end = current_pos == 0 ? next_pos_ : current_pos + 1;
    const uint64_t window_start =
        window_end > window_ ? window_end - window_ : 0;
    std::vector<OracleHit> out;
    const auto ranges = BlockRanges();
    for (size_t b = 0; b < ranges.size(); ++b) {
      const auto [first, end] = ranges[b];
      const ModelFrame& last = frames_[end - 1];
      if (last.first_pos + last.kv.tokens > window_start) continue;
      uint32_t tokens = 0;
      for (size_t f = first; f < end; ++f) tokens += frames_[f].kv.tokens;
      out.push_back({b, 0, tokens});
    }
    return out;
  }

  // With `layers`, scores use only those layers' mean keys (a per-layer
  // recall set); q then holds one [kv_head][head_dim] vector per listed layer.
  std::vector<OracleHit> Recall(
      const std::vector<float>& q, uint32_t top_k, uint32_t max_tokens,
      uint64_t current_pos = 0,
      const std::vector<uint32_t>* layers = nullptr) const {
    std::vector<OracleHit> scored = Eligible(current_pos);
    const auto ranges = BlockRanges();
    for (OracleHit& h : scored) {
      const auto [first, end] = ranges[h.block_id];
      std::vector<const FloatFrame*> kv;
      for (size_t f = first; f < end; ++f) kv.push_back(&frames_[f].kv);
      const std::vector<double> mean =
          MeanKey(g_, kv, layers != nullptr ? *layers : layers_);
      double s = 0;
      for (size_t i = 0; i < mean.size(); ++i) s += q[i] * mean[i];
      h.score = s;
    }
    std::sort(scored.begin(), scored.end(),
              [](const OracleHit& a, const OracleHit& b) {
                return a.score > b.score;
              });
    if (scored.size() > top_k) scored.resize(top_k);
    std::vector<OracleHit> chosen;
    uint64_t used = 0;
    for (const OracleHit& h : scored) {
      if (used + h.tokens > max_tokens) continue;
      used += h.tokens;
      chosen.push_back(h);
      if (used == max_tokens) break;
    }
    return chosen;
  }

  // Score MASS over whole blocks (engine/recall/mass_estimate.h, computed here
  // directly in double): `vectors` query vectors back to back; window_lse
  // (vectors x heads) as the front end sends it, or empty for kvmem's
  // estimate from the blocks overlapping the window and the open block.
  // Ranked by mass per token (newer first on ties), the budget filled in
  // that order, at most top_k blocks (0: no cap). Heads [h0, h1) of the
  // summary's (h1 0: all): one indexed layer's for a per-layer set.
  // *densities (optional) receives every recallable block's mass per token.
  std::vector<OracleHit> MassRecall(
      const std::vector<float>& q, const std::vector<float>& window_lse,
      uint32_t top_k, uint32_t max_tokens, size_t h0 = 0, size_t h1 = 0,
      std::map<uint64_t, double>* densities = nullptr) const {
    const size_t dim = summary_dim(), hd = g_.head_dim, heads = dim / hd;
    if (h1 == 0) h1 = heads;
    const size_t vectors = q.size() / dim;
    const uint64_t window_start = next_pos_ > window_ ? next_pos_ - window_ : 0;
    struct Unit {
      uint64_t block;
      bool recallable;
      uint32_t tokens;
      std::vector<double> mean;
    };
    std::vector<Unit> units;
    const auto ranges = BlockRanges();
    auto add = [&](size_t first, size_t end, uint64_t id) {
      std::vector<const FloatFrame*> kv;
      uint32_t tokens = 0;
      for (size_t f = first; f < end; ++f) {
        kv.push_back(&frames_[f].kv);
        tokens += frames_[f].kv.tokens;
      }
      const ModelFrame& last = frames_[end - 1];
      units.push_back({id, last.first_pos + last.kv.tokens <= window_start,
                       tokens, MeanKey(g_, kv, layers_)});
    };
    for (size_t b = 0; b < ranges.size(); ++b) {
      add(ranges[b].first, ranges[b].second, b);
    }
    const size_t sealed_end = ranges.empty() ? 0 : ranges.back().second;
    if (window_lse.empty() && sealed_end < frames_.size()) {
      add(sealed_end, frames_.size(), UINT64_MAX);  // The open block.
    }
    const double inv = 1.0 / std::sqrt(double(hd));
    std::vector<double> density(units.size(), 0.0);
    for (size_t j = 0; j < vectors; ++j) {
      for (size_t h = h0; h < h1; ++h) {
        auto logit = [&](const Unit& u) {
          double z = 0;
          for (size_t k = 0; k < hd; ++k) {
            z += double(q[j * dim + h * hd + k]) * u.mean[h * hd + k];
          }
          return z * inv;
        };
        double sum = window_lse.empty()
                         ? 0.0
                         : std::exp(double(window_lse[j * heads + h]));
        for (const Unit& u : units) {
          if (u.recallable || window_lse.empty()) {
            sum += u.tokens * std::exp(logit(u));
          }
        }
        for (size_t i = 0; i < units.size(); ++i) {
          density[i] += std::exp(logit(units[i])) / sum / (vectors * (h1 - h0));
        }
      }
    }
    if (densities != nullptr) {
      for (size_t i = 0; i < units.size(); ++i) {
        if (units[i].recallable) (*densities)[units[i].block] = density[i];
      }
    }
    std::vector<size_t> order;
    for (size_t i = 0; i < units.size(); ++i) {
      if (units[i].recallable) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return density[a] != density[b] ? density[a] > density[b]
                                      : units[a].block > units[b].block;
    });
    std::vector<OracleHit> chosen;
    uint64_t used = 0;
    for (size_t i : order) {
      const Unit& u = units[i];
      if (used + u.tokens > max_tokens) continue;
      if (top_k > 0 && chosen.size() >= top_k) break;
      used += u.tokens;
      chosen.push_back({u.block, density[i], u.tokens, density[i] * u.tokens});
    }
    return chosen;
  }

 private:
  size_t block_starts_end() const {
    const auto r = BlockRanges();
    return r.empty() ? 0 : r.back().second;
  }

  TestGeometry g_;
  uint32_t fpb_;
  uint32_t window_;
  std::vector<uint32_t> layers_;
  std::vector<ModelFrame> frames_;
  std::vector<size_t> sealed_extra_;  // Frame counts at which Close sealed.
  uint64_t next_pos_ = 0;
};

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_STREAM_MODEL_H_
