#include "requestlog/redact.hpp"

#include <cstring>

#include "core/url.hpp"

namespace weir::requestlog {

namespace {

bool key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}
bool upper_or_digit(char c) { return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
bool token68_char(char c) { return key_char(c) || c == '.' || c == '~' || c == '+' || c == '/' || c == '='; }
bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

std::size_t run(std::string_view s, std::size_t i, bool (*pred)(char)) {
  std::size_t j = i;
  while (j < s.size() && pred(s[j])) ++j;
  return j - i;
}

// The end of the JSON string whose opening quote is at `open` (the index of
// its closing quote), or npos when it does not close in `s`.
std::size_t string_end(std::string_view s, std::size_t open) {
  for (std::size_t j = open + 1; j < s.size(); ++j) {
    if (s[j] == '\\') {
      ++j;
      continue;
    }
    if (s[j] == '"') return j;
  }
  return std::string_view::npos;
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

void redact_exact(std::string& text, std::string_view secret, bool truncated) {
  if (secret.size() < 8) return;
  std::size_t at = 0;
  while ((at = text.find(secret, at)) != std::string::npos) {
    text.replace(at, secret.size(), kRedacted);
    at += kRedacted.size();
  }
  if (!truncated) return;
  // A prefix of the secret cut by the cap at the very end.
  for (std::size_t n = std::min(secret.size() - 1, text.size()); n >= 4; --n) {
    if (std::string_view(text).substr(text.size() - n) == secret.substr(0, n)) {
      text.replace(text.size() - n, n, kRedacted);
      return;
    }
  }
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
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == '"') {
      // A JSON member name followed by ':' and a string value: a credential-like name's value goes.
      const std::size_t close = string_end(s, i);
      if (close == std::string_view::npos) {
        ++i;  // a string cut by the cap: its text is still scanned below
        continue;
      }
      std::size_t j = close + 1;
      while (j < s.size() && space(s[j])) ++j;
      if (j < s.size() && s[j] == ':' && core::is_secret_param(s.substr(i + 1, close - i - 1))) {
        ++j;
        while (j < s.size() && space(s[j])) ++j;
        if (j < s.size() && s[j] == '"') {
          const std::size_t vend = string_end(s, j);
          if (vend != std::string_view::npos) {
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
    const bool word_start = i == 0 || !key_char(s[i - 1]);
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

}  // namespace weir::requestlog
