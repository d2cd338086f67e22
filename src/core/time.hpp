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

// Parses an RFC 3339 date-time ("2026-11-30T03:12:45Z", fraction and a
// "+HH:MM"/"-HH:MM" offset allowed; 't'/'z' in lower case too) into Unix
// seconds (a fraction is dropped). False when `s` is not one.
bool parse_rfc3339(std::string_view s, std::int64_t& unix_s);

// Appends "Date: <IMF-fixdate>\r\n" (RFC 9110 §6.6.1) for Weir's own
// responses; formatted once a second per thread.
void append_http_date(std::string& out);

}  // namespace weir::core
