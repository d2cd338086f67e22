#include "core/time.hpp"

#include <ctime>
#include <iterator>

#include <fmt/format.h>

namespace weir::core {

void append_http_date(std::string& out) {
  thread_local std::int64_t cached_sec = -1;
  thread_local char cached[64];
  const std::int64_t s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (s != cached_sec) {
    const std::time_t t = static_cast<std::time_t>(s);
    std::tm tm{};
    gmtime_r(&t, &tm);
    // strftime's %a/%b follow the C locale, which Weir never changes: English names.
    std::strftime(cached, sizeof cached, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
    cached_sec = s;
  }
  out += cached;
}

void append_rfc3339_now(std::string& out) {
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::time_point_cast<std::chrono::seconds>(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - secs).count();
  // The formatted second is cached per thread: gmtime_r once a second.
  thread_local std::int64_t cached_sec = -1;
  thread_local char cached[32];
  const std::int64_t s = secs.time_since_epoch().count();
  if (s != cached_sec) {
    const std::time_t t = static_cast<std::time_t>(s);
    std::tm tm{};
    gmtime_r(&t, &tm);
    std::strftime(cached, sizeof cached, "%Y-%m-%dT%H:%M:%S", &tm);
    cached_sec = s;
  }
  out += cached;
  fmt::format_to(std::back_inserter(out), ".{:03d}Z", static_cast<int>(ms));
}

}  // namespace weir::core
