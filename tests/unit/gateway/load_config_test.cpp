// gateway::load_config: the one loader of `weir --check` and start-up
// (issue 8, defect 5). Every section is parsed, errors name file, line and
// key, and warnings flag what is valid but can do nothing.
#include "gateway/load_config.hpp"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace weir::gateway {
namespace {

const char* env(const char* name) { return std::string_view(name) == "KEY_A" ? "sk-a" : nullptr; }

constexpr std::string_view kBase = R"(pools:
  p: {endpoints: ["http://127.0.0.1:9"]}
models:
  m: {pool: p, aliases: [mm]}
  other: {pool: p}
)";

core::ConfigResult<LoadedConfig> load(std::string_view extra) {
  return load_config_text(std::string(kBase) + std::string(extra), "weir.yaml", &env);
}

// Expects an error at `line` (1-based, counting kBase's 5 lines) naming `key`.
void expect_error(std::string_view extra, int line, std::string_view key, std::string_view text = "") {
  auto r = load(extra);
  ASSERT_FALSE(r) << extra;
  EXPECT_EQ(r.error().file, "weir.yaml") << r.error().to_string();
  EXPECT_EQ(r.error().line, line) << r.error().to_string();
  EXPECT_EQ(r.error().key, key) << r.error().to_string();
  if (!text.empty()) {
    EXPECT_NE(r.error().message.find(text), std::string::npos) << r.error().to_string();
  }
}

constexpr std::string_view kSha = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

}  // namespace

TEST(LoadConfig, ParsesEverySectionOnce) {
  auto r = load(fmt::format(R"(tenants:
  acme: {{models: [m], limits: {{requests_per_minute: 60}}}}
auth:
  api_keys:
    - {{id: k1, sha256: {}, tenant: acme}}
    - {{id: k2, key_env: KEY_A, tenant: acme}}
pricing:
  m: {{input: 1.0, output: 2.0}}
redis:
  url: redis://127.0.0.1:6379/0
request_log:
  url: sqlite:/tmp/weir-load-config-test.db
  queue: 128
)",
                            kSha));
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_TRUE(r->auth);
  EXPECT_EQ(r->auth->api_keys.size(), 2u);
  EXPECT_TRUE(r->auth->tenants.count("acme"));
  ASSERT_NE(r->pricing.find("m"), nullptr);
  ASSERT_TRUE(r->redis);
  EXPECT_EQ(r->redis->port, 6379);
  ASSERT_TRUE(r->request_log);
  EXPECT_EQ(r->request_log->path, "/tmp/weir-load-config-test.db");
  EXPECT_EQ(r->request_log->queue, 128u);
  // Only that tenants' /metrics stays on the client port, for want of an admin listener.
  ASSERT_EQ(r->warnings.size(), 1u) << ::testing::PrintToString(r->warnings);
  EXPECT_NE(r->warnings[0].find("GET /metrics on the client port"), std::string::npos) << r->warnings[0];
  EXPECT_EQ(r->config.source, "weir.yaml");
}

TEST(LoadConfig, WithoutIdentitySectionsEveryRequestIsAnonymous) {
  auto r = load("");
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_FALSE(r->auth);
  EXPECT_FALSE(r->redis);
  EXPECT_FALSE(r->request_log);
  EXPECT_TRUE(r->pricing.empty());
  auto p = load("pricing:\n  m: {input: 1}\n");  // pricing alone turns admission on, as before
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_TRUE(p->auth);
}

TEST(LoadConfig, EveryInvalidSectionIsAnErrorWithFileLineAndKey) {
  expect_error("auth:\n  requird: true\n", 7, "auth.requird", "unknown key");
  expect_error("tenants:\n  acme: {priority: high}\n", 7, "tenants.acme.priority", "integer");
  expect_error("tenants:\n  acme: {models: {a: 1}}\n", 7, "tenants.acme.models");
  expect_error(
      fmt::format("tenants:\n  acme: {{}}\nauth:\n  api_keys:\n    - {{id: k, sha256: {}, tenant: ghost}}\n", kSha), 10,
      "auth.api_keys[0].tenant", "ghost");
  expect_error("tenants:\n  acme: {}\nauth:\n  api_keys:\n    - {id: k, sha256: 2c26b46b, tenant: acme}\n", 10,
               "auth.api_keys[0].sha256", "64 hex digits");
  expect_error("tenants:\n  acme: {}\nauth:\n  api_keys:\n    - {id: k, key_env: WEIR_UNSET_KEY, tenant: acme}\n", 10,
               "auth.api_keys[0].key_env", "WEIR_UNSET_KEY");
  expect_error("pricing:\n  m: {input: cheap}\n", 7, "pricing.m.input");
  expect_error("pricing:\n  m: {inptu: 1}\n", 7, "pricing.m.inptu", "unknown key");
  expect_error("pricing: [m]\n", 6, "pricing");
  // redis: alone (no auth, tenants or pricing) was skipped by start-up before.
  expect_error("redis:\n  url: http://127.0.0.1:6379\n", 7, "redis.url", "redis://");
  expect_error("redis:\n  url: redis://user:pw@127.0.0.1:6379\n", 7, "redis.url", "credentials");
  expect_error("redis:\n  url: redis://127.0.0.1\n  fail_opne: true\n", 8, "redis.fail_opne", "unknown key");
  expect_error("auth:\n  redis_keys: true\n", 7, "auth.redis_keys", "redis:");
}

