// Byte-exact scans and edits of the top-level JSON object (RFC 8259).
//
// The scanner walks the top-level members only: strings are skipped to
// their closing quote (a backslash escapes the byte after it), nested
// containers by counting brackets outside strings, both sixteen bytes at a
// time with SSE2.
// Nothing is decoded except keys that contain escapes, and nothing allocates.
// The input is trusted to be valid JSON; the scanner still checks the
// top-level structure and never reads out of bounds, so on malformed input it
// returns "not an object" instead of guessing.
#include "api/json_scan.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_set>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/json_text.hpp"
#include "core/text.hpp"

namespace weir::api {
namespace {

constexpr std::size_t npos = std::string_view::npos;

constexpr bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Bytes that matter while skipping a container: quotes and brackets.
constexpr std::array<bool, 256> kStructural = [] {
  std::array<bool, 256> t{};
  for (unsigned char c : {'"', '{', '}', '[', ']'}) t[c] = true;
  return t;
}();

// Bytes that end a number or literal.
constexpr std::array<bool, 256> kScalarEnd = [] {
  std::array<bool, 256> t{};
  for (unsigned char c : {' ', '\n', '\r', '\t', ',', '}', ']'}) t[c] = true;
  return t;
}();

struct RawMember {
  std::size_t key_begin;    // opening quote of the key
  std::size_t key_end;      // one past the closing quote of the key
  std::size_t value_begin;  // first byte of the value
  std::size_t value_end;    // one past the last byte of the value
};

// Where the object's braces are.
struct ObjectShape {
  std::size_t open = 0;   // the '{'
  std::size_t close = 0;  // the '}'
  bool has_members = false;
};

class Scanner {
 public:
  explicit Scanner(std::string_view s) : s_(s) {}

  std::size_t skip_ws(std::size_t i) const {
    while (i < s_.size() && is_ws(s_[i])) ++i;
    return i;
  }

  // `i` is at an opening quote; returns one past the closing quote, or npos.
  // A backslash escapes the byte after it (RFC 8259 §7: \" \\ \/ \b \f \n \r \t
  // \uXXXX all start with one), so a quote right after one does not end the
  // string. Sixteen bytes per step where SSE2 is there, inline: most strings
  // in a response are a few bytes long, where a memchr call costs more than
  // the scan.
  std::size_t string_end(std::size_t i) const {
    const char* const p = s_.data();
    const std::size_t n = s_.size();
    std::size_t j = i + 1;
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i backslash = _mm_set1_epi8('\\');
    while (j + 16 <= n) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j));
      const auto mask = static_cast<unsigned>(
          _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash))));
      if (mask == 0) {
        j += 16;
        continue;
      }
      const std::size_t k = j + static_cast<std::size_t>(__builtin_ctz(mask));
      if (p[k] == '"') return k + 1;
      j = k + 2;  // the escaped byte
    }
