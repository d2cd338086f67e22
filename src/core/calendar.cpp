#include "core/calendar.hpp"

#include <string>

#include <fmt/format.h>

#include "core/text.hpp"
#include "core/time.hpp"

namespace weir::core {

namespace {
bool two_digits(std::string_view s, int& out) noexcept {
  if (s.size() != 2 || s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9') return false;
  out = (s[0] - '0') * 10 + (s[1] - '0');
  return true;
}
}  // namespace

std::optional<CalendarPeriod> parse_calendar_period(std::string_view s) noexcept {
  if (iequals(s, "day")) return CalendarPeriod::day;
  if (iequals(s, "week")) return CalendarPeriod::week;
  if (iequals(s, "month")) return CalendarPeriod::month;
  return std::nullopt;
}

std::string_view calendar_period_name(CalendarPeriod p) noexcept {
  switch (p) {
    case CalendarPeriod::day:
      return "day";
    case CalendarPeriod::week:
      return "week";
    case CalendarPeriod::month:
      return "month";
    default:
      return "";
  }
}

std::optional<std::int32_t> parse_utc_offset(std::string_view s) noexcept {
  if (s == "Z" || s == "z") return 0;
  if (s.size() != 6 || (s[0] != '+' && s[0] != '-') || s[3] != ':') return std::nullopt;
  int h = 0, m = 0;
  if (!two_digits(s.substr(1, 2), h) || !two_digits(s.substr(4, 2), m) || m > 59) return std::nullopt;
  const int total = h * 3600 + m * 60;
  if (total > 14 * 3600) return std::nullopt;
  return s[0] == '-' ? -total : total;
}

std::string format_utc_offset(std::int32_t seconds) {
  const char sign = seconds < 0 ? '-' : '+';
  const std::int32_t a = seconds < 0 ? -seconds : seconds;
  return fmt::format("{}{:02}:{:02}", sign, a / 3600, a / 60 % 60);
}

std::string format_rfc3339_utc(std::int64_t unix_ns) { return format_rfc3339(floor_div(unix_ns, 1'000'000'000)); }

}  // namespace weir::core