TEST(LoadConfig, KeysNothingReadsAreErrors) {
  expect_error("limits:\n  requests_per_minute: 5\n", 6, "limits", "unknown key");
  expect_error("batching:\n  window: 5ms\n", 6, "batching", "unknown key");
  auto r = load_config_text("pools:\n  p: {endpoints: [\"http://127.0.0.1:9\"]}\nmodels:\n  m: {pool: p, prices: 1}\n",
                            "weir.yaml", &env);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().key, "models.m.prices");
  EXPECT_EQ(r.error().line, 4);
}

TEST(LoadConfig, AllowListEntriesNoModelMatchesAreWarnings) {
  auto r = load(fmt::format(R"(tenants:
  acme: {{models: [m, "oth*", "*", nope, "gpt-*"]}}
  solo: {{models: ghost}}
  alias: {{models: [mm]}}
auth:
  api_keys:
    - {{id: k, sha256: {}, tenant: acme, models: [other, missing]}}
)",
                            kSha));
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_EQ(r->warnings.size(), 6u) << ::testing::PrintToString(r->warnings);  // the last: /metrics (below)
  EXPECT_EQ(r->warnings[0].rfind("weir.yaml:7:", 0), 0u) << r->warnings[0];
  EXPECT_NE(r->warnings[0].find("tenants.acme.models[3]: no configured model or alias matches \"nope\""),
            std::string::npos)
      << r->warnings[0];
  EXPECT_NE(r->warnings[1].find("tenants.acme.models[4]"), std::string::npos) << r->warnings[1];
  EXPECT_NE(r->warnings[2].find("tenants.solo.models: no configured model or alias matches \"ghost\""),
            std::string::npos)
      << r->warnings[2];
  EXPECT_NE(r->warnings[3].find("tenants.alias.models[0]: \"mm\" is an alias of model \"m\""), std::string::npos)
      << r->warnings[3];
  EXPECT_EQ(r->warnings[4].rfind("weir.yaml:12:", 0), 0u) << r->warnings[4];
  EXPECT_NE(r->warnings[4].find("auth.api_keys[0].models[1]"), std::string::npos) << r->warnings[4];
}

TEST(LoadConfig, NoAllowListWarningsWithADefaultPool) {
  auto r = load(
      "default_pool: p\ntenants:\n  anonymous: {models: [anything]}\npricing:\n  anything: {input: 1}\n"
      "server: {metrics: {client_port: true}}\n");
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_TRUE(r->warnings.empty()) << r->warnings.front();
}

// /metrics shows every tenant's spend, budget and traffic: with tenants and an admin listener it is that
// listener's only unless server.metrics.client_port says otherwise; without one it stays, with a warning.
TEST(LoadConfig, TenantsMetricsMoveToTheAdminListener) {
  const std::string admin = fmt::format("admin: {{listen: \"127.0.0.1:9901\", token_sha256: {}}}\n", kSha);
  auto moved = load("tenants:\n  acme: {}\n" + admin);
  ASSERT_TRUE(moved) << moved.error().to_string();
  EXPECT_FALSE(moved->config.server.metrics.client_port);
  EXPECT_TRUE(moved->warnings.empty()) << moved->warnings.front();
  auto kept = load("tenants:\n  acme: {}\nserver: {metrics: {client_port: true}}\n" + admin);
  ASSERT_TRUE(kept) << kept.error().to_string();
  EXPECT_TRUE(kept->config.server.metrics.client_port);
  auto no_tenants = load(admin);
  ASSERT_TRUE(no_tenants) << no_tenants.error().to_string();
  EXPECT_TRUE(no_tenants->config.server.metrics.client_port);
  // (The anonymous tenant: without auth: no other could be named, a warning of its own.)
  auto no_admin = load("tenants:\n  anonymous: {}\n");
  ASSERT_TRUE(no_admin) << no_admin.error().to_string();
  EXPECT_TRUE(no_admin->config.server.metrics.client_port);
  ASSERT_EQ(no_admin->warnings.size(), 1u) << ::testing::PrintToString(no_admin->warnings);
  EXPECT_NE(no_admin->warnings[0].find("weir.yaml:7:3: tenants: GET /metrics on the client port"), std::string::npos)
      << no_admin->warnings[0];
  EXPECT_NE(no_admin->warnings[0].find("admin.listen"), std::string::npos) << no_admin->warnings[0];
  auto said = load("tenants:\n  anonymous: {}\nserver: {metrics: {client_port: true}}\n");
  ASSERT_TRUE(said) << said.error().to_string();
  EXPECT_TRUE(said->warnings.empty()) << said->warnings.front();
}