#endif
    while (j < n) {
      if (p[j] == '"') return j + 1;
      j += p[j] == '\\' ? 2 : 1;
    }
    return npos;
  }

  // `i` is at the first byte of a value; returns one past its last byte, or npos.
  std::size_t value_end(std::size_t i) const {
    if (i >= s_.size()) return npos;
    const char c = s_[i];
    if (c == '"') return string_end(i);
    if (c == '{' || c == '[') return container_end(i);
    if (!(c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n')) return npos;
    std::size_t j = i + 1;
    while (j < s_.size() && !kScalarEnd[static_cast<unsigned char>(s_[j])]) ++j;
    return j;
  }

  // Calls fn(const RawMember&) for each top-level member in order. Returns
  // false if the text is not one object (optionally surrounded by whitespace).
  template <class Fn>
  bool for_each_member(ObjectShape& shape, Fn&& fn) const {
    const std::size_t n = s_.size();
    std::size_t i = skip_ws(0);
    if (i >= n || s_[i] != '{') return false;
    shape.open = i;
    i = skip_ws(i + 1);
    if (i < n && s_[i] == '}') {
      shape.close = i;
      return skip_ws(i + 1) == n;
    }
    for (;;) {
      RawMember m{};
      if (i >= n || s_[i] != '"') return false;
      m.key_begin = i;
      m.key_end = string_end(i);
      if (m.key_end == npos) return false;
      i = skip_ws(m.key_end);
      if (i >= n || s_[i] != ':') return false;
      m.value_begin = skip_ws(i + 1);
      m.value_end = value_end(m.value_begin);
      if (m.value_end == npos) return false;
      shape.has_members = true;
      fn(m);
      i = skip_ws(m.value_end);
      if (i >= n) return false;
      if (s_[i] == ',') {
        i = skip_ws(i + 1);
        continue;
      }
      if (s_[i] != '}') return false;
      shape.close = i;
      return skip_ws(i + 1) == n;
    }
  }

  // The key's text between its quotes, still escaped.
  std::string_view key_text(const RawMember& m) const {
    return s_.substr(m.key_begin + 1, m.key_end - m.key_begin - 2);
  }

 private:
  std::size_t container_end(std::size_t i) const {
    std::size_t depth = 0;
    std::size_t j = i;
    const std::size_t n = s_.size();
    while (j < n) {
      j = next_structural(j);
      if (j >= n) break;
      switch (s_[j]) {
        case '"':
          j = string_end(j);
          if (j == npos) return npos;
          continue;
        case '{':
        case '[':
          ++depth;
          break;
        default:  // '}' or ']'
          if (--depth == 0) return j + 1;
          break;
      }
      ++j;
    }
    return npos;
  }

  // The first quote or bracket at or after `j`, or s_.size(). Sixteen bytes
  // per step where SSE2 is there (every x86-64): a container's punctuation,
  // numbers and literals between its strings are most of what is skipped.
  std::size_t next_structural(std::size_t j) const {
    const std::size_t n = s_.size();
#if defined(__SSE2__)
    const char* const p = s_.data();
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i open = _mm_set1_epi8('{');   // '[' | 0x20
    const __m128i close = _mm_set1_epi8('}');  // ']' | 0x20
    const __m128i lower = _mm_set1_epi8(0x20);
    while (j + 16 <= n) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j));
      const __m128i folded = _mm_or_si128(v, lower);
      const __m128i hits = _mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                        _mm_or_si128(_mm_cmpeq_epi8(folded, open), _mm_cmpeq_epi8(folded, close)));
      const auto mask = static_cast<unsigned>(_mm_movemask_epi8(hits));
      if (mask != 0) return j + static_cast<std::size_t>(__builtin_ctz(mask));
      j += 16;
    }
#endif
    while (j < n && !kStructural[static_cast<unsigned char>(s_[j])]) ++j;
    return j;
  }

  std::string_view s_;
};

