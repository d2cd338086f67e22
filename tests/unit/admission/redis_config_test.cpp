#include "admission/redis_config.hpp"

#include <gtest/gtest.h>

namespace weir::admission {
namespace {

using namespace std::chrono_literals;

core::ConfigResult<std::optional<RedisConfig>> parse(const std::string& yaml, GetEnvFn env = nullptr) {
  return parse_redis_config(YAML::Load(yaml), "weir.yaml", env);
}

TEST(RedisConfigTest, AbsentSectionMeansInProcessLimits) {
  auto r = parse("tenants: {}\n");
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->has_value());
}

TEST(RedisConfigTest, DefaultsFromJustAUrl) {
  auto r = parse("redis:\n  url: redis://10.0.0.5\n");
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_TRUE(r->has_value());
  const RedisConfig& c = **r;
  EXPECT_EQ(c.host, "10.0.0.5");
  EXPECT_EQ(c.port, 6379);
  EXPECT_EQ(c.db, 0);
  EXPECT_TRUE(c.password.empty());
  EXPECT_EQ(c.key_prefix, "weir:");
  EXPECT_TRUE(c.fail_open);
  EXPECT_DOUBLE_EQ(c.fail_open_share, 1.0);
  EXPECT_EQ(c.command_timeout, 250ms);
  EXPECT_EQ(c.sync_interval, 20ms);
  EXPECT_EQ(c.lease_window, 100ms);
  EXPECT_DOUBLE_EQ(c.lease_max_share, 0.05);
  EXPECT_EQ(c.lease_min_tokens, 1024u);
  EXPECT_EQ(c.slot_ttl, 10s);
}

TEST(RedisConfigTest, EveryKey) {
  auto env = [](const char* name) -> const char* {
    return std::string_view(name) == "WEIR_REDIS_PASSWORD" ? "from-env" : nullptr;
  };
  auto r = parse(R"(
redis:
  url: redis://redis.internal:6380/2
  username: weir
  password_env: WEIR_REDIS_PASSWORD
  key_prefix: "prod:weir:"
  fail_open: false
  fail_open_share: 0.25
  connect_timeout: 1s
  command_timeout: 80ms
  reconnect_max: 5s
  sync_interval: 10ms
  budget_sync_interval: 500ms
  lease_window: 250ms
  lease_max_share: 0.1
  lease_min_tokens: 4096
  lease_idle: 3s
  slot_ttl: 30s
)",
                 env);
  ASSERT_TRUE(r) << r.error().to_string();
  const RedisConfig& c = **r;
  EXPECT_EQ(c.host, "redis.internal");
  EXPECT_EQ(c.port, 6380);
  EXPECT_EQ(c.db, 2);
  EXPECT_EQ(c.username, "weir");
  EXPECT_EQ(c.password, "from-env");
  EXPECT_EQ(c.key_prefix, "prod:weir:");
  EXPECT_FALSE(c.fail_open);
  EXPECT_DOUBLE_EQ(c.fail_open_share, 0.25);
  EXPECT_EQ(c.connect_timeout, 1s);
  EXPECT_EQ(c.command_timeout, 80ms);
  EXPECT_EQ(c.reconnect_max, 5s);
  EXPECT_EQ(c.sync_interval, 10ms);
  EXPECT_EQ(c.budget_sync_interval, 500ms);
  EXPECT_EQ(c.lease_window, 250ms);
  EXPECT_DOUBLE_EQ(c.lease_max_share, 0.1);
  EXPECT_EQ(c.lease_min_tokens, 4096u);
  EXPECT_EQ(c.lease_idle, 3s);
  EXPECT_EQ(c.slot_ttl, 30s);
}

TEST(RedisConfigTest, IPv6Host) {
  auto r = parse("redis:\n  url: \"redis://[::1]:7000\"\n");
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ((*r)->host, "::1");
  EXPECT_EQ((*r)->port, 7000);
}

struct Bad {
  const char* yaml;
  const char* key;
  const char* says;
};

TEST(RedisConfigTest, ErrorsNameFileLineAndKey) {
  const Bad cases[] = {
      {"redis:\n  url: http://x\n", "redis.url", "redis://"},
      {"redis:\n  url: rediss://x\n", "redis.url", "TLS"},
      {"redis:\n  url: redis://user:pw@x\n", "redis.url", "credentials"},
      {"redis:\n  url: redis://x/abc\n", "redis.url", "database number"},
      {"redis:\n  url: redis://x:0\n", "redis.url", "port"},
      {"redis:\n  fail_open: true\n", "redis.url", "missing"},
      {"redis:\n  url: redis://x\n  fail_opne: true\n", "redis.fail_opne", ""},
      {"redis:\n  url: redis://x\n  fail_open: maybe\n", "redis.fail_open", "true or false"},
      {"redis:\n  url: redis://x\n  fail_open_share: 0\n", "redis.fail_open_share", "above 0"},
      {"redis:\n  url: redis://x\n  lease_max_share: 1.5\n", "redis.lease_max_share", ""},
      {"redis:\n  url: redis://x\n  command_timeout: soon\n", "redis.command_timeout", "duration"},
      {"redis:\n  url: redis://x\n  sync_interval: 0ms\n", "redis.sync_interval", "at least"},
      {"redis:\n  url: redis://x\n  sync_interval: 1s\n  slot_ttl: 2s\n", "redis.slot_ttl", "3 ×"},
      {"redis:\n  url: redis://x\n  password: a\n  password_env: B\n", "redis", "at most one"},
      {"redis:\n  url: redis://x\n  password_env: WEIR_SURELY_UNSET_VAR\n", "redis.password_env", "not set"},
      {"redis: [a]\n", "redis", "mapping"},
      {"redis:\n  url: redis://x\n  username: weir\n", "redis.username", "needs redis.password"},
      {"redis:\n  url: redis://x\n  username: \"\"\n  password: a\n", "redis.username", "not be empty"},
      {"redis:\n  url: redis://x\n  password: \"\"\n", "redis.password", "not be empty"},
  };
  for (const auto& c : cases) {
    auto r = parse(c.yaml);
    ASSERT_FALSE(r) << c.yaml;
    EXPECT_EQ(r.error().file, "weir.yaml") << c.yaml;
    EXPECT_EQ(r.error().key, c.key) << c.yaml;
    EXPECT_GT(r.error().line, 0) << c.yaml;
    EXPECT_NE(r.error().message.find(c.says), std::string::npos) << c.yaml << " -> " << r.error().message;
  }
}

}  // namespace
}  // namespace weir::admission
