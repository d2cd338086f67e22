#include "auth/config.hpp"

#include <gtest/gtest.h>

#include "auth/redis_keys.hpp"

namespace weir::auth {
namespace {

using namespace std::chrono_literals;

const char* env(const char* name) {
  const std::string_view n(name);
  return n == "KEY_A" ? "sk-a" : n == "KEY_JWS" ? "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.c2ln" : nullptr;
}

core::ConfigResult<AuthConfig> parse(const std::string& yaml) {
  return parse_auth_config(YAML::Load(yaml), "weir.yaml", &env);
}

// Expects a parse error at `line` naming `key`.
void expect_error(const std::string& yaml, int line, std::string_view key, std::string_view text = "") {
  auto r = parse(yaml);
  ASSERT_FALSE(r) << yaml;
  EXPECT_EQ(r.error().file, "weir.yaml");
  EXPECT_EQ(r.error().line, line) << r.error().to_string();
  EXPECT_EQ(r.error().key, key) << r.error().to_string();
  if (!text.empty()) {
    EXPECT_NE(r.error().message.find(text), std::string::npos) << r.error().to_string();
  }
}

TEST(AuthConfig, ParsesEverySection) {
  auto r = parse(R"(
tenants:
  acme:
    models: [gpt-4o-mini, "meta-llama/*"]
    priority: 10
    tier: pro
    limits: {requests_per_minute: 600, tokens_per_minute: 100000, max_concurrent_streams: 20, tokens_burst: 20000}
    budget: {usd: 250.5, period: 720h}
  free:
auth:
  required: true
  jwt:
    jwks_url: https://idp.example.com/.well-known/jwks.json
    issuer: https://idp.example.com/
    audience: weir
    tenant_claim: org.id
    leeway: 30s
    refresh_interval: 10m
    min_refetch_interval: 15s
  api_keys:
    - id: acme-prod
      sha256: 2C26B46B68FFC68FF99B453C1D30413413422D706483BFA0F98A5E886266E7AE
      tenant: acme
      models: [gpt-4o-mini]
      limits: {requests_per_minute: 60}
      budget: {usd: 10}
    - id: a-env
      key_env: KEY_A
      tenant: free
)");
  ASSERT_TRUE(r) << r.error().to_string();
  const AuthConfig& c = *r;
  EXPECT_TRUE(c.required);
  ASSERT_EQ(c.tenants.size(), 3u);  // + the implicit anonymous tenant
  const auto& acme = c.tenants.at("acme");
  EXPECT_EQ(acme.models.size(), 2u);
  EXPECT_EQ(acme.priority, 10);
  EXPECT_EQ(acme.limits.requests_per_minute, 600u);
  EXPECT_EQ(acme.limits.tokens_burst, 20000u);
  EXPECT_EQ(acme.limits.max_concurrent_streams, 20u);
  EXPECT_EQ(acme.budget.limit_nano_usd, 250'500'000'000);
  EXPECT_EQ(acme.budget.period, 720h);
  EXPECT_TRUE(c.tenants.count("anonymous"));
  ASSERT_TRUE(c.jwt);
  EXPECT_EQ(c.jwt->audiences, std::vector<std::string>{"weir"});
  EXPECT_EQ(c.jwt->tenant_claim, "org.id");
  EXPECT_EQ(c.jwt->leeway, 30s);
  EXPECT_EQ(c.jwt->refresh_interval, 10min);
  EXPECT_EQ(c.jwt->min_refetch_interval, 15s);
  ASSERT_EQ(c.api_keys.size(), 2u);
  EXPECT_EQ(to_hex(c.api_keys[0].sha256), "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae");
  EXPECT_EQ(c.api_keys[1].sha256, sha256("sk-a"));
  ASSERT_TRUE(c.api_keys[0].models);
  EXPECT_EQ(c.api_keys[0].budget.limit_nano_usd, 10'000'000'000);
}

TEST(AuthConfig, NoAuthSectionMeansAnonymous) {
  auto r = parse("tenants: {}\n");
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->required);
  EXPECT_FALSE(r->jwt);
}

TEST(AuthConfig, ABudgetOfZeroIsABudgetNotItsAbsence) {
  auto r = parse("tenants:\n  frozen:\n    budget: {usd: 0}\n  open: {}\n");
  ASSERT_TRUE(r);
  const auto& frozen = r->tenants.at("frozen").budget;
  EXPECT_TRUE(frozen.any());
  EXPECT_EQ(frozen.limit_nano_usd, 0);
  EXPECT_FALSE(r->tenants.at("open").budget.any());
  // A positive cap under the nano-USD resolution would round to a frozen scope in silence: refused.
  expect_error("tenants:\n  tiny:\n    budget: {usd: 0.0000000001}\n", 3, "tenants.tiny.budget.usd", "resolution");
}

TEST(AuthConfig, ErrorsNameLineAndKey) {
  expect_error("auth:\n  requird: true\n", 2, "auth.requird", "unknown key");
  expect_error("auth:\n  required: maybe\n", 2, "auth.required");
  expect_error("tenants:\n  a:\n    limits:\n      requests_per_minute: -5\n", 4,
               "tenants.a.limits.requests_per_minute", "out of range");
  expect_error("tenants:\n  a:\n    limits: {rpm: 5}\n", 3, "tenants.a.limits.rpm");
  expect_error("tenants:\n  a:\n    budget: {period: 1h}\n", 3, "tenants.a.budget.usd");
  expect_error("tenants:\n  a:\n    priority: 500\n", 3, "tenants.a.priority");
  expect_error("tenants:\n  a: {}\nauth:\n  api_keys:\n    - id: k\n      sha256: abc\n      tenant: a\n", 6,
               "auth.api_keys[0].sha256", "64 hex");
  expect_error("tenants:\n  a: {}\nauth:\n  api_keys:\n    - id: k\n      key_env: NOPE\n      tenant: a\n", 6,
               "auth.api_keys[0].key_env", "NOPE");
  expect_error("tenants:\n  a: {}\nauth:\n  api_keys:\n    - id: k\n      key_env: KEY_A\n      tenant: b\n", 7,
               "auth.api_keys[0].tenant", "not defined");
  expect_error("tenants:\n  a: {}\nauth:\n  api_keys:\n    - id: k\n      tenant: a\n", 5, "auth.api_keys[0]",
               "exactly one of sha256 and key_env");
  expect_error(
      "tenants:\n  a: {}\nauth:\n  api_keys:\n    - {id: k, key_env: KEY_A, tenant: a}\n"
      "    - {id: k, sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae, tenant: a}\n",
      6, "auth.api_keys[1].id", "duplicate");
  expect_error(
      "tenants:\n  a: {}\nauth:\n  api_keys:\n    - {id: k, key_env: KEY_A, tenant: a}\n"
      "    - {id: j, key_env: KEY_A, tenant: a}\n",
      6, "auth.api_keys[1]", "twice");
  expect_error("auth:\n  jwt:\n    issuer: x\n", 3, "auth.jwt", "exactly one of jwks_url and jwks_file");
  expect_error("auth:\n  jwt:\n    jwks_url: ftp://x/jwks\n", 3, "auth.jwt.jwks_url", "http");
  expect_error("auth:\n  jwt:\n    jwks_file: /k.json\n    leeway: 5 parsecs\n", 4, "auth.jwt.leeway");
  expect_error("auth:\n  jwt:\n    jwks_file: /k.json\n    default_tenant: ghost\n", 4, "auth.jwt.default_tenant");
  expect_error("auth:\n  jwt:\n    jwks_file: /k.json\n    audience: {a: 1}\n", 4, "auth.jwt.audience");
  // Empty would switch the claim's check off.
  expect_error("auth:\n  jwt:\n    jwks_file: /k.json\n    audience: []\n", 4, "auth.jwt.audience", "empty");
  expect_error("auth:\n  jwt:\n    jwks_file: /k.json\n    audience: ''\n", 4, "auth.jwt.audience", "empty");
  expect_error("auth:\n  jwt:\n    jwks_file: /k.json\n    issuer: ''\n", 4, "auth.jwt.issuer", "empty");
  expect_error("tenants: [a, b]\n", 1, "tenants");
  // A key with a JWT's shape is verified as a JWT once auth.jwt is on: it could never authenticate.
  expect_error(
      "tenants:\n  a: {}\nauth:\n  jwt:\n    jwks_file: /k.json\n  api_keys:\n"
      "    - {id: k, key_env: KEY_JWS, tenant: a}\n",
      7, "auth.api_keys[0].key_env", "JWT's shape");
  EXPECT_TRUE(parse("tenants:\n  a: {}\nauth:\n  api_keys:\n    - {id: k, key_env: KEY_JWS, tenant: a}\n"));
}

TEST(AuthConfig, JwksUrlRefusesCredentialsWithoutEchoingThem) {
  auto r = parse("auth:\n  jwt:\n    jwks_url: https://user:hunter2@idp.example.com/jwks.json\n");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().line, 3) << r.error().to_string();
  EXPECT_EQ(r.error().key, "auth.jwt.jwks_url");
  const auto s = r.error().to_string();
  EXPECT_NE(s.find("credentials"), std::string::npos) << s;
  EXPECT_NE(s.find("https://idp.example.com/jwks.json"), std::string::npos) << s;
  EXPECT_EQ(s.find("hunter2"), std::string::npos) << s;
  auto bad = parse("auth:\n  jwt:\n    jwks_url: \"http://u:hunter2@idp example/?key=SECRET\"\n");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().to_string().find("hunter2"), std::string::npos) << bad.error().to_string();
  EXPECT_EQ(bad.error().to_string().find("SECRET"), std::string::npos) << bad.error().to_string();
  // A query is allowed (it is sent, and shown redacted).
  EXPECT_TRUE(parse("auth:\n  jwt:\n    jwks_url: https://idp.example.com/jwks?key=abc\n"));
}

TEST(CalendarConfig, PeriodWordsAndTheOffset) {
  auto r = parse(R"(
auth:
  required: false
  budget_utc_offset: "-08:00"
tenants:
  a: {budget: {usd: 100, period: day}}
  b: {budget: {usd: 100, period: Week}}
  c: {budget: {usd: 100, period: MONTH}}
  d: {budget: {usd: 100, period: 720h}}
)");
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->budget_utc_offset_s, -28800);
  EXPECT_EQ(r->tenants.at("a").budget.calendar, core::CalendarPeriod::day);
  EXPECT_EQ(r->tenants.at("a").budget.utc_offset_s, -28800);
  EXPECT_EQ(r->tenants.at("a").budget.period.count(), 0);
  EXPECT_TRUE(r->tenants.at("a").budget.resets());
  EXPECT_EQ(r->tenants.at("b").budget.calendar, core::CalendarPeriod::week);
  EXPECT_EQ(r->tenants.at("c").budget.calendar, core::CalendarPeriod::month);
  EXPECT_EQ(r->tenants.at("d").budget.calendar, core::CalendarPeriod::none);
  EXPECT_EQ(r->tenants.at("d").budget.period, 720h);
  // Unquoted -08:00 and Z are read as the same text.
  auto u = parse("auth:\n  budget_utc_offset: -08:00\ntenants:\n  a: {budget: {usd: 1, period: day}}\n");
  ASSERT_TRUE(u) << u.error().to_string();
  EXPECT_EQ(u->tenants.at("a").budget.utc_offset_s, -28800);
  auto z = parse("auth:\n  budget_utc_offset: Z\ntenants:\n  a: {budget: {usd: 1, period: day}}\n");
  ASSERT_TRUE(z);
  EXPECT_EQ(z->budget_utc_offset_s, 0);
  // Without the setting: UTC.
  auto plain = parse("tenants:\n  a: {budget: {usd: 1, period: month}}\n");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->tenants.at("a").budget.utc_offset_s, 0);
  // Keys' budgets take it too.
  auto k = parse(
      "auth:\n  budget_utc_offset: \"+05:30\"\n  api_keys:\n    - id: k\n      sha256: "
      "0000000000000000000000000000000000000000000000000000000000000000\n      tenant: a\n      budget: {usd: 1, "
      "period: week}\ntenants:\n  a: {}\n");
  ASSERT_TRUE(k) << k.error().to_string();
  EXPECT_EQ(k->api_keys[0].budget.calendar, core::CalendarPeriod::week);
  EXPECT_EQ(k->api_keys[0].budget.utc_offset_s, 19800);
}

