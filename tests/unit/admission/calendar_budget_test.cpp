// The in-process limiter's calendar budgets (day, ISO week, month) on an
// injected wall clock: spend in one window does not count in the next, and
// Retry-After runs to the next window's start.
#include <gtest/gtest.h>

#include "admission/local_limiter.hpp"
#include "core/calendar.hpp"

namespace weir::admission {
namespace {

using namespace std::chrono_literals;
using core::CalendarPeriod;
using core::days_from_civil;
using core::kNsPerDay;

constexpr std::int64_t kNsPerS = 1'000'000'000;

// Unix ns of y-m-d hh:mm:ss UTC.
constexpr std::int64_t utc(std::int64_t y, unsigned m, unsigned d, int hh = 0, int mm = 0, int ss = 0) {
  return days_from_civil(y, m, d) * kNsPerDay + (hh * 3600 + mm * 60 + ss) * kNsPerS;
}

const Instant T0 = Instant(1000h);  // a fake steady clock

auth::ScopeInfo scope_with(CalendarPeriod p, std::int64_t nano_usd, std::int32_t offset_s = 0) {
  auth::ScopeInfo s;
  s.name = "tenant:a";
  s.budget.enabled = true;
  s.budget.limit_nano_usd = nano_usd;
  s.budget.calendar = p;
  s.budget.utc_offset_s = offset_s;
  return s;
}

TEST(LocalLimiterCalendar, SpendInOneDayDoesNotCountInTheNext) {
  // T0 is 2026-12-02 23:59:50 UTC on the injected wall clock.
  LocalLimiter lim({scope_with(CalendarPeriod::day, 1000)}, 2, T0, utc(2026, 12, 2, 23, 59, 50));
  std::uint32_t period = 0;
  ASSERT_TRUE(lim.reserve_spend(0, 1000, T0, &period).ok);
  lim.settle_spend(0, 1000, 1000, period, T0);
  auto r = lim.reserve_spend(0, 1, T0 + 1s, &period);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, 9u);  // until 00:00:00, 9 s later
  r = lim.reserve_spend(0, 1, T0 + 10s - 1ns, &period);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, 1u);
  const auto w = lim.budget_window(0, {}, T0);
  EXPECT_EQ(w.start_ns, utc(2026, 12, 2));
  EXPECT_EQ(w.end_ns, utc(2026, 12, 3));
  // The exact instant of midnight: a new window, nothing spent in it.
  EXPECT_EQ(lim.spent(0, T0 + 10s), 0);
  EXPECT_TRUE(lim.reserve_spend(0, 1000, T0 + 10s, &period).ok);
  EXPECT_EQ(lim.budget_window(0, {}, T0 + 10s).start_ns, utc(2026, 12, 3));
}

TEST(LocalLimiterCalendar, MonthAndWeekRetryAfterWithOffsets) {
  // 17:30 UTC is 23:00 on 2028-02-29 at +05:30: the local month ends at 18:30 UTC, an hour later.
  const std::int32_t ist = 5 * 3600 + 30 * 60;
  LocalLimiter lim({scope_with(CalendarPeriod::month, 10, ist), scope_with(CalendarPeriod::week, 10, -8 * 3600)}, 1, T0,
                   utc(2028, 2, 29, 17, 30));
  std::uint32_t p = 0;
  ASSERT_TRUE(lim.reserve_spend(0, 10, T0, &p).ok);
  lim.settle_spend(0, 10, 10, p, T0);
  auto r = lim.reserve_spend(0, 1, T0, &p);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, 3600u);  // local 2028-03-01 00:00 = 2028-02-29 18:30 UTC
  EXPECT_TRUE(lim.reserve_spend(0, 1, T0 + 1h, &p).ok);
  // The week at -08:00: 2028-02-29 is a Tuesday; the next local Monday
  // 00:00 is 2028-03-06 08:00 UTC.
  ASSERT_TRUE(lim.reserve_spend(1, 10, T0, &p).ok);
  lim.settle_spend(1, 10, 10, p, T0);
  r = lim.reserve_spend(1, 1, T0, &p);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, static_cast<std::uint32_t>((utc(2028, 3, 6, 8) - utc(2028, 2, 29, 17, 30)) / kNsPerS));
  EXPECT_FALSE(
      lim.reserve_spend(1, 1, T0 + std::chrono::nanoseconds(utc(2028, 3, 6, 8) - utc(2028, 2, 29, 17, 30)) - 1ns, &p)
          .ok);
  EXPECT_TRUE(
      lim.reserve_spend(1, 1, T0 + std::chrono::nanoseconds(utc(2028, 3, 6, 8) - utc(2028, 2, 29, 17, 30)), &p).ok);
}

TEST(LocalLimiterCalendar, AReservationFromYesterdaySettlesIntoToday) {
  LocalLimiter lim({scope_with(CalendarPeriod::day, 1000)}, 1, T0, utc(2026, 12, 2, 23, 59, 59));
  std::uint32_t p = 0;
  ASSERT_TRUE(lim.reserve_spend(0, 600, T0, &p).ok);
  // Settled after midnight: the actual cost is charged to the new day only.
  lim.settle_spend(0, 600, 400, p, T0 + 2s);
  EXPECT_EQ(lim.spent(0, T0 + 2s), 400);
  EXPECT_EQ(lim.committed(0, T0 + 2s), 400);
}

TEST(LocalLimiterCalendar, TheSystemClockIsReadOnceAtCreation) {
  // No injected wall clock: the limiter maps `epoch` to the system clock's Unix time.
  const auto before =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const Instant epoch = MonoClock::now();
  LocalLimiter lim({scope_with(CalendarPeriod::day, 1)}, 1, epoch);
  const auto after =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_GE(lim.unix_ns(epoch), before - 1'000'000'000);
  EXPECT_LE(lim.unix_ns(epoch), after + 1'000'000'000);
}

}  // namespace
}  // namespace weir::admission
