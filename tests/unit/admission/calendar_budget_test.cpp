// Calendar budget periods: the window arithmetic (core/calendar.hpp), the
// configuration's `period: day|week|month` and auth.budget_utc_offset, and
// the in-process limiter's calendar windows on an injected wall clock.
#include <gtest/gtest.h>

#include "admission/local_limiter.hpp"
#include "auth/config.hpp"
#include "core/calendar.hpp"

namespace weir::admission {
namespace {

using namespace std::chrono_literals;
using core::calendar_window;
using core::CalendarPeriod;
using core::days_from_civil;
using core::kNsPerDay;

constexpr std::int64_t kNsPerS = 1'000'000'000;

// Unix ns of y-m-d hh:mm:ss UTC.
constexpr std::int64_t utc(std::int64_t y, unsigned m, unsigned d, int hh = 0, int mm = 0, int ss = 0) {
  return days_from_civil(y, m, d) * kNsPerDay + (hh * 3600 + mm * 60 + ss) * kNsPerS;
}

TEST(Calendar, CivilDaysMatchKnownDates) {
  static_assert(days_from_civil(1970, 1, 1) == 0);
  static_assert(days_from_civil(2000, 1, 1) == 10957);
  static_assert(days_from_civil(2028, 2, 29) == 21243);
  static_assert(days_from_civil(1969, 12, 29) == -3);
  for (std::int64_t z = -800'000; z <= 800'000; z += 37) {
    const auto c = core::civil_from_days(z);
    ASSERT_EQ(days_from_civil(c.year, c.month, c.day), z);
  }
  const auto leap = core::civil_from_days(21243);
  EXPECT_EQ(leap.year, 2028);
  EXPECT_EQ(leap.month, 2u);
  EXPECT_EQ(leap.day, 29u);
}

TEST(Calendar, DayWindowsAndTheInstantOfRollover) {
  const auto w = calendar_window(CalendarPeriod::day, utc(2026, 12, 2, 13, 5, 7), 0);
  EXPECT_EQ(w.index, days_from_civil(2026, 12, 2));
  EXPECT_EQ(w.start_ns, utc(2026, 12, 2));
  EXPECT_EQ(w.end_ns, utc(2026, 12, 3));
  // Midnight belongs to the new day; one ns before it to the old one.
  EXPECT_EQ(calendar_window(CalendarPeriod::day, utc(2026, 12, 3), 0).index, w.index + 1);
  EXPECT_EQ(calendar_window(CalendarPeriod::day, utc(2026, 12, 3) - 1, 0).index, w.index);
  // Before 1970 (negative Unix time) floors, not truncates.
  const auto old = calendar_window(CalendarPeriod::day, -1, 0);
  EXPECT_EQ(old.index, -1);
  EXPECT_EQ(old.start_ns, -kNsPerDay);
  EXPECT_EQ(old.end_ns, 0);
}

TEST(Calendar, OffsetsShiftTheWindow) {
  // +05:30: the local day starts at 18:30 UTC the day before.
  const std::int32_t ist = 5 * 3600 + 30 * 60;
  const auto w = calendar_window(CalendarPeriod::day, utc(2026, 12, 2, 18, 29, 59), ist);
  EXPECT_EQ(w.start_ns, utc(2026, 12, 1, 18, 30));
  EXPECT_EQ(w.end_ns, utc(2026, 12, 2, 18, 30));
  EXPECT_EQ(calendar_window(CalendarPeriod::day, utc(2026, 12, 2, 18, 30), ist).start_ns, utc(2026, 12, 2, 18, 30));
  // -08:00: the local day starts at 08:00 UTC.
  const std::int32_t pst = -8 * 3600;
  const auto p = calendar_window(CalendarPeriod::day, utc(2026, 12, 2, 7, 59, 59), pst);
  EXPECT_EQ(p.start_ns, utc(2026, 12, 1, 8));
  EXPECT_EQ(p.end_ns, utc(2026, 12, 2, 8));
  EXPECT_EQ(calendar_window(CalendarPeriod::day, utc(2026, 12, 2, 8), pst).start_ns, utc(2026, 12, 2, 8));
  // A month with a negative offset: 2027-01-01 00:30 UTC is still December at -08:00.
  const auto m = calendar_window(CalendarPeriod::month, utc(2027, 1, 1, 0, 30), pst);
  EXPECT_EQ(m.start_ns, utc(2026, 12, 1, 8));
  EXPECT_EQ(m.end_ns, utc(2027, 1, 1, 8));
  EXPECT_EQ(m.index, (2026 - 1970) * 12 + 11);
}

TEST(Calendar, IsoWeeksStartOnMonday) {
  // 2026-12-28 is a Monday; 2027-01-01 a Friday of the same ISO week.
  const auto w = calendar_window(CalendarPeriod::week, utc(2027, 1, 1, 12), 0);
  EXPECT_EQ(w.start_ns, utc(2026, 12, 28));
  EXPECT_EQ(w.end_ns, utc(2027, 1, 4));
  // Sunday 23:59:59.999999999 is the old week, Monday 00:00 the next.
  const auto sun = calendar_window(CalendarPeriod::week, utc(2026, 12, 28) - 1, 0);
  EXPECT_EQ(sun.end_ns, utc(2026, 12, 28));
  EXPECT_EQ(sun.index + 1, w.index);
  EXPECT_EQ(calendar_window(CalendarPeriod::week, utc(2026, 12, 28), 0).index, w.index);
  // The week of 1970-01-01 (a Thursday) started on Monday 1969-12-29: index 0.
  const auto first = calendar_window(CalendarPeriod::week, 0, 0);
  EXPECT_EQ(first.index, 0);
  EXPECT_EQ(first.start_ns, -3 * kNsPerDay);
  // +14:00: Monday starts at 10:00 UTC on Sunday.
  EXPECT_EQ(calendar_window(CalendarPeriod::week, utc(2026, 12, 27, 10), 14 * 3600).start_ns, utc(2026, 12, 27, 10));
}

TEST(Calendar, MonthEnds) {
  const auto feb = calendar_window(CalendarPeriod::month, utc(2028, 2, 29, 23, 59, 59), 0);
  EXPECT_EQ(feb.start_ns, utc(2028, 2, 1));
  EXPECT_EQ(feb.end_ns, utc(2028, 3, 1));
  EXPECT_EQ(feb.end_ns - feb.start_ns, 29 * kNsPerDay);
  EXPECT_EQ(calendar_window(CalendarPeriod::month, utc(2027, 2, 10), 0).end_ns, utc(2027, 3, 1));  // 28 days
  const auto dec = calendar_window(CalendarPeriod::month, utc(2026, 12, 31, 23, 59, 59), 0);
  EXPECT_EQ(dec.start_ns, utc(2026, 12, 1));
  EXPECT_EQ(dec.end_ns, utc(2027, 1, 1));
  const auto jan = calendar_window(CalendarPeriod::month, utc(2027, 1, 1), 0);
  EXPECT_EQ(jan.index, dec.index + 1);
  EXPECT_EQ(jan.end_ns, utc(2027, 2, 1));
  EXPECT_EQ(calendar_window(CalendarPeriod::month, 0, 0).index, 0);  // 1970-01
  EXPECT_EQ(calendar_window(CalendarPeriod::month, utc(2026, 4, 15), 0).end_ns - utc(2026, 4, 1), 30 * kNsPerDay);
}

TEST(Calendar, ParsesPeriodsOffsetsAndFormatsTimes) {
  EXPECT_EQ(core::parse_calendar_period("Day"), CalendarPeriod::day);
  EXPECT_EQ(core::parse_calendar_period("WEEK"), CalendarPeriod::week);
  EXPECT_EQ(core::parse_calendar_period("month"), CalendarPeriod::month);
  EXPECT_FALSE(core::parse_calendar_period("days"));
  EXPECT_FALSE(core::parse_calendar_period("fortnight"));
  EXPECT_EQ(core::parse_utc_offset("Z"), 0);
  EXPECT_EQ(core::parse_utc_offset("+00:00"), 0);
  EXPECT_EQ(core::parse_utc_offset("+05:30"), 19800);
  EXPECT_EQ(core::parse_utc_offset("-08:00"), -28800);
  EXPECT_EQ(core::parse_utc_offset("+14:00"), 50400);
  for (const char* bad : {"+14:01", "05:30", "+5:30", "+05:60", "+0530", "UTC", "Europe/Paris", "", "-15:00"})
    EXPECT_FALSE(core::parse_utc_offset(bad)) << bad;
  EXPECT_EQ(core::format_utc_offset(-28800), "-08:00");
  EXPECT_EQ(core::format_utc_offset(19800), "+05:30");
  EXPECT_EQ(core::format_rfc3339_utc(utc(2028, 2, 29, 23, 59, 59) + 999), "2028-02-29T23:59:59Z");
  EXPECT_EQ(core::format_rfc3339_utc(-1), "1969-12-31T23:59:59Z");
}

core::ConfigResult<auth::AuthConfig> parse(const std::string& yaml) {
  return auth::parse_auth_config(YAML::Load(yaml), "weir.yaml");
}

TEST(CalendarConfig, PeriodWordsAndTheOffset) {
  auto r = parse(R"(
auth:
  required: false
  budget_utc_offset: "-08:00"
tenants:
  a: {budget: {usd: 100, period: day}}
  b: {budget: {usd: 100, period: Week}}
  c: {budget: {usd: 100, period: MONTH}}
  d: {budget: {usd: 100, period: 720h}}
)");
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->budget_utc_offset_s, -28800);
  EXPECT_EQ(r->tenants.at("a").budget.calendar, CalendarPeriod::day);
  EXPECT_EQ(r->tenants.at("a").budget.utc_offset_s, -28800);
  EXPECT_EQ(r->tenants.at("a").budget.period.count(), 0);
  EXPECT_TRUE(r->tenants.at("a").budget.resets());
  EXPECT_EQ(r->tenants.at("b").budget.calendar, CalendarPeriod::week);
  EXPECT_EQ(r->tenants.at("c").budget.calendar, CalendarPeriod::month);
  EXPECT_EQ(r->tenants.at("d").budget.calendar, CalendarPeriod::none);
  EXPECT_EQ(r->tenants.at("d").budget.period, 720h);
  // Unquoted -08:00 and Z are read as the same text.
  auto u = parse("auth:\n  budget_utc_offset: -08:00\ntenants:\n  a: {budget: {usd: 1, period: day}}\n");
  ASSERT_TRUE(u) << u.error().to_string();
  EXPECT_EQ(u->tenants.at("a").budget.utc_offset_s, -28800);
  auto z = parse("auth:\n  budget_utc_offset: Z\ntenants:\n  a: {budget: {usd: 1, period: day}}\n");
  ASSERT_TRUE(z);
  EXPECT_EQ(z->budget_utc_offset_s, 0);
  // Without the setting: UTC.
  auto plain = parse("tenants:\n  a: {budget: {usd: 1, period: month}}\n");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->tenants.at("a").budget.utc_offset_s, 0);
  // Keys' budgets take it too.
  auto k = parse(
      "auth:\n  budget_utc_offset: \"+05:30\"\n  api_keys:\n    - id: k\n      sha256: "
      "0000000000000000000000000000000000000000000000000000000000000000\n      tenant: a\n      budget: {usd: 1, "
      "period: week}\ntenants:\n  a: {}\n");
  ASSERT_TRUE(k) << k.error().to_string();
  EXPECT_EQ(k->api_keys[0].budget.calendar, CalendarPeriod::week);
  EXPECT_EQ(k->api_keys[0].budget.utc_offset_s, 19800);
}

TEST(CalendarConfig, BadValuesAreClearErrors) {
  auto bad = parse("tenants:\n  a:\n    budget: {usd: 1, period: fortnight}\n");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().key, "tenants.a.budget.period");
  EXPECT_EQ(bad.error().file, "weir.yaml");
  EXPECT_EQ(bad.error().line, 3);
  EXPECT_NE(bad.error().message.find("day, week, month"), std::string::npos) << bad.error().to_string();
  auto days = parse("tenants:\n  a:\n    budget: {usd: 1, period: days}\n");
  ASSERT_FALSE(days);
  EXPECT_EQ(days.error().key, "tenants.a.budget.period");
  for (const char* off : {"Europe/Paris", "+5:30", "+15:00", "UTC", "[1]"}) {
    auto e = parse(std::string("auth:\n  budget_utc_offset: ") + off + "\n");
    ASSERT_FALSE(e) << off;
    EXPECT_EQ(e.error().key, "auth.budget_utc_offset") << off;
    EXPECT_EQ(e.error().line, 2) << off;
    EXPECT_NE(e.error().message.find("+HH:MM"), std::string::npos) << e.error().to_string();
  }
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
