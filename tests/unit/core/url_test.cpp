#include "core/url.hpp"

#include <array>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config.hpp"

using weir::core::is_secret_param;
using weir::core::is_secret_query_param;
using weir::core::redact_url;

TEST(RedactUrl, UrlsWithoutSecretsAreUnchanged) {
  for (const char* u :
       {"http://127.0.0.1:8000", "http://localhost:8002/", "https://idp.example.com/.well-known/jwks.json",
        "http://[::1]:8080/", "http://h/?model=llama&n=2", "redis://10.0.0.5:6379/0", "", "not a url", "http://h/?",
        "http://h/?a&b=&c=1"})
    EXPECT_EQ(redact_url(u), u);
}

TEST(RedactUrl, DropsUserinfo) {
  EXPECT_EQ(redact_url("http://user:pass@10.0.0.1:8000/"), "http://10.0.0.1:8000/");
  EXPECT_EQ(redact_url("https://user:pass@idp.example.com/jwks"), "https://idp.example.com/jwks");
  EXPECT_EQ(redact_url("http://token@h"), "http://h");
  EXPECT_EQ(redact_url("http://@h:1"), "http://h:1");
  EXPECT_EQ(redact_url("http://u:p%40ss@h:1"), "http://h:1");
  // An '@' in the password: the userinfo ends at the last one.
  EXPECT_EQ(redact_url("http://u:p@ss@h:1/"), "http://h:1/");
  // An unencoded '/' in the password (not a valid URL, but written): nothing of it is shown.
  EXPECT_EQ(redact_url("http://u:pa/ss@h:1"), "http://h:1");
  // No scheme: the text before the first '/' is the authority.
  EXPECT_EQ(redact_url("user:pass@h:1"), "h:1");
  // An '@' in the query is not userinfo.
  EXPECT_EQ(redact_url("http://h/?to=a@b.c"), "http://h/?to=a@b.c");
}

TEST(RedactUrl, ReplacesCredentialLikeQueryValues) {
  EXPECT_EQ(redact_url("http://h:1/?api_key=SECRET"), "http://h:1/?api_key=REDACTED");
  EXPECT_EQ(redact_url("http://h:1?key=SECRET&model=m&token=T2"), "http://h:1?key=REDACTED&model=m&token=REDACTED");
  EXPECT_EQ(redact_url("http://h/?KEY=a;Signature=b&x=1"), "http://h/?KEY=REDACTED;Signature=REDACTED&x=1");
  EXPECT_EQ(redact_url("http://h/?api%5Fkey=SECRET"), "http://h/?api%5Fkey=REDACTED");
  EXPECT_EQ(redact_url("http://h/?X-Amz-Signature=abc&X-Amz-Date=2026"),
            "http://h/?X-Amz-Signature=REDACTED&X-Amz-Date=2026");
  EXPECT_EQ(redact_url("http://u:p@h/?sig=s#access_token=t"), "http://h/?sig=REDACTED#REDACTED");
  EXPECT_EQ(redact_url("http://h/#"), "http://h/#");
  EXPECT_EQ(redact_url("http://h/?key="), "http://h/?key=");  // nothing to hide
  // A secret in a parameter that is not credential-like stays: the rule is by name.
  EXPECT_EQ(redact_url("http://h/?monkey=1"), "http://h/?monkey=1");
}

TEST(RedactUrl, SecretParamNames) {
  for (const char* n : {"key", "api_key", "api-key", "apikey", "token", "access_token", "sig", "signature", "password",
                        "secret", "passwd", "API_KEY", "Token", "x-api-key", "x_goog_api_key", "client_secret",
                        "refresh_token", "X-Amz-Security-Token", "db.password", "subscription-key", "api%2Dkey",
                        "accessToken", "clientSecret", "privateKey", "apiKey", "x-goog-apiKey", "Authorization",
                        "credentials", "sessionToken", "dbPassword", "Proxy-Authorization", "proxyAuthorization",
                        "x-authorization", "credential", "aws_credentials", "googleCredentials", "Cookie", "set-cookie",
                        // Numbered ones (stop 60: "apikey2" was shown).
                        "apikey2", "key_1", "password-01", "clientSecret2", "x-api-key.3", "token9999"})
    EXPECT_TRUE(is_secret_param(n)) << n;
  for (const char* n :
       {"",         "model",     "monkey",  "keys", "tokenizer", "signed", "n",    "secretary", "k",        "passkey",
        "TOKEN_ID", "maxTokens", "USERKEY", "2",    "_2",        "v2",     "gpt4", "monkey2",   "key12345", "top_k2"})
    EXPECT_FALSE(is_secret_param(n)) << n;
}

