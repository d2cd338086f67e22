// pydantic's lax int: the integer a JSON string holds (lax_int.hpp).
#include "api/lax_int.hpp"

#include <cstddef>
#include <limits>

namespace weir::api {

namespace {

// The length of the Unicode White_Space character `s` starts with (Rust's
// char::is_whitespace, which pydantic-core's str::trim applies), 0 for none.
std::size_t white_space_at(std::string_view s) {
  if (s.empty()) return 0;
  const auto b = [&](std::size_t i) { return i < s.size() ? static_cast<unsigned char>(s[i]) : 0u; };
  const unsigned c = b(0);
  if ((c >= 0x09 && c <= 0x0d) || c == 0x20) return 1;
  if (c == 0xc2 && (b(1) == 0x85 || b(1) == 0xa0)) return 2;  // U+0085, U+00A0
  if (c == 0xe1 && b(1) == 0x9a && b(2) == 0x80) return 3;    // U+1680
  if (c == 0xe2 && b(1) == 0x80 && ((b(2) >= 0x80 && b(2) <= 0x8a) || b(2) == 0xa8 || b(2) == 0xa9 || b(2) == 0xaf))
    return 3;                                               // U+2000..U+200A, U+2028, U+2029, U+202F
  if (c == 0xe2 && b(1) == 0x81 && b(2) == 0x9f) return 3;  // U+205F
  if (c == 0xe3 && b(1) == 0x80 && b(2) == 0x80) return 3;  // U+3000
  return 0;
}

// The same for the character `s` ends with.
std::size_t white_space_before_end(std::string_view s) {
  for (std::size_t n = 1; n <= 3 && n <= s.size(); ++n)
    if (white_space_at(s.substr(s.size() - n)) == n) return n;
  return 0;
}

}  // namespace

std::optional<std::int64_t> lax_int(std::string_view text) {
  while (const std::size_t n = white_space_at(text)) text.remove_prefix(n);
  while (const std::size_t n = white_space_before_end(text)) text.remove_suffix(n);
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  // ".0", ".000": a fraction of zeros only (not "3.", not "3.0_0").
  if (const auto dot = text.find('.'); dot != std::string_view::npos) {
    const std::string_view frac = text.substr(dot + 1);
    if (frac.empty() || frac.find_first_not_of('0') != std::string_view::npos) return std::nullopt;
    text = text.substr(0, dot);
  }
  // Digits, with single underscores between them.
  if (text.empty() || text.front() == '_' || text.back() == '_') return std::nullopt;
  constexpr std::uint64_t kLimit = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1;
  std::uint64_t v = 0;
  char prev = 0;
  for (const char c : text) {
    if (c == '_') {
      if (prev == '_') return std::nullopt;
    } else if (c >= '0' && c <= '9') {
      v = v > (kLimit - static_cast<std::uint64_t>(c - '0')) / 10 ? kLimit
                                                                  : v * 10 + static_cast<std::uint64_t>(c - '0');
    } else {
      return std::nullopt;
    }
    prev = c;
  }
  if (negative) return v >= kLimit ? std::numeric_limits<std::int64_t>::min() : -static_cast<std::int64_t>(v);
  return v >= kLimit ? std::numeric_limits<std::int64_t>::max() : static_cast<std::int64_t>(v);
}

}  // namespace weir::api
