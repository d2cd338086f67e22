// Durations in microseconds (core/time.hpp): whole ones for a span,
// rounded once for a sum of nanosecond pieces (the access log's added_us).
#include "core/time.hpp"

#include <gtest/gtest.h>

namespace weir::core {
namespace {

using std::chrono::nanoseconds;

TEST(Time, MicrosRoundedIsTheNearestMicrosecondHalfUp) {
  EXPECT_EQ(micros_rounded(nanoseconds(0)), 0);
  EXPECT_EQ(micros_rounded(nanoseconds(499)), 0);
  EXPECT_EQ(micros_rounded(nanoseconds(500)), 1);
  EXPECT_EQ(micros_rounded(nanoseconds(1'499)), 1);
  EXPECT_EQ(micros_rounded(nanoseconds(1'500)), 2);
  EXPECT_EQ(micros_rounded(nanoseconds(35'123'999)), 35'124);
}

TEST(Time, MicrosRoundedIsZeroForANegativeSpan) {
  EXPECT_EQ(micros_rounded(nanoseconds(-1)), 0);
  EXPECT_EQ(micros_rounded(nanoseconds(-2'000)), 0);
}

TEST(Time, ASumOfPiecesRoundedOnceKeepsWhatTruncatingEachLoses) {
  // Ten pieces of 0.9 µs: 9 µs in all, where truncating each to whole µs (as micros() does) gives 0.
  Clock::duration sum{};
  std::int64_t truncated = 0;
  for (int i = 0; i < 10; ++i) {
    sum += nanoseconds(900);
    truncated += micros(nanoseconds(900));
  }
  EXPECT_EQ(truncated, 0);
  EXPECT_EQ(micros_rounded(sum), 9);
}

}  // namespace
}  // namespace weir::core
