#include "core/json_text.hpp"

#include "core/text_writer.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace weir::core {

namespace {

// 0: copied as it is; 1: escaped (quote, backslash, control, DEL); 2:
// starts a non-ASCII sequence, checked.
constexpr std::array<unsigned char, 256> kClass = [] {
  std::array<unsigned char, 256> t{};
  for (int c = 0; c < 0x20; ++c) t[c] = 1;
  t[0x7F] = 1;
  t['"'] = 1;
  t['\\'] = 1;
  for (int c = 0x80; c < 0x100; ++c) t[c] = 2;
  return t;
}();

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// At p[0] (≥ 0x80): the length of the well-formed sequence there
// (`valid` = true), or of the maximal ill-formed subpart to replace by one
// U+FFFD (`valid` = false, length ≥ 1). Unicode §3.9 Table 3-7.
std::size_t utf8_step(const unsigned char* p, std::size_t n, bool& valid) {
  const unsigned char c = p[0];
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0)
      lo = 0xA0;  // no overlongs
    else if (c == 0xED)
      hi = 0x9F;  // no surrogates D800..DFFF
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0)
      lo = 0x90;  // no overlongs
    else if (c == 0xF4)
      hi = 0x8F;  // nothing above U+10FFFF
  } else {
    valid = false;  // a continuation byte, C0, C1, F5..FF
    return 1;
  }
  for (std::size_t k = 1; k <= need; ++k) {
    const bool ok = k < n && (k == 1 ? p[k] >= lo && p[k] <= hi : p[k] >= 0x80 && p[k] <= 0xBF);
    if (!ok) {
      valid = false;
      return k;
    }
  }
  valid = true;
  return need + 1;
}

// Whether a byte of `w` needs the escaper's look (kClass not 0): a control
// byte, '"', '\\', DEL or a non-ASCII one. Eight at once (SWAR: a byte
// below k is found by (w - k×ones) & ~w & highs, exact as a test of the
// whole word when no byte has its high bit set; equality as a zero of w ^ c).
constexpr bool needs_look(std::uint64_t w) {
  constexpr std::uint64_t ones = 0x0101010101010101ULL;
  constexpr std::uint64_t highs = 0x8080808080808080ULL;
  auto has_below = [](std::uint64_t x, std::uint64_t k) { return ((x - ones * k) & ~x & highs) != 0; };
  if (w & highs) return true;
  return has_below(w, 0x20) || has_below(w ^ (ones * '"'), 1) || has_below(w ^ (ones * '\\'), 1) ||
         has_below(w ^ (ones * 0x7F), 1);
}
static_assert(!needs_look(0x4141414141414141ULL) && needs_look(0x4141414122414141ULL) &&
              needs_look(0x414141415C414141ULL) && needs_look(0x4141417F41414141ULL) &&
              needs_look(0x411F414141414141ULL) && needs_look(0x41414141414141C3ULL) &&
              !needs_look(0x7E20212324255B5DULL));

#if defined(__SSE2__)
// The bytes of v that need the escaper's look, as a movemask.
[[gnu::always_inline]] inline unsigned look_mask(__m128i v) {
  const __m128i control = _mm_or_si128(_mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1F)), v),  // v <= 0x1F
                                       _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7F)));
  const __m128i quote_or_backslash =
      _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\')));
  // movemask of v itself: the high bit, a non-ASCII byte.
  return static_cast<unsigned>(_mm_movemask_epi8(_mm_or_si128(control, quote_or_backslash)) | _mm_movemask_epi8(v));
}
#endif

}  // namespace

