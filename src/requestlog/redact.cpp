#include "requestlog/redact.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/text.hpp"
#include "core/url.hpp"

namespace weir::requestlog {

namespace {

bool key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}
bool upper_or_digit(char c) { return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
// Whether s[i] follows a JSON escape sequence that ends in a letter or digit
// (`\n`, `\t`, `\r`, `\b`, `\f`, `\uXXXX`), its backslash itself not escaped.
bool after_escape(std::string_view s, std::size_t i) {
  const auto escaped_at = [&](std::size_t k) {  // s[k] is '\\' and starts an escape (an odd run of them)
    std::size_t n = 0;
    while (k >= n && s[k - n] == '\\') {
      ++n;
      if (k < n) break;
    }
    return n % 2 == 1;
  };
  if (i >= 2 && std::string_view("ntrbf").find(s[i - 1]) != std::string_view::npos && escaped_at(i - 2)) return true;
  if (i >= 6 && s[i - 5] == 'u' && escaped_at(i - 6)) {
    for (std::size_t k = i - 4; k < i; ++k)
      if (!std::isxdigit(static_cast<unsigned char>(s[k]))) return false;
    return true;
  }
  return false;
}

bool token68_char(char c) { return key_char(c) || c == '.' || c == '~' || c == '+' || c == '/' || c == '='; }
bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

std::size_t run(std::string_view s, std::size_t i, bool (*pred)(char)) {
  std::size_t j = i;
  while (j < s.size() && pred(s[j])) ++j;
  return j - i;
}

// Bytes read by string_end and skip_space on this thread (redact_patterns_scanned).
thread_local std::uint64_t t_scanned = 0;

// The end of the JSON string whose opening quote is at `open` (the index of
// its closing quote), or npos when it does not close in `s`.
std::size_t string_end(std::string_view s, std::size_t open) {
  std::size_t j = open + 1;
  for (; j < s.size(); ++j) {
    if (s[j] == '\\') {
      ++j;
      continue;
    }
    if (s[j] == '"') break;
  }
  t_scanned += std::min(j, s.size()) - open;
  return j < s.size() ? j : std::string_view::npos;
}

// The first index from `i` on that is not JSON whitespace.
std::size_t skip_space(std::string_view s, std::size_t i) {
  const std::size_t from = i;
  while (i < s.size() && space(s[i])) ++i;
  t_scanned += i - from;
  return i;
}

// Length of the secret starting at s[i] (a word start), 0 when none.
// `truncated`: the text was cut at its end, so a secret may be cut too.
std::size_t secret_at(std::string_view s, std::size_t i, bool truncated) {
  const std::string_view rest = s.substr(i);
  auto reaches_end = [&](std::size_t len) { return truncated && i + len == s.size(); };
  for (std::string_view p : {std::string_view("sk-"), std::string_view("rk-"), std::string_view("pk-")}) {
    if (!rest.starts_with(p)) continue;
    const std::size_t len = p.size() + run(s, i + p.size(), key_char);
    if (len >= p.size() + 16 || reaches_end(len)) return len;
  }
  if (rest.starts_with("AKIA")) {
    const std::size_t len = 4 + run(s, i + 4, upper_or_digit);
    if (len == 20 || reaches_end(len)) return len;
  }
  if (rest.starts_with("eyJ")) {
    // header.payload.signature, base64url (RFC 7519 §3).
    std::size_t len = run(s, i, key_char);
    if (reaches_end(len)) return len;
    if (len >= 10 && i + len < s.size() && s[i + len] == '.') {
      const std::size_t p2 = run(s, i + len + 1, key_char);
      if (p2 > 0) {
        len += 1 + p2;
        if (reaches_end(len)) return len;
        if (i + len < s.size() && s[i + len] == '.') len += 1 + run(s, i + len + 1, key_char);
        return len;
      }
    }
  }
  return 0;
}

}  // namespace

namespace {

// At t[i]: one character as a JSON string spells it (RFC 8259 §7), decoded
// into `c`: a byte as it is (1), a two-character escape \" \\ \/ \b \f
// \n \r \t (2), or \u00XX for an ASCII character (6). Returns its length
// in `t`, 0 when none starts there (a lone or cut backslash, or \u beyond
// ASCII: secrets are ASCII).
std::size_t unit_at(std::string_view t, std::size_t i, char& c) {
  if (t[i] != '\\') {
    c = t[i];
    return 1;
  }
  if (i + 1 >= t.size()) return 0;
  switch (t[i + 1]) {
    case '"':
    case '\\':
    case '/':
      c = t[i + 1];
      return 2;
    case 'b':
      c = '\b';
      return 2;
    case 'f':
      c = '\f';
      return 2;
    case 'n':
      c = '\n';
      return 2;
    case 'r':
      c = '\r';
      return 2;
    case 't':
      c = '\t';
      return 2;
    case 'u': {
      if (i + 6 > t.size() || t[i + 2] != '0' || t[i + 3] != '0') return 0;
      const int hi = core::hex_value(t[i + 4]), lo = core::hex_value(t[i + 5]);
      if (hi < 0 || lo < 0 || hi > 7) return 0;
      c = static_cast<char>(hi * 16 + lo);
      return 6;
    }
    default:
      return 0;
  }
}

// How `secret` is spelled at t[i], escapes allowed: `matched` secret bytes
// over `len` bytes of `t` (matched == secret.size(): all of it).
struct Spelling {
  std::size_t matched = 0;
  std::size_t len = 0;
};

Spelling spelled_at(std::string_view t, std::size_t i, std::string_view secret) {
  Spelling s;
  while (s.matched < secret.size() && i + s.len < t.size()) {
    char c = 0;
    const std::size_t n = unit_at(t, i + s.len, c);
    if (n == 0 || c != secret[s.matched]) break;
    ++s.matched;
    s.len += n;
  }
  return s;
}

}  // namespace

void redact_exact(std::string& text, std::string_view secret, bool truncated) {
  // (Every credential Weir accepted, however short: it is this tenant's own, wherever it appears.)
  if (secret.size() < 4) return;
  const std::string_view t = text;
  std::string out;
  std::size_t copied = 0;  // t[copied, i) is still to be copied into out
  bool changed = false;
  auto replace = [&](std::size_t from, std::size_t to) {
    if (!changed) out.reserve(t.size());
    out.append(t.substr(copied, from - copied));
    out += kRedacted;
    copied = to;
    changed = true;
  };
  // The secret as it is or JSON-escaped (a client may spell it \u0073k-...
  // or with \/ in a JSON string): tried where its first byte or an escape is.
  for (std::size_t i = 0; i < t.size();) {
    if (t[i] != secret[0] && t[i] != '\\') {
      ++i;
      continue;
    }
    const Spelling s = spelled_at(t, i, secret);
    if (s.matched == secret.size()) {
      replace(i, i + s.len);
      i += s.len;
      continue;
    }
    // Cut by the cap at the very end: a prefix of 4 bytes or more goes.
    const std::size_t stop = i + s.len;
    const bool cut_escape = stop < t.size() && t[stop] == '\\' && t.size() - stop < 6;  // "\u00" at the end
    if (truncated && s.matched >= 4 && (stop == t.size() || cut_escape)) {
      replace(i, t.size());
      break;
    }
    ++i;
  }
  if (!changed) return;
  out.append(t.substr(std::min(copied, t.size())));
  text.swap(out);
}

void redact_patterns(std::string& text, bool truncated) {
  const std::string_view s = text;
  std::string out;
  bool changed = false;
  std::size_t copied = 0;  // s[copied, i) is still to be copied into out
  auto replace = [&](std::size_t from, std::size_t to) {
    out.append(s.substr(copied, from - copied));
    out += kRedacted;
    copied = to;
    changed = true;
  };
  // Every '"' is taken as a string's opening quote, also an escaped one (\") and a closing one. The
  // quotes inside the string last scanned (escaped in it) end where it ends: its scan, and the look past
  // its end for a ':' and a value, are made once, not once per quote (a body of \" costs O(n), not O(n²)).
  constexpr std::size_t npos = std::string_view::npos;
  std::size_t open = npos;   // the string last scanned: its opening quote,
  std::size_t close = npos;  // its closing quote (npos: it does not close),
  std::size_t end = 0;       // close, or s.size() when it does not close,
  bool colon = false;        // whether a ':' follows it (past whitespace),
  std::size_t value = 0;     // and then where the value starts (past whitespace)
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == '"') {
      if (open == npos || i <= open || i >= end) {
        open = i;
        close = string_end(s, i);
        end = close == npos ? s.size() : close;
        colon = false;
        if (close != npos) {
          value = skip_space(s, close + 1);
          if (value < s.size() && s[value] == ':') {
            colon = true;
            value = skip_space(s, value + 1);
          }
        }
      }
      if (close == npos) {
        ++i;  // a string cut by the cap: its text is still scanned below
        continue;
      }
      // A JSON member name followed by ':' and a string value: a credential-like name's value goes.
      // (is_secret_param reads at most the name's last 64 bytes.)
      if (colon && core::is_secret_param(s.substr(i + 1, close - i - 1))) {
        const std::size_t j = value;
        if (j < s.size() && s[j] == '"') {
          const std::size_t vend = string_end(s, j);
          if (vend != npos) {
            if (vend > j + 1) replace(j + 1, vend);
            i = vend + 1;
            continue;
          }
          if (truncated) replace(j + 1, s.size());
          i = s.size();
          continue;
        }
      }
      // Not a credential's name: look inside the string too (a key pasted into a prompt).
      ++i;
      continue;
    }
    // A word starts after a non-key character, or after a JSON escape (`\n`, `\t`, `\r`, `\b`, `\f`, `\/`
    // or `\uXXXX`): in JSON text a key pasted on its own line follows the `n` of a `\n`.
    const bool word_start = i == 0 || !key_char(s[i - 1]) || after_escape(s, i);
    if (word_start) {
      if (const std::size_t len = secret_at(s, i, truncated)) {
        replace(i, i + len);
        i += len;
        continue;
      }
      if (s.size() - i >= 7 && lower(c) == 'b' && lower(s[i + 1]) == 'e' && lower(s[i + 2]) == 'a' &&
          lower(s[i + 3]) == 'r' && lower(s[i + 4]) == 'e' && lower(s[i + 5]) == 'r' && s[i + 6] == ' ') {
        const std::size_t len = run(s, i + 7, token68_char);
        if (len >= 8 || (truncated && i + 7 + len == s.size() && len > 0)) {
          replace(i + 7, i + 7 + len);
          i += 7 + len;
          continue;
        }
      }
    }
    ++i;
  }
  if (!changed) return;
  out.append(s.substr(copied));
  text.swap(out);
}

std::uint64_t redact_patterns_scanned() { return t_scanned; }

}  // namespace weir::requestlog