// Reads the 4 hex digits at raw[i..i+4); -1 if malformed.
long hex4(std::string_view raw, std::size_t i) {
  if (i + 4 > raw.size()) return -1;
  long v = 0;
  for (std::size_t k = 0; k < 4; ++k) {
    const int h = core::hex_value(raw[i + k]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

// UTF-8 encoding of a code point; returns its length (1-4).
std::size_t encode_utf8(std::uint32_t cp, char out[4]) {
  if (cp < 0x80) {
    out[0] = static_cast<char>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<char>(0xC0 | (cp >> 6));
    out[1] = static_cast<char>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<char>(0xE0 | (cp >> 12));
    out[1] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<char>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<char>(0xF0 | (cp >> 18));
  out[1] = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<char>(0x80 | (cp & 0x3F));
  return 4;
}

// Compares the escaped text of a JSON string (between its quotes) with an
// unescaped key, decoding escapes on the fly. A lone surrogate matches nothing.
bool escaped_equals(std::string_view raw, std::string_view key) {
  std::size_t i = 0;
  std::size_t k = 0;
  while (i < raw.size()) {
    if (raw[i] != '\\') {
      if (k >= key.size() || key[k] != raw[i]) return false;
      ++i;
      ++k;
      continue;
    }
    if (i + 1 >= raw.size()) return false;
    char buf[4];
    std::size_t len = 1;
    switch (raw[i + 1]) {
      case '"':
        buf[0] = '"';
        break;
      case '\\':
        buf[0] = '\\';
        break;
      case '/':
        buf[0] = '/';
        break;
      case 'b':
        buf[0] = '\b';
        break;
      case 'f':
        buf[0] = '\f';
        break;
      case 'n':
        buf[0] = '\n';
        break;
      case 'r':
        buf[0] = '\r';
        break;
      case 't':
        buf[0] = '\t';
        break;
      case 'u': {
        long cp = hex4(raw, i + 2);
        if (cp < 0) return false;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return false;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (i + 12 > raw.size() || raw[i + 6] != '\\' || raw[i + 7] != 'u') return false;
          const long lo = hex4(raw, i + 8);
          if (lo < 0xDC00 || lo > 0xDFFF) return false;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          i += 6;
        }
        len = encode_utf8(static_cast<std::uint32_t>(cp), buf);
        i += 4;
        break;
      }
      default:
        return false;
    }
    i += 2;
    if (key.size() - k < len || std::memcmp(key.data() + k, buf, len) != 0) return false;
    k += len;
  }
  return k == key.size();
}

bool key_equals(std::string_view raw, std::string_view key) {
  // An escape makes the raw key longer than what it decodes to: a raw key
  // shorter than `key` never matches, one as long only byte for byte and
  // without an escape (`key` itself must then have no backslash).
  if (raw.size() < key.size()) return false;
  if (raw.size() == key.size()) return raw == key && key.find('\\') == std::string_view::npos;
  if (std::memchr(raw.data(), '\\', raw.size()) == nullptr) return false;
  return escaped_equals(raw, key);
}

// Walks a JSON text backward: from one past a value's last byte to its
// first. In valid JSON a quote outside a string is a closing one, and inside
// a string every quote is escaped (an odd run of backslashes before it).
class ReverseScanner {
 public:
  explicit ReverseScanner(std::string_view s) : s_(s) {}

  std::size_t skip_ws(std::size_t end) const {
    while (end > 0 && is_ws(s_[end - 1])) --end;
    return end;
  }

  // `close` is a string's closing quote: its opening quote, or npos.
  std::size_t string_begin(std::size_t close) const {
    const char* const base = s_.data();
    std::size_t k = close;
    while (k > 0) {
      const void* q = ::memrchr(base, '"', k);
      if (q == nullptr) return npos;
      k = static_cast<std::size_t>(static_cast<const char*>(q) - base);
      std::size_t backslashes = 0;
      while (k - backslashes > 0 && base[k - backslashes - 1] == '\\') ++backslashes;
      if (backslashes % 2 == 0) return k;
    }
    return npos;
  }

  // `end` is one past a value's last byte: its first byte, or npos.
  std::size_t value_begin(std::size_t end) const {
    if (end == 0) return npos;
    const char c = s_[end - 1];
    if (c == '"') return string_begin(end - 1);
    if (c == '}' || c == ']') {
      std::size_t depth = 0;
      for (std::size_t j = end - 1;; --j) {
        const char d = s_[j];
        if (d == '"') {
          j = string_begin(j);
          if (j == npos) return npos;
        } else if (d == '}' || d == ']') {
          ++depth;
        } else if (d == '{' || d == '[') {
          if (--depth == 0) return j;
        }
        if (j == 0) return npos;
      }
    }
    std::size_t j = end - 1;  // a number or literal: back to what precedes it
    while (j > 0 && !is_ws(s_[j - 1]) && s_[j - 1] != ':' && s_[j - 1] != ',' && s_[j - 1] != '[') --j;
    return j;
  }

 private:
  std::string_view s_;
};

}  // namespace

std::optional<MemberSpan> find_member(std::string_view json, std::string_view key) {
  const Scanner scan(json);
  ObjectShape shape;
  std::optional<MemberSpan> found;
  const bool ok = scan.for_each_member(shape, [&](const RawMember& m) {
    if (key_equals(scan.key_text(m), key)) found = MemberSpan{m.key_begin, m.value_begin, m.value_end};
  });
  if (!ok) return std::nullopt;
  return found;
}

std::optional<MemberSpan> find_last_member(std::string_view json, std::string_view key) {
  const ReverseScanner rs(json);
  const Scanner scan(json);
  const std::size_t open = scan.skip_ws(0);
  const std::size_t end = rs.skip_ws(json.size());
  if (open >= json.size() || json[open] != '{' || end <= open + 1 || json[end - 1] != '}') return std::nullopt;
  std::size_t delim = end - 1;  // the '}' or ',' after the member being read
  for (;;) {
    const std::size_t value_end = rs.skip_ws(delim);
    if (value_end <= open + 1) return std::nullopt;  // no (more) members
    const std::size_t value_begin = rs.value_begin(value_end);
    if (value_begin == npos || value_begin <= open) return std::nullopt;
    std::size_t k = rs.skip_ws(value_begin);
    if (k <= open + 1 || json[k - 1] != ':') return std::nullopt;
    k = rs.skip_ws(k - 1);
    if (k <= open + 1 || json[k - 1] != '"') return std::nullopt;
    const std::size_t key_begin = rs.string_begin(k - 1);
    if (key_begin == npos || key_begin <= open) return std::nullopt;
    if (key_equals(json.substr(key_begin + 1, k - key_begin - 2), key))
      return MemberSpan{key_begin, value_begin, value_end};
    const std::size_t before = rs.skip_ws(key_begin);
    if (before <= open + 1 || json[before - 1] != ',') return std::nullopt;  // the first member: not found
    delim = before - 1;
  }
}

std::optional<std::string> repeated_member(std::string_view json, std::size_t distinct) {
  const Scanner sc(json);
  ObjectShape shape;
  std::size_t members = 0;
  if (!sc.for_each_member(shape, [&](const RawMember&) { ++members; })) return std::nullopt;
  if (distinct != 0 && members == distinct) return std::nullopt;
  // Some name repeats (or the count is unknown): the names, decoded.
  std::unordered_set<std::string> names;
  names.reserve(members);
  std::optional<std::string> found;
  (void)sc.for_each_member(shape, [&](const RawMember& m) {
    if (found) return;
    const std::string_view raw = sc.key_text(m);
    std::string name;
    if (raw.find('\\') == std::string_view::npos) {
      name.assign(raw);
    } else {
      boost::system::error_code ec;
      const auto v = boost::json::parse(json.substr(m.key_begin, m.key_end - m.key_begin), ec);
      if (ec || !v.is_string()) return;  // (not valid JSON: the parse that validates says so)
      name.assign(v.get_string().data(), v.get_string().size());
    }
    if (!names.insert(name).second) found = std::move(name);
  });
  return found;
}

bool find_members(std::string_view json, std::span<const std::string_view> keys,
                  std::span<std::optional<MemberSpan>> found) {
  const Scanner scan(json);
  ObjectShape shape;
  for (auto& f : found) f.reset();
  return scan.for_each_member(shape, [&](const RawMember& m) {
    // Whether the member's key has an escape, looked up once for all `keys`:
    // without one it equals a key byte for byte or not at all.
    const std::string_view k = scan.key_text(m);
    const bool escaped = std::memchr(k.data(), '\\', k.size()) != nullptr;
    for (std::size_t i = 0; i < keys.size() && i < found.size(); ++i) {
      if (escaped ? escaped_equals(k, keys[i]) : k == keys[i])
        found[i] = MemberSpan{m.key_begin, m.value_begin, m.value_end};
    }
  });
}

bool members_known_or_off(std::string_view json, std::span<const std::string_view> keys) {
  const Scanner scan(json);
  ObjectShape shape;
  bool all = true;
  const bool object = scan.for_each_member(shape, [&](const RawMember& m) {
    if (!all) return;
    const std::string_view v = json.substr(m.value_begin, m.value_end - m.value_begin);
    if (v == "null" || v == "false") return;
    const std::string_view k = scan.key_text(m);
    if (std::memchr(k.data(), '\\', k.size()) == nullptr) {
      all = std::binary_search(keys.begin(), keys.end(), k);
    } else {
      all = std::any_of(keys.begin(), keys.end(), [&](std::string_view key) { return escaped_equals(k, key); });
    }
  });
  return object && all;
}

std::optional<ValueSpan> first_element(std::string_view json) {
  const Scanner scan(json);
  std::size_t i = scan.skip_ws(0);
  if (i >= json.size() || json[i] != '[') return std::nullopt;
  i = scan.skip_ws(i + 1);
  if (i >= json.size() || json[i] == ']') return std::nullopt;
  const std::size_t end = scan.value_end(i);
  if (end == npos) return std::nullopt;
  return ValueSpan{i, end};
}

bool set_member(std::string_view json, std::string_view key, std::string_view value_json, std::string& out) {
  const Scanner scan(json);
  ObjectShape shape;
  std::optional<MemberSpan> found;
  std::size_t matches = 0;
  const bool ok = scan.for_each_member(shape, [&](const RawMember& m) {
    if (!key_equals(scan.key_text(m), key)) return;
    found = MemberSpan{m.key_begin, m.value_begin, m.value_end};
    ++matches;
  });
  if (!ok) return false;
  if (matches > 1) {
    // The earlier copies go too: an upstream whose parser keeps the first
    // duplicate would otherwise read the client's value, not the one set.
    std::string rest;
    (void)remove_member(json, key, rest);
    return set_member(rest, key, value_json, out);
  }
  out.clear();
  if (found) {
    out.reserve(json.size() - (found->value_end - found->value_begin) + value_json.size());
    out.append(json.substr(0, found->value_begin));
    out.append(value_json);
    out.append(json.substr(found->value_end));
    return true;
  }
  out.reserve(json.size() + key.size() + value_json.size() + 8);
  out.append(json.substr(0, shape.open + 1));
  core::append_json_string(out, key);  // the one escaper: valid JSON for any bytes
  out.push_back(':');
  out.append(value_json);
  if (shape.has_members) out.push_back(',');
  out.append(json.substr(shape.open + 1));
  return true;
}

bool remove_member(std::string_view json, std::string_view key, std::string& out) {
  const Scanner scan(json);
  ObjectShape shape;
  std::size_t matches = 0;
  if (!scan.for_each_member(shape, [&](const RawMember& m) { matches += key_equals(scan.key_text(m), key); })) {
    return false;
  }
  out.clear();
  if (matches == 0) {
    out.assign(json);
    return true;
  }
  // Kept members are copied with the separator that followed them in the
  // input (", " with whatever whitespace the sender used) when another kept
  // member comes after; the text after the last member (whitespace and '}')
  // closes the output. Removing every member leaves "{" + that text.
  out.reserve(json.size());
  bool first = true;
  bool have_kept = false;
  bool want_sep_end = false;
  std::size_t kept_value_end = 0;  // value_end of the last kept member
  std::size_t sep_end = 0;         // key_begin of the member after the last kept one
  std::size_t last_value_end = 0;  // value_end of the last member seen
  scan.for_each_member(shape, [&](const RawMember& m) {
    if (first) {
      out.append(json.substr(0, m.key_begin));
      first = false;
    }
    if (want_sep_end) {
      sep_end = m.key_begin;
      want_sep_end = false;
    }
    if (!key_equals(scan.key_text(m), key)) {
      if (have_kept) out.append(json.substr(kept_value_end, sep_end - kept_value_end));
      out.append(json.substr(m.key_begin, m.value_end - m.key_begin));
      have_kept = true;
      kept_value_end = m.value_end;
      want_sep_end = true;
    }
    last_value_end = m.value_end;
  });
  out.append(json.substr(last_value_end));
  return true;
}

namespace {

// `text` with each lone surrogate escape as \ufffd; false when it has none.
bool replace_lone_surrogates(std::string_view text, std::string& out) {
  bool changed = false;
  out.clear();
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (text[i] != '\\' || i + 1 >= text.size()) {
      out += text[i++];
      continue;
    }
    if (text[i + 1] != 'u') {  // another escape: both bytes as they are (an escaped backslash is no \u)
      out.append(text.substr(i, 2));
      i += 2;
      continue;
    }
    const long h = hex4(text, i + 2);
    if (h >= 0xD800 && h <= 0xDBFF) {
      const long l = i + 7 < text.size() && text[i + 6] == '\\' && text[i + 7] == 'u' ? hex4(text, i + 8) : -1;
      if (l >= 0xDC00 && l <= 0xDFFF) {
        out.append(text.substr(i, 12));  // a pair
        i += 12;
        continue;
      }
    }
    if (h >= 0xD800 && h <= 0xDFFF) {
      out += "\\ufffd";
      changed = true;
      i += 6;
      continue;
    }
    out.append(text.substr(i, 2));
    i += 2;
  }
  return changed;
}

}  // namespace

boost::json::value parse_upstream_json(std::string_view text, boost::system::error_code& ec,
                                       boost::json::storage_ptr sp, const boost::json::parse_options& opt) {
  boost::json::value v = boost::json::parse(boost::json::string_view(text.data(), text.size()), ec, sp, opt);
  if (!ec) return v;
  std::string fixed;
  if (!replace_lone_surrogates(text, fixed)) return v;  // some other fault: its error stands
  ec = {};
  return boost::json::parse(boost::json::string_view(fixed.data(), fixed.size()), ec, sp, opt);
}

}  // namespace weir::api