template <bool kNulAsReplacement>
void TextWriter::put_string(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  if (n - 1 < 16) {
    // 1 to 16 bytes (a method, a model or pool name, most log values): read
    // as two overlapping words (8 to 16 bytes), two overlapping halves (4
    // to 7) or its first, middle and last byte (1 to 3), and written the
    // same way when none needs a look: no loop, no memcpy call.
    std::uint64_t a = 0x4141414141414141ULL;  // 'A' where fewer than 8 bytes fill it
    std::uint64_t b;
    if (n >= 8) {
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + n - 8, 8);
    } else if (n >= 4) {
      std::uint32_t lo;
      std::uint32_t hi;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + n - 4, 4);
      a = lo | (std::uint64_t{hi} << 32);
      b = a;
    } else {
      a = (a & ~0xFFFFFFULL) | p[0] | (std::uint64_t{p[n / 2]} << 8) | (std::uint64_t{p[n - 1]} << 16);
      b = a;
    }
    if (!needs_look(a) && !needs_look(b)) {
      ensure(n + 2);
      *p_++ = '"';
      if (n >= 8) {
        std::memcpy(p_, p, 8);
        std::memcpy(p_ + n - 8, p + n - 8, 8);
      } else if (n >= 4) {
        std::memcpy(p_, p, 4);
        std::memcpy(p_ + n - 4, p + n - 4, 4);
      } else {
        p_[0] = static_cast<char>(p[0]);
        p_[n / 2] = static_cast<char>(p[n / 2]);
        p_[n - 1] = static_cast<char>(p[n - 1]);
      }
      p_ += n;
      *p_++ = '"';
      return;
    }
  }
  // Room for the string as it is and its quotes; each escape or
  // replacement makes room for itself and the rest again (at most 6 bytes
  // per byte; the string grows geometrically, not to 6 × n up front).
  ensure(n + 2);
  *p_++ = '"';
  std::size_t run = 0;  // start of the bytes not yet copied
  std::size_t i = 0;
  auto copy = [&](const void* from, std::size_t len) {
    if (len == 0) return;  // `from` may be null (an empty view): memcpy must not see it
    std::memcpy(p_, from, len);
    p_ += len;
  };
  while (i < n) {
#if defined(__SSE2__)
    // Sixteen bytes a step while none needs a look (a quote, a backslash, a
    // control byte, DEL or a non-ASCII one): most of a log line's text.
    bool hit = false;
    while (i + 16 <= n) {
      const unsigned mask = look_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
      if (mask != 0) {
        i += static_cast<std::size_t>(__builtin_ctz(mask));
        hit = true;
        break;
      }
      i += 16;
    }
    if (!hit && i < n && n >= 16) {
      // Fewer than 16 left: the last 16 bytes in one step, less those before i (seen already).
      const std::size_t from = n - 16;  // < i
      const unsigned mask = look_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + from))) >> (i - from);
      i = mask == 0 ? n : i + static_cast<std::size_t>(__builtin_ctz(mask));
    }
    if (i >= n) break;
#endif
    const unsigned char c = p[i];
    if (kClass[c] == 0) {
      ++i;
      continue;
    }
    copy(s.data() + run, i - run);
    ensure(6 + (n - i) + 1);
    if (kNulAsReplacement && c == 0) {
      copy(kReplacement.data(), kReplacement.size());
      ++i;
    } else if (c < 0x80) {
      *p_++ = '\\';
      switch (c) {
        case '"':
        case '\\':
          *p_++ = static_cast<char>(c);
          break;
        case '\b':
          *p_++ = 'b';
          break;
        case '\f':
          *p_++ = 'f';
          break;
        case '\n':
          *p_++ = 'n';
          break;
        case '\r':
          *p_++ = 'r';
          break;
        case '\t':
          *p_++ = 't';
          break;
        default:
          copy("u00", 3);
          *p_++ = hex[c >> 4];
          *p_++ = hex[c & 15];
      }
      ++i;
    } else {
      bool valid = false;
      const std::size_t len = utf8_step(p + i, n - i, valid);
      if (!valid) {
        copy(kReplacement.data(), kReplacement.size());
      } else if (c == 0xC2 && p[i + 1] <= 0x9F) {
        // A C1 control (U+0080..U+009F, C2 80..C2 9F): escaped as C0's are. A terminal takes U+009B as
        // CSI, so a raw one in a log line would let a client drive the terminal of whoever tails it.
        copy("\\u00", 4);
        *p_++ = hex[p[i + 1] >> 4];
        *p_++ = hex[p[i + 1] & 15];
      } else {
        copy(s.data() + i, len);
      }
      i += len;
    }
    run = i;
  }
  copy(s.data() + run, n - run);
  *p_++ = '"';
}

template void TextWriter::put_string<false>(std::string_view s);
template void TextWriter::put_string<true>(std::string_view s);

void TextWriter::grow(std::size_t n) {
  // Geometric: at least what this writer wrote so far again, so a long
  // text costs amortized O(1) per byte.
  const std::size_t at = static_cast<std::size_t>(p_ - out_.data());
  out_.resize(at + std::max({n, std::size_t{256}, at - base_}));
  p_ = out_.data() + at;
  end_ = out_.data() + out_.size();
}

