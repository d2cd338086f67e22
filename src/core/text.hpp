// ASCII text helpers shared by every module (header names, schemes, tokens).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace weir::core {

inline constexpr char ascii_lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

// The value of one hexadecimal digit (0-9, a-f, A-F), or -1 for any other
// character: percent-encoding (RFC 3986 §2.1), JSON \uXXXX escapes (RFC 8259 §7).
inline constexpr int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// ASCII case-insensitive equality (HTTP field names, RFC 9110 §5.1; auth schemes, §11.1).
constexpr bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  return true;
}

// `s` without leading and trailing spaces and tabs (RFC 9110 §5.6.3 OWS).
// A URL's port as written (RFC 3986 §3.2.3: digits): 1..65535, else 0.
// (Boost.URL's port_number() wraps past 65535: :80800 would be 15264.)
constexpr std::uint16_t url_port(std::string_view digits) noexcept {
  if (digits.empty() || digits.size() > 5) return 0;
  std::uint32_t n = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return 0;
    n = n * 10 + static_cast<std::uint32_t>(c - '0');
  }
  return n > 65535 ? 0 : static_cast<std::uint16_t>(n);
}

constexpr std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The first position of `needle` in `hay`, or npos (as string_view::find).
// Where SSE2 is there (every x86-64) it tests 16 positions per step for two
// of the needle's bytes together and compares only where both match (W.
// Muła's SIMD substring search). The two are its second and second-to-last
// for needles of 4 bytes or more, so that a JSON key's quotes ("usage")
// are not what is tested: about one instruction per byte of an SSE event,
// where glibc's memmem takes several and string_view::find calls memchr
// again at each occurrence of the first byte.
inline std::size_t find_substring(std::string_view hay, std::string_view needle) noexcept {
  const std::size_t n = needle.size();
  if (n == 0) return 0;
  if (hay.size() < n) return std::string_view::npos;
  const std::size_t end = hay.size() - n + 1;  // positions where the needle could start
  std::size_t i = 0;
#if defined(__SSE2__)
  if (n >= 2) {
    const std::size_t p = n >= 4 ? 1 : 0, q = n >= 4 ? n - 2 : n - 1;
    const __m128i at_p = _mm_set1_epi8(needle[p]);
    const __m128i at_q = _mm_set1_epi8(needle[q]);
    // A step tests the 16 positions from `from`: it reads hay[from + p, from + p + 16) and
    // hay[from + q, from + q + 16), inside `hay` while from + 16 <= end.
    auto step = [&](std::size_t from) -> std::size_t {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hay.data() + from + p));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hay.data() + from + q));
      auto mask =
          static_cast<unsigned>(_mm_movemask_epi8(_mm_and_si128(_mm_cmpeq_epi8(a, at_p), _mm_cmpeq_epi8(b, at_q))));
      for (; mask != 0; mask &= mask - 1) {
        const auto at = from + static_cast<std::size_t>(__builtin_ctz(mask));
        if (std::memcmp(hay.data() + at, needle.data(), n) == 0) return at;
      }
      return std::string_view::npos;
    };
    for (; i + 16 <= end; i += 16)
      if (const auto at = step(i); at != std::string_view::npos) return at;
    // The last positions in one step that overlaps the ones already tested (none of which matched), not
    // one by one: an event's last 16 + n bytes cost a step, not ~100 instructions.
    if (i < end && end >= 16) return step(end - 16);
  }
#endif
  for (; i < end; ++i)
    if (hay[i] == needle.front() && std::memcmp(hay.data() + i + 1, needle.data() + 1, n - 1) == 0) return i;
  return std::string_view::npos;
}

// The OpenAI/vLLM end-of-stream sentinel in an SSE event's data: `[DONE]`,
// with trailing spaces or tabs tolerated (the openai SDKs end a stream on
// data that starts with "[DONE]"; an upstream that pads it is still done).
// Every reader of an upstream's stream (relay, translators, batches) asks this.
constexpr bool is_sse_done(std::string_view data) noexcept {
  if (!data.starts_with("[DONE]")) return false;
  for (const char c : data.substr(6))
    if (c != ' ' && c != '\t') return false;
  return true;
}

// True when `body`, outer JSON whitespace aside, begins with '{' and ends
// with '}': the two bytes a JSON object's text must have. A quick check of a
// whole answer (not a parse): it catches an HTML page, an array, a body cut
// short or followed by other bytes, but not every malformed object.
inline bool braced_as_object(std::string_view body) noexcept {
  if (!body.empty() && body.front() == '{' && body.back() == '}') return true;  // (every vLLM answer)
  constexpr std::string_view ws = " \t\r\n";
  if (body.starts_with("\xEF\xBB\xBF")) body.remove_prefix(3);  // a UTF-8 BOM a parser may ignore (RFC 8259 §8.1)
  const std::size_t first = body.find_first_not_of(ws);
  if (first == std::string_view::npos) return false;
  return body[first] == '{' && body[body.find_last_not_of(ws)] == '}';
}

}  // namespace weir::core
