// Clocks: monotonic for every duration Weir measures, wall time only for logs.
#pragma once

#include <chrono>
#include <cstdint>

namespace weir::core {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

inline TimePoint now() { return Clock::now(); }

// Duration in whole microseconds (µs), saturating at 0 for negative spans.
inline std::int64_t micros(Clock::duration d) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return us < 0 ? 0 : us;
}
inline std::int64_t micros_between(TimePoint from, TimePoint to) { return micros(to - from); }

}  // namespace weir::core