// A value named through many aliases is one node warned about once per key that names it: 20,000 aliases of an
// unknown model were 20,000 lines. The first three are said, then one line for the rest.
TEST(LoadConfig, AWarningForAValueNamedThroughManyAliasesIsSaidAFewTimes) {
  std::string list = "[&u nope";
  for (int i = 0; i < 999; ++i) list += ", *u";
  auto r = load("tenants:\n  acme: {models: " + list + "]}\n  beta: {models: [*u, ghost]}\n" +
                fmt::format("auth: {{api_keys: [{{id: k, sha256: {}, tenant: acme}}]}}\n", kSha) +
                "server: {metrics: {client_port: true}}\n");
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_EQ(r->warnings.size(), 5u) << ::testing::PrintToString(r->warnings);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r->warnings[i].rfind("weir.yaml:7:", 0), 0u) << r->warnings[i];
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(
        r->warnings[i].find(fmt::format(": tenants.acme.models[{}]: no configured model or alias matches \"nope\"", i)),
        std::string::npos)
        << r->warnings[i];
  EXPECT_NE(r->warnings[3].find(": tenants.acme.models[3]: the same warning as above, here and for 997 more keys that "
                                "name this value through an alias (*name)"),
            std::string::npos)
      << r->warnings[3];
  EXPECT_NE(r->warnings[4].find("tenants.beta.models[1]: no configured model or alias matches \"ghost\""),
            std::string::npos)
      << r->warnings[4];
}

// Tenants no credential can name: a file without auth: (and without the admin API's runtime keys), or with
// auth.required false and no keys, runs every request as the anonymous tenant; said, not refused (a tenant for
// the anonymous requests alone is what such a file means).
TEST(LoadConfig, TenantsNoCredentialCanNameAreAWarning) {
  const auto said = [](const core::ConfigResult<LoadedConfig>& r) {
    EXPECT_TRUE(r) << r.error().to_string();
    return r && std::any_of(r->warnings.begin(), r->warnings.end(), [](const std::string& w) {
             return w.find("every request runs as the anonymous tenant") != std::string::npos;
           });
  };
  const std::string port = "server: {metrics: {client_port: true}}\n";
  auto none = load("tenants:\n  acme: {limits: {requests_per_minute: 2}}\n" + port);
  ASSERT_TRUE(said(none));
  EXPECT_NE(std::find_if(none->warnings.begin(), none->warnings.end(),
                         [](const std::string& w) {
                           return w.find(
                                      "weir.yaml:7:3: tenants: every request runs as the anonymous tenant "
                                      "\"anonymous\": there is no auth: section") != std::string::npos;
                         }),
            none->warnings.end())
      << ::testing::PrintToString(none->warnings);
  EXPECT_TRUE(said(load("tenants:\n  acme: {}\nauth: {required: false}\n" + port)));
  // Named by a key, a JWT claim, Redis keys or the admin API's runtime keys: no warning.
  EXPECT_FALSE(said(
      load(fmt::format(
               "tenants:\n  acme: {{}}\nauth: {{required: false, api_keys: [{{id: k, sha256: {}, tenant: acme}}]}}\n",
               kSha) +
           port)));
  EXPECT_FALSE(said(
      load(fmt::format("tenants:\n  acme: {{}}\nadmin: {{listen: \"127.0.0.1:9901\", token_sha256: {}}}\n", kSha))));
  // The anonymous tenant's own limits (no other tenant): what such a file means.
  EXPECT_FALSE(said(load("tenants:\n  anonymous: {limits: {requests_per_minute: 2}}\n" + port)));
  EXPECT_FALSE(said(load("auth: {required: false, anonymous_tenant: guests}\ntenants:\n  guests: {}\n" + port)));
}