void TextWriter::put_scaled(std::int64_t v, unsigned decimals) {
  std::uint64_t scale = 1;
  for (unsigned i = 0; i < decimals; ++i) scale *= 10;
  // |v| without overflow at INT64_MIN.
  const std::uint64_t mag = v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  ensure(1 + 20 + 1 + 20);
  if (v < 0) *p_++ = '-';
  p_ = std::to_chars(p_, p_ + 20, mag / scale).ptr;
  if (decimals == 0) return;
  *p_++ = '.';
  std::uint64_t f = mag % scale;
  for (unsigned i = decimals; i > 0; --i) {
    p_[i - 1] = static_cast<char>('0' + f % 10);
    f /= 10;
  }
  p_ += decimals;
}

void append_json_string(std::string& out, std::string_view s) {
  TextWriter w(out, s.size() + 2);
  w.put_json_string(s);
}

std::size_t append_valid_utf8(std::string& out, std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t run = 0;  // start of the bytes not yet copied
  std::size_t i = 0;
  std::size_t replaced = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    bool valid = false;
    const std::size_t len = utf8_step(p + i, s.size() - i, valid);
    if (!valid) {
      out.append(s.substr(run, i - run));
      out += kReplacement;
      run = i + len;
      ++replaced;
    }
    i += len;
  }
  out.append(s.substr(run));
  return replaced;
}

std::size_t append_log_text(std::string& out, std::string_view s) {
  const std::size_t at = out.size();
  const std::size_t replaced = append_valid_utf8(out, s);
  // A NUL is rare (a client's "\u0000"): the common case is one memchr.
  for (std::size_t nul = out.find('\0', at); nul != std::string::npos; nul = out.find('\0', nul + kReplacement.size()))
    out.replace(nul, 1, kReplacement);
  return replaced;
}

std::size_t find_invalid_utf8_from(std::string_view s, std::size_t from) noexcept {
  constexpr std::uint64_t kHighBits = 0x8080808080808080ULL;  // a non-ASCII byte has its high bit set
  const auto word = [](const unsigned char* at) {
    std::uint64_t w;
    std::memcpy(&w, at, 8);
    return w;
  };
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = from;
  for (;;) {
    // ASCII between the non-ASCII runs: a word a step, then the bytes before the next non-ASCII one.
    while (i + 8 <= n && (word(p + i) & kHighBits) == 0) i += 8;
    while (i < n && p[i] < 0x80) ++i;
    if (i == n) return std::string_view::npos;
    // A run of non-ASCII sequences (text in another script), each checked whole.
    do {
      bool valid = false;
      const std::size_t len = utf8_step(p + i, n - i, valid);
      if (!valid) return i;
      i += len;
    } while (i < n && p[i] >= 0x80);
  }
}

std::string_view utf8_prefix(std::string_view s, std::size_t max_bytes) noexcept {
  // Counted as written: each maximal ill-formed subsequence becomes one
  // U+FFFD (3 bytes), so 256 bytes of 0xFF are cut to 85, not echoed as 768.
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t i = 0;
  // ASCII within the cap (a path, a model name: nearly every call) is its
  // own prefix: eight bytes a step until a non-ASCII one, which the loop
  // below then takes from there.
  if (s.size() <= max_bytes) {
    while (i + 8 <= s.size()) {
      std::uint64_t word;
      std::memcpy(&word, p + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    while (i < s.size() && p[i] < 0x80) ++i;
    if (i == s.size()) return s;
  }
  std::size_t written = i;  // ASCII so far: one byte written per byte
  while (i < s.size()) {
    std::size_t len = 1;
    std::size_t w = 1;
    if (p[i] >= 0x80) {
      bool valid = false;
      len = utf8_step(p + i, s.size() - i, valid);
      w = valid ? len : kReplacement.size();
    }
    if (written + w > max_bytes) break;
    i += len;
    written += w;
  }
  return s.substr(0, i);
}

void append_uint(std::string& out, std::uint64_t v) {
  char buf[20];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_int(std::string& out, std::int64_t v) {
  char buf[20];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_scaled(std::string& out, std::int64_t v, unsigned decimals) {
  TextWriter w(out, 42);
  w.put_scaled(v, decimals);
}

std::string quoted_text(std::string_view s, std::size_t max_bytes) {
  const std::string_view head = utf8_prefix(s, max_bytes);
  std::string out;
  append_json_string(out, head);
  if (head.size() < s.size()) out.insert(out.size() - 1, "...");
  return out;
}

std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept {
  if (i >= s.size()) return 0;
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

}  // namespace weir::core
