// SplitMix64's output function (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", 2014): a well-mixed 64-bit value for
// each input, the same on every machine. For deterministic pseudo-random
// choices keyed by a number (a seed, a coordinate), not for secrets.
#ifndef KVMEM_BASE_SPLIT_MIX_H_
#define KVMEM_BASE_SPLIT_MIX_H_

#include <cstdint>

namespace kvmem {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace kvmem

#endif  // KVMEM_BASE_SPLIT_MIX_H_