// Stop 56: query credentials real providers take that the list missed: Azure Functions' `code`, Firebase's
// `auth`, `pwd`, and their kin. `code`, `pass` and `session` are credentials in a query only: as JSON members
// (captured bodies) they are an error's code, a tool's argument.
TEST(RedactUrl, ProvidersQueryCredentials) {
  EXPECT_EQ(redact_url("http://h:9/api?code=AZ&auth=FB&pwd=PW&api_key=K&region=eu"),
            "http://h:9/api?code=REDACTED&auth=REDACTED&pwd=REDACTED&api_key=REDACTED&region=eu");
  EXPECT_EQ(redact_url("http://h:9/api?apikey2=S&code_1=C&v=1"), "http://h:9/api?apikey2=REDACTED&code_1=REDACTED&v=1");
  for (const char* n : {"code",      "Code",      "pass",         "session",        "auth",     "pwd",
                        "db_pwd",    "dbPwd",     "passphrase",   "ssh_passphrase", "jwt",      "id_jwt",
                        "authkey",   "accesskey", "secretkey",    "privatekey",     "apitoken", "accesstoken",
                        "authtoken", "sessionid", "SessionToken", "x-functions-key"})
    EXPECT_TRUE(is_secret_query_param(n)) << n;
  for (const char* n : {"code", "pass", "session", "country_code", "status_code", "passes", "sessions"})
    EXPECT_FALSE(is_secret_param(n)) << n;
  for (const char* n : {"country_code", "passes", "sessions", "authority", "oauth", "sv", "se", "sp", "region"})
    EXPECT_FALSE(is_secret_query_param(n)) << n;
  // An Azure SAS token: its signature goes, its version, expiry and permissions stay.
  EXPECT_EQ(redact_url("https://a.blob.core.windows.net/c?sv=2022-11-02&se=2027-01-01&sp=r&sig=S%3D"),
            "https://a.blob.core.windows.net/c?sv=2022-11-02&se=2027-01-01&sp=r&sig=REDACTED");
}

TEST(RedactUrl, EndpointsKeepTheirDisplayForm) {
  auto e = weir::core::parse_endpoint_url("http://127.0.0.1:8000/?api_key=SECRET&v=1");
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->display, "http://127.0.0.1:8000/?api_key=REDACTED&v=1");
  auto plain = weir::core::parse_endpoint_url("http://127.0.0.1:8000");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->display, "http://127.0.0.1:8000");
}

// Stop 57: is_secret_param reads only a name's last kSecretParamTail bytes (the request log's redaction
// calls it per quote of a body: a long name was read whole each time). The same answers as reading all of
// it: the check as it was, on random long names made of the lists' own pieces and percent-escapes.
namespace before57 {
constexpr std::array<std::string_view, 28> kNames = {
    "key",       "apikey",    "api_key",      "api-key",       "token",      "access_token", "sig",
    "signature", "password",  "passwd",       "pwd",           "passphrase", "secret",       "auth",
    "jwt",       "authkey",   "accesskey",    "secretkey",     "privatekey", "apitoken",     "accesstoken",
    "authtoken", "sessionid", "sessiontoken", "authorization", "credential", "credentials",  "cookie"};
constexpr std::array<std::string_view, 15> kSuffixes = {
    "key",        "apikey", "token", "sig",           "signature",  "password",    "passwd", "pwd",
    "passphrase", "secret", "jwt",   "authorization", "credential", "credentials", "cookie"};
int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
bool is_secret_param(std::string_view name) {
  std::string decoded;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (c == '%' && i + 2 < name.size() && hex(name[i + 1]) >= 0 && hex(name[i + 2]) >= 0) {
      c = static_cast<char>(hex(name[i + 1]) * 16 + hex(name[i + 2]));
      i += 2;
    } else if (c == '+') {
      c = ' ';
    }
    decoded.push_back(c);
  }
  std::string n = decoded;
  for (char& c : n) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  for (auto s : kNames)
    if (n == s) return true;
  for (auto s : kSuffixes) {
    if (n.size() > s.size() && n.ends_with(s)) {
      const std::size_t at = n.size() - s.size();
      const char sep = n[at - 1];
      if (sep == '-' || sep == '_' || sep == '.') return true;
      const char first = decoded[at], before = decoded[at - 1];
      if (first >= 'A' && first <= 'Z' && !(before >= 'A' && before <= 'Z')) return true;
    }
  }
  return false;
}
}  // namespace before57

TEST(SecretParam, ALongNameReadByItsTailAnswersAsWhole) {
  const std::vector<std::string_view> pieces = {"%",          "%5F",   "%5f", "%2", "5F",  "_",   "-",
                                                ".",          "+",     "a",   "A",  "%4B", "key", "Key",
                                                "Token",      "token", "%%",  "x",  "pwd", "KEY", "Authorization",
                                                "credentials"};
  std::mt19937 rng(57);
  for (int round = 0; round < 100000; ++round) {
    std::string name;
    const std::size_t want = 40 + rng() % 120;
    while (name.size() < want) name += pieces[rng() % pieces.size()];
    ASSERT_EQ(is_secret_param(name), before57::is_secret_param(name)) << name;
  }
  const std::string pad(weir::core::kSecretParamTail * 2, 'x');
  EXPECT_TRUE(is_secret_param(pad + "_key"));
  EXPECT_TRUE(is_secret_param(pad + "%5Fkey"));
  EXPECT_TRUE(is_secret_param(pad + "clientSecret"));
  EXPECT_FALSE(is_secret_param(pad + "monkey"));
  EXPECT_FALSE(is_secret_param(pad.substr(0, 70) + "%2"));
}
