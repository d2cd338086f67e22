// Calendar budget periods (docs/admission.md, "Budgets"): days, ISO 8601
// weeks and months of the proleptic Gregorian calendar, on UTC shifted by a
// fixed offset (RFC 3339 §4.2 "+HH:MM"; no time zones, so no daylight saving).
// Header-only integer arithmetic: no allocation, no system call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace weir::core {

enum class CalendarPeriod : std::uint8_t {
  none,   // not a calendar period (a duration, or never)
  day,    // 00:00 to 24:00
  week,   // ISO 8601 week: Monday 00:00 to the next Monday 00:00
  month,  // the 1st 00:00 to the next month's 1st 00:00 (28 to 31 days)
};

// "day", "week" or "month" (ASCII, any case); nullopt for anything else.
std::optional<CalendarPeriod> parse_calendar_period(std::string_view s) noexcept;
// "day", "week", "month"; "" for none.
std::string_view calendar_period_name(CalendarPeriod p) noexcept;
// A fixed UTC offset as RFC 3339 writes it: "Z", "+HH:MM" or "-HH:MM"
// (HH 00..14, MM 00..59, at most 14:00 either way), in seconds east of UTC;
// nullopt for anything else.
std::optional<std::int32_t> parse_utc_offset(std::string_view s) noexcept;
// Seconds east of UTC as "+HH:MM" / "-HH:MM" ("+00:00" for 0).
std::string format_utc_offset(std::int32_t seconds);
// Unix ns as RFC 3339 UTC with whole seconds, e.g. "2028-02-29T00:00:00Z"
// (the fraction is dropped).
std::string format_rfc3339_utc(std::int64_t unix_ns);

// a / b rounded toward negative infinity (b > 0).
constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  const std::int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// Days since 1970-01-01 of the proleptic Gregorian date y-m-d (m 1..12,
// d 1..31). Howard Hinnant's days_from_civil
// (https://howardhinnant.github.io/date_algorithms.html).
constexpr std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) noexcept {
  y -= m <= 2 ? 1 : 0;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);                 // [0, 399]
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;  // [0, 365]
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;            // [0, 146096]
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

struct CivilDate {
  std::int64_t year;
  unsigned month;  // 1..12
  unsigned day;    // 1..31
};

// The date `z` days after 1970-01-01 (Hinnant's civil_from_days).
constexpr CivilDate civil_from_days(std::int64_t z) noexcept {
  z += 719468;
  const std::int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const auto doe = static_cast<unsigned>(z - era * 146097);                    // [0, 146096]
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;  // [0, 399]
  const std::int64_t y = static_cast<std::int64_t>(yoe) + era * 400;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);  // [0, 365]
  const unsigned mp = (5 * doy + 2) / 153;                       // [0, 11], March = 0
  const unsigned d = doy - (153 * mp + 2) / 5 + 1;
  const unsigned m = mp < 10 ? mp + 3 : mp - 9;
  return {y + (m <= 2 ? 1 : 0), m, d};
}

inline constexpr std::int64_t kNsPerDay = 86'400'000'000'000;

// One calendar window: [start_ns, end_ns) in Unix ns (UTC).
struct CalendarWindow {
  // Days since 1970-01-01, ISO weeks since Monday 1969-12-29, or months
  // since 1970-01, all on the offset's local time (the same numbering as
  // the Redis store's budget.lua).
  std::int64_t index = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

// The window of period `p` (not none) holding `unix_ns`, on UTC shifted by
// `utc_offset_s` seconds east. A window starts at its first instant: the
// instant of local midnight belongs to the new day.
constexpr CalendarWindow calendar_window(CalendarPeriod p, std::int64_t unix_ns, std::int32_t utc_offset_s) noexcept {
  const std::int64_t off = static_cast<std::int64_t>(utc_offset_s) * 1'000'000'000;
  const std::int64_t local = unix_ns + off;
  const std::int64_t day = floor_div(local, kNsPerDay);
  CalendarWindow w;
  std::int64_t first = 0, next = 0;  // local days since 1970-01-01
  switch (p) {
    case CalendarPeriod::week:
      // 1970-01-01 was a Thursday: ISO weeks start on the Mondays 7k - 3.
      w.index = floor_div(day + 3, 7);
      first = w.index * 7 - 3;
      next = first + 7;
      break;
    case CalendarPeriod::month: {
      const CivilDate c = civil_from_days(day);
      w.index = (c.year - 1970) * 12 + static_cast<std::int64_t>(c.month) - 1;
      first = days_from_civil(c.year, c.month, 1);
      next = c.month == 12 ? days_from_civil(c.year + 1, 1, 1) : days_from_civil(c.year, c.month + 1, 1);
      break;
    }
    default:  // day
      w.index = day;
      first = day;
      next = day + 1;
      break;
  }
  w.start_ns = first * kNsPerDay - off;
  w.end_ns = next * kNsPerDay - off;
  return w;
}

}  // namespace weir::core