TEST(LoadConfig, PricesForUnknownModelsAreWarnings) {
  auto r = load("pricing:\n  m: {input: 1}\n  \"*\": {input: 1}\n  gone: {input: 1}\n  mm: {input: 1}\n");
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_EQ(r->warnings.size(), 2u) << ::testing::PrintToString(r->warnings);
  EXPECT_NE(r->warnings[0].find("weir.yaml:9:3: pricing.gone: no configured model is named \"gone\""),
            std::string::npos)
      << r->warnings[0];
  EXPECT_NE(r->warnings[1].find("pricing.mm: \"mm\" is an alias of model \"m\""), std::string::npos) << r->warnings[1];
}

TEST(LoadConfig, ARedisSectionNothingUsesIsAWarning) {
  auto r = load("redis:\n  url: redis://127.0.0.1:6379\n");
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_TRUE(r->redis);
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_NE(r->warnings[0].find("weir.yaml:7:3: redis: "), std::string::npos) << r->warnings[0];
}

TEST(LoadConfig, AJwtCheckedForNeitherAudienceNorIssuerIsAWarning) {
  // Any token a shared identity provider's keys signed, for whichever application, was accepted silently.
  const auto count = [](const LoadedConfig& c) {
    return std::count_if(c.warnings.begin(), c.warnings.end(), [](const std::string& w) {
      return w.find("auth.jwt: neither audience nor issuer is set") != std::string::npos &&
             w.find("RFC 8725") != std::string::npos;
    });
  };
  auto bare = load("auth:\n  jwt:\n    jwks_url: https://idp.test/jwks.json\n");
  ASSERT_TRUE(bare) << bare.error().to_string();
  EXPECT_EQ(count(*bare), 1) << ::testing::PrintToString(bare->warnings);
  EXPECT_TRUE(std::any_of(bare->warnings.begin(), bare->warnings.end(), [](const std::string& w) {
    return w.rfind("weir.yaml:8:5: auth.jwt:", 0) == 0;
  })) << ::testing::PrintToString(bare->warnings);
  for (const char* with : {"    audience: weir\n", "    issuer: https://idp.test/\n"}) {
    auto r = load(std::string("auth:\n  jwt:\n    jwks_url: https://idp.test/jwks.json\n") + with);
    ASSERT_TRUE(r) << r.error().to_string();
    EXPECT_EQ(count(*r), 0) << with;
  }
}

TEST(LoadConfig, FilesAndQuickMode) {
  auto missing = load_config(ConfigSource{.file = "/nonexistent/weir.yaml"});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().file, "/nonexistent/weir.yaml");
  auto quick = load_config(ConfigSource{.upstream = "http://127.0.0.1:8000", .listen = "127.0.0.1:0"});
  ASSERT_TRUE(quick) << quick.error().to_string();
  EXPECT_EQ(quick->config.source, "<flags>");
  EXPECT_FALSE(quick->auth);
  EXPECT_TRUE(quick->warnings.empty());
  auto bad = load_config(ConfigSource{.upstream = "http://user:pw@127.0.0.1:8000"});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().key, "--upstream");
}

// TLS contexts are built by the loader: --check refuses a CA file OpenSSL cannot load.
TEST(LoadConfig, TlsContextsAreBuiltAndCheckedHere) {
  const std::string bad = testing::TempDir() + "weir-load-config-bad-ca.pem";
  {
    std::FILE* f = std::fopen(bad.c_str(), "w");
    std::fputs("not a certificate\n", f);
    std::fclose(f);
  }
  auto r = load_config_text(
      "pools:\n  h:\n    endpoints: [https://127.0.0.1:9]\n    tls: {ca_file: " + bad + "}\ndefault_pool: h\n",
      "weir.yaml", &env);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().key, "pools.h.tls");
  EXPECT_EQ(r.error().line, 4);
  EXPECT_NE(r.error().message.find("cannot load ca_file"), std::string::npos) << r.error().to_string();

  auto ok = load_config_text(
      "pools:\n  h:\n    endpoints: [https://127.0.0.1:9]\n    tls: {verify: false}\n"
      "  p:\n    endpoints: [http://127.0.0.1:9]\ndefault_pool: h\n",
      "weir.yaml", &env);
  ASSERT_TRUE(ok) << ok.error().to_string();
  ASSERT_EQ(ok->tls.size(), 2u);
  EXPECT_TRUE(ok->tls[0]);
  EXPECT_FALSE(ok->tls[1]);  // a plain pool has no context
  const auto tls_warnings = std::count_if(ok->warnings.begin(), ok->warnings.end(), [](const std::string& w) {
    return w.find("weir.yaml:4:") != std::string::npos && w.find("pools.h.tls.verify: false") != std::string::npos;
  });
  EXPECT_EQ(tls_warnings, 1);
}

}  // namespace weir::gateway
