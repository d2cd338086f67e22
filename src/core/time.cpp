#include "core/time.hpp"

#include "core/text_writer.hpp"

#include <algorithm>
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

void put_rfc3339(TextWriter& w, std::chrono::system_clock::time_point now) {
  const auto secs = std::chrono::time_point_cast<std::chrono::seconds>(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - secs).count();
  thread_local SecondCache<32> cache;
  w.put(std::string_view(cache.get(secs.time_since_epoch().count(), "%Y-%m-%dT%H:%M:%S")));
  const char frac[5] = {'.', static_cast<char>('0' + ms / 100), static_cast<char>('0' + ms / 10 % 10),
                        static_cast<char>('0' + ms % 10), 'Z'};
  w.put(std::string_view(frac, sizeof frac));
}

void append_rfc3339(std::string& out, std::chrono::system_clock::time_point now) {
  TextWriter w(out, 24);
  put_rfc3339(w, now);
}

std::string format_rfc3339(std::int64_t unix_s) {
  const std::chrono::sys_seconds t{std::chrono::seconds(unix_s)};
  const auto day = std::chrono::floor<std::chrono::days>(t);
  const std::chrono::year_month_day ymd{day};
  const std::chrono::hh_mm_ss hms{t - day};
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()), hms.hours().count(),
                     hms.minutes().count(), hms.seconds().count());
}

bool ends_utc_month(std::int64_t unix_s) {
  const std::chrono::sys_seconds next{std::chrono::seconds(unix_s + 1)};
  const auto day = std::chrono::floor<std::chrono::days>(next);
  return next == day && std::chrono::year_month_day{day}.day() == std::chrono::day(1);
}

bool parse_rfc3339(std::string_view s, std::int64_t& unix_s, RoundSeconds round) {
  // date-time = full-date "T" partial-time time-offset (RFC 3339 §5.6)
  auto digits = [&](std::size_t at, std::size_t n, int& out) {
    if (at + n > s.size()) return false;
    out = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      out = out * 10 + (s[i] - '0');
    }
    return true;
  };
  int y, mo, d, h, mi, sec;
  if (s.size() < 20 || !digits(0, 4, y) || s[4] != '-' || !digits(5, 2, mo) || s[7] != '-' || !digits(8, 2, d) ||
      (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || !digits(11, 2, h) || s[13] != ':' || !digits(14, 2, mi) ||
      s[16] != ':' || !digits(17, 2, sec))
    return false;
  std::size_t i = 19;
  bool fraction = false;  // a nonzero fraction of a second
  if (i < s.size() && s[i] == '.') {
    ++i;
    const std::size_t start = i;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) fraction = fraction || s[i] != '0';
    if (i == start) return false;
  }
  int offset_s = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    int oh, om;
    if (!digits(i + 1, 2, oh) || i + 3 >= s.size() || s[i + 3] != ':' || !digits(i + 4, 2, om) || oh > 23 || om > 59)
      return false;
    offset_s = (s[i] == '-' ? -1 : 1) * (oh * 3600 + om * 60);
    i += 6;
  } else {
    return false;
  }
  if (i != s.size()) return false;
  const std::chrono::year_month_day ymd{std::chrono::year(y), std::chrono::month(static_cast<unsigned>(mo)),
                                        std::chrono::day(static_cast<unsigned>(d))};
  if (!ymd.ok() || h > 23 || mi > 59 || sec > 60) return false;
  const auto days = std::chrono::sys_days(ymd).time_since_epoch().count();
  const std::int64_t t = static_cast<std::int64_t>(days) * 86400 + h * 3600 + mi * 60 + std::min(sec, 59) - offset_s;
  if (sec == 60) {
    // Only after 23:59:59 UTC on a month's last day (an offset moves the
    // local minute, e.g. 2016-12-31T18:59:60-05:00).
    if (!ends_utc_month(t)) return false;
    unix_s = round == RoundSeconds::up ? t + 1 : t;  // 23:59:60.x is after :59 and before 00:00:00
    return true;
  }
  unix_s = round == RoundSeconds::up && fraction ? t + 1 : t;
  return true;
}

}  // namespace weir::core
