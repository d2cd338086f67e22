#include "core/time.hpp"

#include <ctime>
#include <iterator>

#include <fmt/format.h>

namespace weir::core {

namespace {
// The UTC second `s` formatted by strftime(`fmt`), cached: gmtime_r and
// strftime run once a second per thread and call site (each keeps its own).
template <std::size_t N>
struct SecondCache {
  std::int64_t sec = -1;
  char text[N];
  const char* get(std::int64_t s, const char* fmt) {
    if (s != sec) {
      const std::time_t t = static_cast<std::time_t>(s);
      std::tm tm{};
      gmtime_r(&t, &tm);
      // strftime's %a/%b follow the C locale, which Weir never changes: English names.
      std::strftime(text, sizeof text, fmt, &tm);
      sec = s;
    }
    return text;
  }
};
}  // namespace

void append_http_date(std::string& out) {
  thread_local SecondCache<64> cache;
  const std::int64_t s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  out += cache.get(s, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n");
}

void append_rfc3339_now(std::string& out) { append_rfc3339(out, std::chrono::system_clock::now()); }

void append_rfc3339(std::string& out, std::chrono::system_clock::time_point now) {
  const auto secs = std::chrono::time_point_cast<std::chrono::seconds>(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - secs).count();
  thread_local SecondCache<32> cache;
  out += cache.get(secs.time_since_epoch().count(), "%Y-%m-%dT%H:%M:%S");
  fmt::format_to(std::back_inserter(out), ".{:03d}Z", static_cast<int>(ms));
}

}  // namespace weir::core
