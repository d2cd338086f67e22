// Writing JSON text by hand on hot paths (access log lines, error bodies,
// response heads) without building a DOM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace weir::core {

// Appends `s` as a JSON string literal to `out`: always valid JSON text
// (RFC 8259 §7 and §8.1: UTF-8), whatever bytes `s` holds. Quote, backslash
// and control characters are escaped (\" \\ \b \f \n \r \t, else \u00XX),
// C0 (U+0000..U+001F), DEL (U+007F) and C1 (U+0080..U+009F) alike: no byte
// of a log line is one a terminal acts on (U+009B is CSI);
// well-formed UTF-8 (Unicode §3.9 Table 3-7: no overlongs, no surrogates
// ED A0..BF, nothing above U+10FFFF) is copied as it is; every maximal
// ill-formed subsequence (a lone continuation byte, a truncated sequence,
// C0/C1, F5..FF, ...) becomes one U+FFFD, as the WHATWG Encoding Standard's
// decoder and Python's errors="replace" count them. Runs of plain ASCII are
// copied in one append.
void append_json_string(std::string& out, std::string_view s);

// Appends `s` to `out` as valid UTF-8 text by append_json_string's rule:
// well-formed sequences as they are, each maximal ill-formed subsequence as
// one U+FFFD. The result is the text append_json_string's literal decodes
// to, so a column stored from it equals the log line's field (the request
// log's model, tenant and key_id); from utf8_prefix(s, max) it is at most
// `max` bytes. Returns the number of U+FFFD written (0: `s` was well-formed
// and was appended as it is).
std::size_t append_valid_utf8(std::string& out, std::string_view s);

// append_valid_utf8's text with each U+0000 (a NUL byte) as U+FFFD: what a
// log line's literal (TextWriter::put_log_string) decodes to, for the
// request log's columns that repeat the line's fields. Returns the number
// of U+FFFD written for ill-formed sequences (NULs not counted).
std::size_t append_log_text(std::string& out, std::string_view s);

// The length of a prefix of `s` that is plain ASCII: s.size() when all of
// `s` is, else an offset at or before its first non-ASCII byte (at most 31
// before it). Where SSE2 is there (every x86-64) 32 bytes a step, one test
// of their high bits, and the tail by one load of the last 16 bytes
// (overlapping, not byte by byte); elsewhere 8 bytes a step
// (`(word & 0x8080808080808080) == 0`). Inline: the relay runs it on every
// SSE event, a few dozen instructions for a 250-byte chunk.
inline std::size_t ascii_prefix(std::string_view s) noexcept {
  const char* p = s.data();
  const std::size_t n = s.size();
  std::size_t i = 0;
#if defined(__SSE2__)
  const auto high = [p](std::size_t at) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at));  // (its sign bits: the non-ASCII bytes)
  };
  if (n >= 16) {
    for (; i + 32 <= n; i += 32)
      if (_mm_movemask_epi8(_mm_or_si128(high(i), high(i + 16))) != 0) return i;
    if (i + 16 <= n) {
      if (_mm_movemask_epi8(high(i)) != 0) return i;
      i += 16;
    }
    // The last bytes: the 16 that end `s`, all but these checked already.
    if (i < n && _mm_movemask_epi8(high(n - 16)) != 0) return n - 16;
    return n;
  }
#endif
  for (; i + 8 <= n; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, p + i, 8);
    if ((word & 0x8080808080808080ULL) != 0) return i;
  }
  while (i < n && static_cast<unsigned char>(p[i]) < 0x80) ++i;
  return i;
}

// find_invalid_utf8() from `from` on, the bytes before it being ASCII: the
// walk of the non-ASCII text (out of line: only text in another script, an
// emoji, or ill-formed bytes come here).
std::size_t find_invalid_utf8_from(std::string_view s, std::size_t from) noexcept;

// The offset of the first byte of `s` that begins a maximal ill-formed UTF-8
// subsequence (append_valid_utf8's rule: Unicode §3.9 Table 3-7, so overlongs
// C0 80 and E0 80 80, surrogates ED A0 80 and anything above U+10FFFF (F4 90,
// F5..FF) are ill-formed, as is a sequence cut short by the end of `s`), or
// npos when all of `s` is well-formed. On every SSE event and answer body an
// upstream sends (the relay's check before its client sees them): plain
// ASCII, most of a chunk's JSON, is passed by ascii_prefix(), and only from
// the first non-ASCII byte on is the text walked, ASCII runs a word at a
// time and non-ASCII bytes one sequence at a time. No allocation.
inline std::size_t find_invalid_utf8(std::string_view s) noexcept {
  const std::size_t ascii = ascii_prefix(s);
  return ascii == s.size() ? std::string_view::npos : find_invalid_utf8_from(s, ascii);
}

// `s` as a JSON string literal (append_json_string), cut to its
// utf8_prefix(s, max_bytes) with "..." before the closing quote when cut:
// text from outside (a name from a file or Redis) shown in a stderr line or
// an error message, with no control byte a terminal acts on and no
// ill-formed UTF-8, and nothing that could end the line early.
std::string quoted_text(std::string_view s, std::size_t max_bytes = 128);

// Appends `v` in decimal (a JSON number), with no format-string parsing:
// the access log's counters on the request path.
void append_uint(std::string& out, std::uint64_t v);
void append_int(std::string& out, std::int64_t v);

// Appends v / 10^decimals with exactly `decimals` fraction digits: a
// quantity kept as an integer in a small unit printed in a larger one (µs
// as ms: append_scaled(out, 1234, 3) → "1.234"; nano-USD as USD with 9
// digits), exact where printing the quotient as a double could round.
// decimals ≤ 18.
void append_scaled(std::string& out, std::int64_t v, unsigned decimals);

// The longest prefix of `s` that never ends inside a UTF-8 sequence and is
// at most `max_bytes` bytes as append_json_string writes it (each maximal
// ill-formed subsequence as one 3-byte U+FFFD; escapes of control characters
// not counted), for capping client-supplied fields in logs and messages.
std::string_view utf8_prefix(std::string_view s, std::size_t max_bytes) noexcept;

// The length of the well-formed UTF-8 sequence at s[i] (Unicode §3.9 Table
// 3-7: no overlongs, no surrogates, nothing above U+10FFFF), 0 when it
// starts an ill-formed one (or i is at the end).
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept;

// Client-supplied fields (path, model, method) are echoed in logs and error
// messages at most this long.
inline constexpr std::size_t kMaxEchoBytes = 256;

}  // namespace weir::core
