// Clocks: monotonic for every duration Weir measures, wall time only for logs.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace weir::core {

class TextWriter;  // core/text_writer.hpp

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

inline TimePoint now() { return Clock::now(); }

// Duration in whole microseconds (µs), saturating at 0 for negative spans.
inline std::int64_t micros(Clock::duration d) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return us < 0 ? 0 : us;
}
inline std::int64_t micros_between(TimePoint from, TimePoint to) { return micros(to - from); }
// Duration in microseconds rounded to the nearest (half up), 0 for negative
// spans: for a sum of nanosecond pieces, rounded once at its end.
inline std::int64_t micros_rounded(Clock::duration d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  return ns <= 0 ? 0 : (ns + 500) / 1000;
}
// True when `deadline` is set (not the epoch) and `now` is at or past it.
inline bool passed(TimePoint deadline, TimePoint now) { return deadline != TimePoint{} && now >= deadline; }

// Appends the current UTC time as RFC 3339 with milliseconds, e.g.
// 2026-11-30T03:12:45.123Z (access-log timestamps). The second is formatted
// once per second per thread.
void append_rfc3339_now(std::string& out);
// The same for a given wall-clock time `t`; or through a TextWriter.
void append_rfc3339(std::string& out, std::chrono::system_clock::time_point t);
void put_rfc3339(TextWriter& w, std::chrono::system_clock::time_point t);
void put_rfc3339(TextWriter& w, std::chrono::system_clock::time_point t);

// Unix seconds as RFC 3339 in UTC without fraction, e.g. 2026-11-30T03:12:45Z.
std::string format_rfc3339(std::int64_t unix_s);

// How parse_rfc3339 makes whole Unix seconds of an instant between two.
enum class RoundSeconds : std::uint8_t {
  down,  // the second it falls in (a fraction dropped)
  up,    // the first whole second at or after it: for a deadline that must not come early
};

// Parses an RFC 3339 date-time ("2026-11-30T03:12:45Z", fraction and a
// "+HH:MM"/"-HH:MM" offset allowed; 't'/'z' in lower case too) into Unix
// seconds, rounded as `round` says. A leap second (second 60) is taken only
// where one can be, at the end of a month in UTC (23:59:60Z; RFC 3339 §5.7),
// and is 23:59:59 rounded down, 00:00:00 of the next day up (Unix time has
// no second 60). False when `s` is not one.
bool parse_rfc3339(std::string_view s, std::int64_t& unix_s, RoundSeconds round = RoundSeconds::down);

// True when Unix second `unix_s` is 23:59:59 UTC of the last day of a month:
// the second after which a leap second (23:59:60) may be inserted.
bool ends_utc_month(std::int64_t unix_s);

// Appends "Date: <IMF-fixdate>\r\n" (RFC 9110 §6.6.1) for Weir's own
// responses; formatted once a second per thread.
void append_http_date(std::string& out);

}  // namespace weir::core
