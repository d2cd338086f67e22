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
  ASSERT_TRUE(lim.reserve_spend(0, 1000, T0).ok);
  lim.settle_spend(0, 1000, 1000, T0);
  auto r = lim.reserve_spend(0, 1, T0 + 1s);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, 9u);  // until 00:00:00, 9 s later
  r = lim.reserve_spend(0, 1, T0 + 10s - 1ns);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, 1u);
  const auto w = lim.budget_window(0, {}, T0);
  EXPECT_EQ(w.start_ns, utc(2026, 12, 2));
  EXPECT_EQ(w.end_ns, utc(2026, 12, 3));
  // The exact instant of midnight: a new window, nothing spent in it.
  EXPECT_EQ(lim.spent(0, T0 + 10s), 0);
  EXPECT_TRUE(lim.reserve_spend(0, 1000, T0 + 10s).ok);
  EXPECT_EQ(lim.budget_window(0, {}, T0 + 10s).start_ns, utc(2026, 12, 3));
}

TEST(LocalLimiterCalendar, MonthAndWeekRetryAfterWithOffsets) {
  // 17:30 UTC is 23:00 on 2028-02-29 at +05:30: the local month ends at 18:30 UTC, an hour later.
  const std::int32_t ist = 5 * 3600 + 30 * 60;
  LocalLimiter lim({scope_with(CalendarPeriod::month, 10, ist), scope_with(CalendarPeriod::week, 10, -8 * 3600)}, 1, T0,
                   utc(2028, 2, 29, 17, 30));
  ASSERT_TRUE(lim.reserve_spend(0, 10, T0).ok);
  lim.settle_spend(0, 10, 10, T0);
  auto r = lim.reserve_spend(0, 1, T0);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, 3600u);  // local 2028-03-01 00:00 = 2028-02-29 18:30 UTC
  EXPECT_TRUE(lim.reserve_spend(0, 1, T0 + 1h).ok);
  // The week at -08:00: 2028-02-29 is a Tuesday; the next local Monday
  // 00:00 is 2028-03-06 08:00 UTC.
  ASSERT_TRUE(lim.reserve_spend(1, 10, T0).ok);
  lim.settle_spend(1, 10, 10, T0);
  r = lim.reserve_spend(1, 1, T0);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, static_cast<std::uint32_t>((utc(2028, 3, 6, 8) - utc(2028, 2, 29, 17, 30)) / kNsPerS));
  EXPECT_FALSE(
      lim.reserve_spend(1, 1, T0 + std::chrono::nanoseconds(utc(2028, 3, 6, 8) - utc(2028, 2, 29, 17, 30)) - 1ns).ok);
  EXPECT_TRUE(lim.reserve_spend(1, 1, T0 + std::chrono::nanoseconds(utc(2028, 3, 6, 8) - utc(2028, 2, 29, 17, 30))).ok);
}

TEST(LocalLimiterCalendar, AReservationFromYesterdaySettlesIntoToday) {
  LocalLimiter lim({scope_with(CalendarPeriod::day, 1000)}, 1, T0, utc(2026, 12, 2, 23, 59, 59));
  ASSERT_TRUE(lim.reserve_spend(0, 600, T0).ok);
  // Still in flight after midnight: the new day counts the reservation (it
  // was not charged to yesterday), so it cannot also be spent again.
  EXPECT_EQ(lim.committed(0, T0 + 2s), 600);
  EXPECT_EQ(lim.spent(0, T0 + 2s), 0);
  EXPECT_FALSE(lim.reserve_spend(0, 500, T0 + 2s).ok);
  // Settled after midnight: the actual cost is charged to the new day only.
  lim.settle_spend(0, 600, 400, T0 + 2s);
  EXPECT_EQ(lim.spent(0, T0 + 2s), 400);
  EXPECT_EQ(lim.committed(0, T0 + 2s), 400);
  EXPECT_TRUE(lim.reserve_spend(0, 600, T0 + 2s).ok);
}

TEST(LocalLimiterCalendar, ARolloverKeepsEveryReservationInFlightAndDropsTheSettledSpend) {
  // The defect: the roll zeroed `committed`, so a new period admitted its
  // whole budget beside the reservations still streaming, and their
  // settlement then charged it up to twice the budget.
  LocalLimiter lim({scope_with(CalendarPeriod::day, 1000)}, 1, T0, utc(2026, 12, 2, 23, 59, 59));
  ASSERT_TRUE(lim.reserve_spend(0, 300, T0).ok);
  lim.settle_spend(0, 300, 250, T0);                                          // settled yesterday: gone at midnight
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(lim.reserve_spend(0, 300, T0).ok);  // in flight across midnight
  const auto after = T0 + 2s;
  EXPECT_EQ(lim.spent(0, after), 0);
  EXPECT_EQ(lim.committed(0, after), 600);
  EXPECT_TRUE(lim.reserve_spend(0, 400, after).ok);  // 600 + 400 = the budget
  EXPECT_FALSE(lim.reserve_spend(0, 1, after).ok);
  for (int i = 0; i < 2; ++i) lim.settle_spend(0, 300, 280, after);
  lim.settle_spend(0, 400, 400, after);
  EXPECT_EQ(lim.spent(0, after), 960);
  EXPECT_EQ(lim.committed(0, after), 960);
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
