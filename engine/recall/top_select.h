// SelectTop: the best candidates by value until their weights reach a
// budget, by radix selection on the values' bits instead of a quickselect.
//
// The recall chooses from thousands of candidates four times (the token
// stage's pool of groups, the identity channel's pool, the budget's best
// tokens, the identity channel's best tokens); each choice partitioned with
// a comparator whose branches the CPU cannot predict, about 0.1 ms each at
// the evaluation's size. Here a float's bits, made an unsigned key in the
// same order, are counted into buckets of their top 12 bits (weights
// summed per bucket), the bucket holding the budget's edge is found from the
// top, and only its candidates go on to the next 12 bits, then the last 8:
// one predictable pass per level over fewer and fewer candidates.
//
// The order is the value's, larger first; equal values (the same float:
// -0 and +0 are one) by tie_better(a, b), "a before b", which must be a
// strict weak order. Values must not be NaN.
//
// Pure functions, safe from any thread (per-thread scratch).
#ifndef KVMEM_ENGINE_RECALL_TOP_SELECT_H_
#define KVMEM_ENGINE_RECALL_TOP_SELECT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/functional/function_ref.h"

namespace kvmem {

// The float's order as an unsigned key: a > b exactly when
// OrderKey(a) > OrderKey(b) (for non-NaN values; -0 and +0 one key).
inline uint32_t OrderKey(float v) {
  v += 0.0f;  // -0 as +0 (-0 + 0 is +0; x + 0 is x otherwise).
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  // Negative: all bits flipped; else the sign bit set. No branch: loops
  // of it vectorise.
  const uint32_t neg = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31);
  return u ^ (neg | 0x80000000u);
}

// The shortest prefix, in the order above, of the n candidates whose
// weights (weight[i]; null: 1 each) sum to at least `budget` (all of them
// when they sum to less; none for budget 0), as indices into *out: in that
// order when `sorted`, else in no particular order. With weight null and
// budget k: the best k.
void SelectTop(const float* value, const uint32_t* weight, size_t n,
               uint64_t budget,
               absl::FunctionRef<bool(uint32_t, uint32_t)> tie_better,
               bool sorted, std::vector<uint32_t>* out);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_TOP_SELECT_H_
