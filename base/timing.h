// Elapsed time, the one way kvmem measures it: the steady clock, in
// microseconds. Pure functions, safe from any thread.
#ifndef KVMEM_BASE_TIMING_H_
#define KVMEM_BASE_TIMING_H_

#include <chrono>
#include <cstdint>
#include <limits>

namespace kvmem {

using SteadyClock = std::chrono::steady_clock;

// Microseconds from t0 to now.
inline double MicrosSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double, std::micro>(SteadyClock::now() - t0)
      .count();
}

// The same in whole microseconds, saturated at 2^32 - 1 (the width of the
// engine's timing fields).
inline uint32_t WholeMicrosSince(SteadyClock::time_point t0) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      SteadyClock::now() - t0)
                      .count();
  if (us <= 0) return 0;
  constexpr auto kMax = std::numeric_limits<uint32_t>::max();
  return us >= static_cast<int64_t>(kMax) ? kMax : static_cast<uint32_t>(us);
}

}  // namespace kvmem

#endif  // KVMEM_BASE_TIMING_H_
