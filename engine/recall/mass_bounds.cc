#include "engine/recall/mass_bounds.h"

#include <algorithm>
#include <limits>

#include "engine/recall/recall_planner.h"

namespace kvmem {
namespace {

// Keeps the best units by key until they hold `need` tokens; Threshold()
// is then the largest key t such that the units keyed >= t hold at least
// `need` tokens (-inf while all seen hold fewer). One pass; the heap only
// changes when a unit beats the current threshold.
class KeyThreshold {
 public:
  explicit KeyThreshold(uint64_t need) : need_(need) {}
  void Add(float key, uint32_t tokens) {
    if (held_ >= need_ && key <= heap_.front().first) return;
    heap_.emplace_back(key, tokens);
    std::push_heap(heap_.begin(), heap_.end(), Greater);
    held_ += tokens;
    // Drop the weakest while the others still hold enough.
    while (held_ - heap_.front().second >= need_) {
      held_ -= heap_.front().second;
      std::pop_heap(heap_.begin(), heap_.end(), Greater);
      heap_.pop_back();
    }
  }
  float Threshold() const {
    return held_ >= need_ ? heap_.front().first
                          : -std::numeric_limits<float>::infinity();
  }

 private:
  static bool Greater(const std::pair<float, uint32_t>& a,
                      const std::pair<float, uint32_t>& b) {
    return a.first > b.first;
  }
  const uint64_t need_;
  uint64_t held_ = 0;
  std::vector<std::pair<float, uint32_t>> heap_;  // Min-heap by key.
};

}  // namespace

// Bounds of each unit's rank value (MassRankValue of its density and its
// block's known semantic score): density / slack and density * slack; -1
// for units that are not recallable (on[i] == 0).
void ValueBounds(const float* density, const float* slack, const float* on,
                 const std::vector<uint64_t>& ids, uint32_t shift,
                 const SemanticCache& sem, float model_weight,
                 std::vector<float>* lower_out, std::vector<float>* upper_out) {
  const size_t n = ids.size();
  lower_out->resize(n);
  upper_out->resize(n);
  float* lower = lower_out->data();
  float* upper = upper_out->data();
  // The upper bound at most the largest float: inf there would make a unit
  // that is not recallable (on 0) NaN.
  constexpr float kTop = std::numeric_limits<float>::max();
  for (size_t i = 0; i < n; ++i) {  // Branch-free: it vectorises.
    lower[i] = on[i] * (density[i] / slack[i]) + (on[i] - 1.0f);
    upper[i] = on[i] * std::min(density[i] * slack[i], kTop) + (on[i] - 1.0f);
  }
  if (!sem.on()) return;
  for (size_t i = 0; i < n; ++i) {
    if (upper[i] < 0) continue;
    const float s = sem.Known(ids[i] >> shift);
    lower[i] = MassRankValue(lower[i], s, model_weight);
    upper[i] = MassRankValue(upper[i], s, model_weight);
  }
}

// theta: the largest value such that the units whose lower bound reaches
// it hold the budget; only units whose upper bound reaches theta can be
// among the first taken. *pending receives (row, upper) of the units whose
// upper bound reaches the floor theta was computed over (a superset of
// those reaching theta). To avoid a heap over every unit: guess a floor
// from a 1/16 sample (its best units holding 1/16 of the budget), take the
// units whose upper bound reaches the floor, and compute theta over them;
// that is exact when theta >= floor (every unit whose lower bound reaches
// theta is then among them). Otherwise the floor is the sample's threshold
// for the whole budget, which is never above theta.
float BudgetThreshold(const std::vector<float>& lower,
                      const std::vector<float>& upper,
                      const std::vector<uint32_t>& tokens, uint32_t budget,
                      std::vector<std::pair<uint32_t, float>>* pending) {
  const size_t n = lower.size();
  auto threshold_over = [&](float floor) {
    KeyThreshold threshold(budget);
    pending->clear();
    for (size_t i0 = 0; i0 < n; i0 += 16) {  // Most runs of 16 skip at once.
      const size_t i1 = std::min(n, i0 + 16);
      // Whether any reaches the floor, as a count the compiler vectorises
      // (a float max chain stays scalar: one max after another).
      uint32_t reach = 0;
      for (size_t i = i0; i < i1; ++i) reach += upper[i] >= floor;
      if (reach == 0) continue;
      for (size_t i = i0; i < i1; ++i) {
        if (!(upper[i] >= floor)) continue;
        threshold.Add(lower[i], tokens[i]);
        pending->emplace_back(static_cast<uint32_t>(i), upper[i]);
      }
    }
    return threshold.Threshold();
  };
  KeyThreshold guess((budget + 15) / 16), safe(budget);
  for (size_t i = 0; i < n; i += 16) {
    if (upper[i] < 0) continue;
    guess.Add(lower[i], tokens[i]);
    safe.Add(lower[i], tokens[i]);
  }
  const float floor = std::max(guess.Threshold(), 0.0f);
  const float theta = threshold_over(floor);
  if (theta >= floor) return theta;
  return threshold_over(std::max(safe.Threshold(), 0.0f));
}

}  // namespace kvmem
