#include "http/retry_after.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "core/saturating.hpp"

namespace weir::http {

std::optional<std::chrono::milliseconds> parse_retry_after(std::string_view v,
                                                           std::chrono::system_clock::time_point now) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty()) return std::nullopt;
  if (std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    // delay-seconds; more than 9 digits is longer than any cap (about 31 years): said as 10^9 s.
    if (v.size() > 9) return std::chrono::milliseconds(std::int64_t{1'000'000'000} * 1000);
    std::uint32_t s = 0;
    std::from_chars(v.data(), v.data() + v.size(), s);
    return std::chrono::milliseconds(std::uint64_t{s} * 1000);
  }
  // HTTP-date (RFC 9110 §5.6.7): IMF-fixdate, and the obsolete RFC 850 and
  // asctime forms a recipient must accept; read by the C library's strptime
  // (the "C" locale's English names), as UTC.
  if (v.size() > 40) return std::nullopt;
  char buf[48];
  std::memcpy(buf, v.data(), v.size());
  buf[v.size()] = '\0';
  for (const char* format : {"%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT", "%a %b %e %H:%M:%S %Y"}) {
    std::tm tm{};
    const char* end = ::strptime(buf, format, &tm);
    if (end == nullptr || *end != '\0') continue;
    const std::time_t at = ::timegm(&tm);
    if (at == static_cast<std::time_t>(-1)) return std::nullopt;
    // Not from_time_t: a date past 2262 (say the year 9999) overflows the clock's nanoseconds.
    const std::chrono::system_clock::time_point when(
        core::saturating_cast<std::chrono::system_clock::duration>(std::chrono::seconds(at)));
    if (when <= now) return std::chrono::milliseconds(0);
    return std::chrono::ceil<std::chrono::milliseconds>(when - now);
  }
  return std::nullopt;
}

std::optional<std::chrono::milliseconds> parse_retry_after_ms(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  const auto dot = v.find('.');
  const std::string_view whole = v.substr(0, dot);
  const std::string_view frac = dot == std::string_view::npos ? std::string_view() : v.substr(dot + 1);
  const auto digits = [](std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (whole.empty() || !digits(whole) || !digits(frac) || (dot != std::string_view::npos && frac.empty()))
    return std::nullopt;
  // More than 12 digits of ms (about 31 years) is past any cap: said as 10^12 ms.
  if (whole.size() > 12) return std::chrono::milliseconds(std::int64_t{1'000'000'000'000});
  std::int64_t ms = 0;
  std::from_chars(whole.data(), whole.data() + whole.size(), ms);
  if (frac.find_first_not_of('0') != std::string_view::npos) ++ms;
  return std::chrono::milliseconds(ms);
}

}  // namespace weir::http
