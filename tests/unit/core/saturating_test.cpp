// core::saturating_cast / saturating_add (core/saturating.hpp): a number of
// seconds or milliseconds from outside that does not fit a clock's int64
// nanoseconds saturates at the range instead of being undefined behaviour
// (which the ASan build's UBSan reports and aborts on).
#include "core/saturating.hpp"

#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

namespace weir::core {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using Secs = std::chrono::duration<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(SaturatingCast, DoubleSecondsToNanosecondsAtTheEdges) {
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(1.5)), nanoseconds(1'500'000'000));
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(-1.5)), nanoseconds(-1'500'000'000));
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(1e-10)), nanoseconds(0));  // truncated, as duration_cast
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(9.2e9)), nanoseconds(9'200'000'000'000'000'000));
  // 9.2234e9 s is past int64 nanoseconds (about 9.2234e9 s, 2262-04-11).
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(9.3e9)), nanoseconds::max());
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(253402300799.0)), nanoseconds::max());  // 9999-12-31
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(1e19)), nanoseconds::max());
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(1e300)), nanoseconds::max());
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(kInf)), nanoseconds::max());
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(-9.3e9)), nanoseconds::min());
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(-1e19)), nanoseconds::min());
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(-kInf)), nanoseconds::min());
  EXPECT_EQ(saturating_cast<nanoseconds>(Secs(std::numeric_limits<double>::quiet_NaN())), nanoseconds::zero());
  // 2^63 ns exactly is one past the range; 2^62 fits.
  EXPECT_EQ(saturating_cast<nanoseconds>(std::chrono::duration<double, std::nano>(0x1p63)), nanoseconds::max());
  EXPECT_EQ(saturating_cast<nanoseconds>(std::chrono::duration<double, std::nano>(0x1p62)),
            nanoseconds(std::int64_t{1} << 62));
  EXPECT_EQ(saturating_cast<nanoseconds>(std::chrono::duration<double, std::nano>(-0x1p63)), nanoseconds::min());
}

TEST(SaturatingCast, IntegerSecondsAndMillisecondsToFinerUnits) {
  constexpr std::int64_t kLast = 9'223'372'036;  // the last whole second int64 nanoseconds hold
  EXPECT_EQ(saturating_cast<nanoseconds>(seconds(kLast)), nanoseconds(kLast * 1'000'000'000));
  EXPECT_EQ(saturating_cast<nanoseconds>(seconds(kLast + 1)), nanoseconds::max());
  EXPECT_EQ(saturating_cast<nanoseconds>(seconds(-kLast)), nanoseconds(-kLast * 1'000'000'000));
  EXPECT_EQ(saturating_cast<nanoseconds>(seconds(-kLast - 1)), nanoseconds::min());
  EXPECT_EQ(saturating_cast<nanoseconds>(seconds::max()), nanoseconds::max());
  EXPECT_EQ(saturating_cast<nanoseconds>(seconds::min()), nanoseconds::min());
  EXPECT_EQ(saturating_cast<milliseconds>(seconds(INT64_MAX)), milliseconds::max());     // Retry-After: 2^63-1
  EXPECT_EQ(saturating_cast<nanoseconds>(milliseconds(INT64_MAX)), nanoseconds::max());  // a Redis PTTL
  EXPECT_EQ(saturating_cast<milliseconds>(seconds(12)), milliseconds(12'000));
  // An unsigned count (a JSON uint64) past int64.
  EXPECT_EQ(saturating_cast<seconds>(std::chrono::duration<std::uint64_t>(UINT64_MAX)), seconds::max());
  EXPECT_EQ(saturating_cast<nanoseconds>(std::chrono::duration<std::uint64_t>(5)), nanoseconds(5'000'000'000));
}

TEST(SaturatingCast, ToCoarserUnitsTruncatesAsDurationCast) {
  EXPECT_EQ(saturating_cast<seconds>(nanoseconds::max()), seconds(9'223'372'036));
  EXPECT_EQ(saturating_cast<seconds>(milliseconds(-1'999)), seconds(-1));
  EXPECT_EQ(saturating_cast<seconds>(std::chrono::duration<std::uint64_t, std::milli>(UINT64_MAX)),
            seconds(static_cast<std::int64_t>(UINT64_MAX / 1000)));
}

TEST(SaturatingAdd, ATimePointSaturatesAtTheClocksRange) {
  using Wall = std::chrono::system_clock::time_point;
  const Wall t(seconds(1'800'000'000));
  EXPECT_EQ(saturating_add(t, seconds(60)), Wall(seconds(1'800'000'060)));
  EXPECT_EQ(saturating_add(t, milliseconds(INT64_MAX)), Wall::max());
  EXPECT_EQ(saturating_add(t, seconds(8'000'000'000)), Wall::max());  // each fits, the sum does not
  EXPECT_EQ(saturating_add(t, Secs(1e19)), Wall::max());
  EXPECT_EQ(saturating_add(t, Secs(-1e20)), Wall::min());
  // A `d` out of range on its own that `t` brings back in.
  EXPECT_EQ(saturating_add(Wall(seconds(-5'000'000'000)), seconds(10'000'000'000)), Wall(seconds(5'000'000'000)));
  EXPECT_EQ(saturating_add(Wall::max(), milliseconds(INT64_MAX)), Wall::max());
  EXPECT_EQ(saturating_add(Wall::min(), seconds(-1)), Wall::min());
  EXPECT_EQ(saturating_add(t, Secs(std::numeric_limits<double>::quiet_NaN())), t);
}

}  // namespace
}  // namespace weir::core
