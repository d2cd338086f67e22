// Secrets out of captured bodies: the request's own credential (exact), and
// the shapes of keys and tokens (patterns), also when the cap cut them.
#include "requestlog/redact.hpp"

#include <cctype>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/url.hpp"

namespace weir::requestlog {
namespace {

// redact_patterns as it was before stop 57 (one string_end() scan per quote: O(n²) on \"): the reference
// the linear one must agree with, byte for byte.
namespace before57 {

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

}  // namespace before57

std::string exact(std::string text, std::string_view secret, bool truncated = false) {
  redact_exact(text, secret, truncated);
  return text;
}

std::string patterns(std::string text, bool truncated = false) {
  redact_patterns(text, truncated);
  return text;
}

TEST(RedactTest, TheRequestsOwnCredentialEverywhere) {
  const std::string key = "sk-weir-9f8e7d6c5b4a";
  EXPECT_EQ(exact("a " + key + " b " + key, key), "a [REDACTED] b [REDACTED]");
  EXPECT_EQ(exact("nothing here", key), "nothing here");
  // Cut by the cap at the end: a prefix of 4 bytes or more goes.
  EXPECT_EQ(exact("tail sk-weir-9f", key, true), "tail [REDACTED]");
  EXPECT_EQ(exact("tail sk-", key, true), "tail sk-");  // 3 bytes: too short to tell
  EXPECT_EQ(exact("tail sk-weir-9f", key, false), "tail sk-weir-9f");
  EXPECT_EQ(exact("short", "abc"), "short");                                 // secrets under 4 bytes are not searched
  EXPECT_EQ(exact("my key Qz7#pw1 ok", "Qz7#pw1"), "my key [REDACTED] ok");  // a short key Weir accepted
}

TEST(RedactTest, TheCredentialSpelledWithJsonEscapes) {
  const std::string key = "sk-weir-9f8e7d6c5b4a";
  // Every character \u-escaped, one escaped, \/ where a client escaped a slash-free key anyway.
  std::string all;
  for (char c : key) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
    all += buf;
  }
  EXPECT_EQ(exact("{\"content\":\"my key " + all + " ok\"}", key), "{\"content\":\"my key [REDACTED] ok\"}");
  EXPECT_EQ(exact("a \\u0073k-weir-9f8e7d6c5b4a b", key), "a [REDACTED] b");
  EXPECT_EQ(exact("a sk-weir-9f8e7d6c5b\\u0034a b", key), "a [REDACTED] b");
  EXPECT_EQ(exact("a sk-weir-9f8e7d6c5b\\u0034A b", key), "a sk-weir-9f8e7d6c5b\\u0034A b");  // not the key
  const std::string slashy = "abc/def/ghijklmn";
  EXPECT_EQ(exact("x abc\\/def\\/ghijklmn y", slashy), "x [REDACTED] y");
  // Cut by the cap inside an escape or after one: the tail goes.
  EXPECT_EQ(exact("tail \\u0073k-w\\u00", key, true), "tail [REDACTED]");
  EXPECT_EQ(exact("tail \\u0073k-we", key, true), "tail [REDACTED]");
  // Escapes that spell other text, and a backslash at the very end, are left.
  EXPECT_EQ(exact("\\n\\u0041 \\", key), "\\n\\u0041 \\");
}

TEST(RedactTest, KeyShapes) {
  EXPECT_EQ(patterns("use sk-proj-AbCdEfGhIjKlMnOpQrSt now"), "use [REDACTED] now");
  // After a JSON escape (a key pasted on its own line): the escape's letter is no part of the key.
  EXPECT_EQ(patterns("keys:\\nsk-proj-AbCdEfGhIjKlMnOpQrSt\\nthanks"), "keys:\\n[REDACTED]\\nthanks");
  EXPECT_EQ(patterns("tab\\tsk-proj-AbCdEfGhIjKlMnOpQrSt"), "tab\\t[REDACTED]");
  EXPECT_EQ(patterns("auth:\\nBearer abcdefgh12345678xyz"), "auth:\\nBearer [REDACTED]");
  EXPECT_EQ(patterns("x\\u0020sk-proj-AbCdEfGhIjKlMnOpQrSt"), "x\\u0020[REDACTED]");
  EXPECT_EQ(patterns("x\\\\nsk-proj-AbCdEfGhIjKlMnOpQrSt"), "x\\\\nsk-proj-AbCdEfGhIjKlMnOpQrSt");  // \\ then n: a word
  EXPECT_EQ(patterns("sk-ant-api03-AbCdEfGhIjKlMnOpQrSt"), "[REDACTED]");
  EXPECT_EQ(patterns("AKIAIOSFODNN7EXAMPLE and more"), "[REDACTED] and more");
  EXPECT_EQ(patterns("task-proj is fine, sk-short too"), "task-proj is fine, sk-short too");
  EXPECT_EQ(patterns("cut at the end: sk-abc", true), "cut at the end: [REDACTED]");
  EXPECT_EQ(patterns("cut at the end: sk-abc", false), "cut at the end: sk-abc");
}

TEST(RedactTest, TokensAndJwts) {
  EXPECT_EQ(patterns("Authorization: Bearer abc.def-ghi_jkl="), "Authorization: Bearer [REDACTED]");
  EXPECT_EQ(patterns("bearer 12345678"), "bearer [REDACTED]");
  EXPECT_EQ(patterns("the bearer of news"), "the bearer of news");
  EXPECT_EQ(patterns("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig-nature_x ok"), "jwt [REDACTED] ok");
  EXPECT_EQ(patterns("eyJhbGciOiJIUzI1NiJ9.eyJz", true), "[REDACTED]");
  EXPECT_EQ(patterns("eyJust a word"), "eyJust a word");
}

TEST(RedactTest, CredentialLikeJsonMembers) {
  EXPECT_EQ(patterns(R"({"api_key": "abc", "password":"p@ss","model":"m","x-api-key" : "k"})"),
            R"({"api_key": "[REDACTED]", "password":"[REDACTED]","model":"m","x-api-key" : "[REDACTED]"})");
  EXPECT_EQ(patterns(R"({"max_tokens": 5, "prompt_tokens": "7", "access_token": "t"})"),
            R"({"max_tokens": 5, "prompt_tokens": "7", "access_token": "[REDACTED]"})");
  EXPECT_EQ(patterns(R"({"secret": "cut here)", true), R"({"secret": "[REDACTED])");
  // Query-only credential names (core::is_secret_query_param) are no JSON member's: an error's code stays.
  EXPECT_EQ(patterns(R"({"error": {"code": "invalid_api_key"}, "auth": "a", "pwd": "p"})"),
            R"({"error": {"code": "invalid_api_key"}, "auth": "[REDACTED]", "pwd": "[REDACTED]"})");
  EXPECT_EQ(patterns(R"({"content": "has \"quotes\" and sk-live-0123456789abcdefgh"})"),
            R"({"content": "has \"quotes\" and [REDACTED]"})");
}

// Stop 57: every '"' started a scan to its string's end, an escaped one (\") too, and the look for a ':'
// past that end was made again per quote: a body of \" cost O(n²) on the writer thread (260 KB: 12.6 s, every
// other tenant's record dropped behind it). Each shape a body can take costs a bounded number of reads a
// byte: counted (redact_patterns_scanned), not timed.
TEST(RedactTest, PatternsReadEachByteABoundedNumberOfTimes) {
  constexpr std::size_t n = 1 << 20;
  auto times = [](std::size_t k, std::string_view unit) {
    std::string s;
    s.reserve(k * unit.size());
    for (std::size_t i = 0; i < k; ++i) s += unit;
    return s;
  };
  const std::string spaces = times(n / 4, " ");
  const std::vector<std::pair<const char*, std::string>> shapes = {
      {"escaped quotes, unclosed", "\"" + times(n / 2, "\\\"")},
      {"escaped quotes, closed", "\"" + times(n / 2, "\\\"") + "\""},
      {"escaped quotes then whitespace, a colon, whitespace",
       "\"" + times(n / 4, "\\\"") + "\"" + spaces + ":" + spaces + "1"},
      {"a long credential-like name of escaped quotes", "\"" + times(n / 6, "\\\"_key") + "\": 1"},
      {"a long name, its value a string", "\"" + times(n / 6, "\\\"_key") + "\": \"v\""},
      {"quotes", times(n, "\"")},
      {"backslashes", times(n, "\\")},
      {"backslash-quote", times(n / 2, "\\\"")},
      {"double backslash-quote", times(n / 3, "\\\\\"")},
      {"members without values", times(n / 8, "\"x_key\": ")},
      {"nested objects", times(n / 6, "{\"a\": ") + times(n / 6, "}")},
      {"unclosed values", times(n / 8, "\"pwd\":\"")},
      {"escapes after letters", times(n / 4, "a\\nb") + times(n / 6, "\\u0041")},
      {"key-shaped words", times(n / 20, "AKIA") + " " + times(n / 40, "eyJabcdefghij.") + " " +
                               times(n / 40, "Bearer a/") + " " + times(n / 20, "sk-a.")},
  };
  for (const auto& [what, body] : shapes) {
    for (bool truncated : {false, true}) {
      std::string text = body;
      const std::uint64_t before = redact_patterns_scanned();
      redact_patterns(text, truncated);
      const std::uint64_t read = redact_patterns_scanned() - before;
      EXPECT_LE(read, 4 * body.size()) << what << (truncated ? " (truncated)" : "");
    }
  }
}

// The linear pass finds what the quadratic one found, byte for byte: the reference above on random
// JSON-ish text (quotes, escapes, names, separators, key shapes) and on the shapes that cost it most.
TEST(RedactTest, PatternsAgreeWithTheQuadraticPass) {
  const std::vector<std::string_view> pieces = {"\"",
                                                "\"",
                                                "\\",
                                                "\\\"",
                                                ":",
                                                " ",
                                                "  ",
                                                "\n",
                                                "{",
                                                "}",
                                                ",",
                                                "a",
                                                "x",
                                                "_key",
                                                "key",
                                                "api_key",
                                                "password",
                                                "Token",
                                                "accessToken",
                                                "monkey",
                                                "\\n",
                                                "\\u0041",
                                                "\\u00",
                                                "sk-",
                                                "abcdefghijklmnopqrst",
                                                "AKIA",
                                                "IOSFODNN7EXAMPLE",
                                                "eyJ",
                                                "eyJhbGciOiJIUzI1",
                                                ".",
                                                "Bearer ",
                                                "12345678",
                                                "%5F",
                                                "-",
                                                "/"};
  std::mt19937 rng(57);
  for (int round = 0; round < 40000; ++round) {
    std::string text;
    const int k = static_cast<int>(rng() % 24);
    for (int i = 0; i < k; ++i) text += pieces[rng() % pieces.size()];
    for (bool truncated : {false, true}) {
      std::string want = text, got = text;
      before57::redact_patterns(want, truncated);
      redact_patterns(got, truncated);
      ASSERT_EQ(got, want) << "input: " << text << (truncated ? " (truncated)" : "");
    }
  }
  for (std::string text : {std::string("\"a\\\"password\": \"x\""), std::string("{\"a\\\"b\\\"c_key\" :  \"v\"}"),
                           std::string("\"\\\"\\\"\\\"\\\"\"   :\"s\""), std::string("\"x\\\\\"secret\":\"y\"")}) {
    std::string want = text, got = text;
    before57::redact_patterns(want, false);
    redact_patterns(got, false);
    EXPECT_EQ(got, want) << text;
  }
}

}  // namespace
}  // namespace weir::requestlog
