// Secrets out of captured bodies: the request's own credential (exact), and
// the shapes of keys and tokens (patterns), also when the cap cut them.
#include "requestlog/redact.hpp"

#include <cstdio>

#include <gtest/gtest.h>

namespace weir::requestlog {
namespace {

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

}  // namespace
}  // namespace weir::requestlog