TEST(CalendarConfig, BadValuesAreClearErrors) {
  auto bad = parse("tenants:\n  a:\n    budget: {usd: 1, period: fortnight}\n");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().key, "tenants.a.budget.period");
  EXPECT_EQ(bad.error().file, "weir.yaml");
  EXPECT_EQ(bad.error().line, 3);
  EXPECT_NE(bad.error().message.find("day, week, month"), std::string::npos) << bad.error().to_string();
  auto days = parse("tenants:\n  a:\n    budget: {usd: 1, period: days}\n");
  ASSERT_FALSE(days);
  EXPECT_EQ(days.error().key, "tenants.a.budget.period");
  for (const char* off : {"Europe/Paris", "+5:30", "+15:00", "UTC", "[1]"}) {
    auto e = parse(std::string("auth:\n  budget_utc_offset: ") + off + "\n");
    ASSERT_FALSE(e) << off;
    EXPECT_EQ(e.error().key, "auth.budget_utc_offset") << off;
    EXPECT_EQ(e.error().line, 2) << off;
    EXPECT_NE(e.error().message.find("+HH:MM"), std::string::npos) << e.error().to_string();
  }
}

}  // namespace
}  // namespace weir::auth

namespace weir::auth {
namespace {

// Stop 56: the one reading of a record's models field, the lookup's and the admin listing's.
TEST(RedisKeyModels, SplitAtCommasTrimmedEmptyItemsDropped) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_key_models("a,b"), (V{"a", "b"}));
  EXPECT_EQ(split_key_models(" a ,\tb, ,"), (V{"a", "b"}));
  EXPECT_EQ(split_key_models("zzz,m"), (V{"zzz", "m"}));
  EXPECT_EQ(split_key_models(","), V{});  // no list: the tenant's
  EXPECT_EQ(split_key_models(" "), V{});
  EXPECT_EQ(split_key_models(""), V{});
  EXPECT_EQ(split_key_models("meta-llama/*"), V{"meta-llama/*"});
}

}  // namespace
}  // namespace weir::auth
