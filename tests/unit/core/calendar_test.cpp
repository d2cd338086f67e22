// Calendar windows (core/calendar.hpp): days, ISO weeks and months on UTC
// plus a fixed offset, and the instant of rollover.
#include "core/calendar.hpp"

#include <gtest/gtest.h>

namespace weir::core {
namespace {

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
    const auto c = civil_from_days(z);
    ASSERT_EQ(days_from_civil(c.year, c.month, c.day), z);
  }
  const auto leap = civil_from_days(21243);
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
  EXPECT_EQ(parse_calendar_period("Day"), CalendarPeriod::day);
  EXPECT_EQ(parse_calendar_period("WEEK"), CalendarPeriod::week);
  EXPECT_EQ(parse_calendar_period("month"), CalendarPeriod::month);
  EXPECT_FALSE(parse_calendar_period("days"));
  EXPECT_FALSE(parse_calendar_period("fortnight"));
  EXPECT_EQ(parse_utc_offset("Z"), 0);
  EXPECT_EQ(parse_utc_offset("+00:00"), 0);
  EXPECT_EQ(parse_utc_offset("+05:30"), 19800);
  EXPECT_EQ(parse_utc_offset("-08:00"), -28800);
  EXPECT_EQ(parse_utc_offset("+14:00"), 50400);
  for (const char* bad : {"+14:01", "05:30", "+5:30", "+05:60", "+0530", "UTC", "Europe/Paris", "", "-15:00"})
    EXPECT_FALSE(parse_utc_offset(bad)) << bad;
  EXPECT_EQ(format_utc_offset(-28800), "-08:00");
  EXPECT_EQ(format_utc_offset(19800), "+05:30");
  EXPECT_EQ(format_rfc3339_utc(utc(2028, 2, 29, 23, 59, 59) + 999), "2028-02-29T23:59:59Z");
  EXPECT_EQ(format_rfc3339_utc(-1), "1969-12-31T23:59:59Z");
}

}  // namespace
}  // namespace weir::core
