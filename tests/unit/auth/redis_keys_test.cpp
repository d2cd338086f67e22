// Virtual keys stored in Redis: configuration, the per-worker cache, and the
// whole authenticate -> wait once -> authenticate flow against a real
// redis-server on a free port (found, unknown, revoked, deleted, bad tenant,
// invalid record, coalescing, outage, restart, stop), plus the tenant's
// admission scope governing a Redis key.
#include "auth/redis_keys.hpp"

#include <future>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>

#include "../store/redis_server.hpp"
#include "admission/admission.hpp"
#include "admission/local_limiter.hpp"
#include "auth/config.hpp"

namespace weir::auth {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using Status = KeyLookup::Status;

constexpr std::string_view kConfigKey = "sk-config-0123456789abcdef";

// ---------------------------------------------------------------- configuration

core::ConfigResult<AuthConfig> parse(const std::string& yaml) {
  return parse_auth_config(YAML::Load(yaml), "weir.yaml");
}

TEST(RedisKeysConfig, DefaultsOffAndParsesTtls) {
  auto off = parse("tenants: {a: }\nauth: {required: true}\n");
  ASSERT_TRUE(off) << off.error().to_string();
  EXPECT_FALSE(off->redis_keys);
  EXPECT_EQ(off->key_cache_ttl, 30s);
  EXPECT_EQ(off->key_negative_ttl, 5s);
  EXPECT_EQ(off->key_cache_entries, 4096u);
  EXPECT_EQ(off->key_stale_ttl, 0ms);  // serving stale is the operator's choice: off unless set

  auto on = parse(R"(
tenants: {a: }
redis: {url: "redis://127.0.0.1:6379"}
auth:
  redis_keys: true
  key_cache_ttl: 10s
  key_negative_ttl: 500ms
  key_cache_entries: 64
  key_stale_ttl: 5m
)");
  ASSERT_TRUE(on) << on.error().to_string();
  EXPECT_TRUE(on->redis_keys);
  EXPECT_EQ(on->key_cache_ttl, 10s);
  EXPECT_EQ(on->key_negative_ttl, 500ms);
  EXPECT_EQ(on->key_cache_entries, 64u);
  EXPECT_EQ(on->key_stale_ttl, 5min);
}

TEST(RedisKeysConfig, RedisKeysNeedARedisSection) {
  auto r = parse("tenants: {a: }\nauth:\n  required: true\n  redis_keys: true\n");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().file, "weir.yaml");
  EXPECT_EQ(r.error().line, 4) << r.error().to_string();
  EXPECT_EQ(r.error().key, "auth.redis_keys");
  EXPECT_NE(r.error().message.find("redis:"), std::string::npos) << r.error().to_string();
  // Off without a redis: section is fine.
  EXPECT_TRUE(parse("auth:\n  redis_keys: false\n"));
}

TEST(RedisKeysConfig, RejectsBadValues) {
  auto tiny = parse("redis: {url: x}\nauth:\n  key_cache_ttl: 10ms\n");
  ASSERT_FALSE(tiny);
  EXPECT_EQ(tiny.error().key, "auth.key_cache_ttl");
  EXPECT_EQ(tiny.error().line, 3);
  auto neg = parse("auth:\n  key_negative_ttl: nope\n");
  ASSERT_FALSE(neg);
  EXPECT_EQ(neg.error().key, "auth.key_negative_ttl");
  auto stale = parse("auth:\n  key_stale_ttl: -1s\n");
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().key, "auth.key_stale_ttl");
  auto entries = parse("auth:\n  key_cache_entries: 2\n");
  ASSERT_FALSE(entries);
  EXPECT_EQ(entries.error().key, "auth.key_cache_entries");
  auto flag = parse("auth:\n  redis_keys: maybe\n");
  ASSERT_FALSE(flag);
  EXPECT_EQ(flag.error().key, "auth.redis_keys");
  auto typo = parse("auth:\n  redis_key: true\n");
  ASSERT_FALSE(typo);
  EXPECT_NE(typo.error().to_string().find("redis_key"), std::string::npos);
}

// ---------------------------------------------------------------- the per-worker cache

Sha256Digest digest_of(std::string_view key) { return sha256(key); }

PrincipalPtr dummy_principal() { return std::make_shared<Principal>(); }

TEST(RedisKeyCache, FindsUntilExpiryAndNotBeforeInsertion) {
  RedisKeyCache c(16);
  const WallTime t0 = WallClock::now();
  const auto d = digest_of("sk-a");
  EXPECT_EQ(c.find(d, t0), nullptr);
  auto p = dummy_principal();
  c.insert(d, RedisKeyCache::State::found, p, nullptr, t0, 1000ms);
  const auto* e = c.find(d, t0 + 999ms);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->state, RedisKeyCache::State::found);
  EXPECT_EQ(e->principal, p);
  EXPECT_EQ(c.find(d, t0 - 1s), nullptr);  // a clock stepped back does not stretch the TTL: dropped
  EXPECT_EQ(c.find(d, t0 + 500ms), nullptr);
  c.insert(d, RedisKeyCache::State::unknown, nullptr, nullptr, t0, 1000ms);
  EXPECT_EQ(c.find(d, t0 + 1000ms), nullptr);  // expires at inserted + ttl exactly
  EXPECT_EQ(c.size(t0), 0u);
  EXPECT_EQ(p.use_count(), 1);  // the expired entry released its principal
}

TEST(RedisKeyCache, AnExpiredFoundKeyIsServedStaleOnlyWithinItsCapAndNeverARefusal) {
  RedisKeyCache c(16);
  const WallTime t0 = WallClock::now();
  const auto d = digest_of("sk-a"), never = digest_of("sk-never"), refused = digest_of("sk-refused");
  auto p = dummy_principal();
  c.insert(d, RedisKeyCache::State::found, p, nullptr, t0, 1000ms, 5000ms);
  c.insert(refused, RedisKeyCache::State::unknown, nullptr, nullptr, t0, 1000ms, 5000ms);
  EXPECT_FALSE(c.find(d, t0 + 999ms)->stale);
  EXPECT_EQ(c.find(d, t0 + 1000ms), nullptr);          // past its TTL: looked up again ...
  EXPECT_EQ(p.use_count(), 2);                         // ... but kept
  EXPECT_TRUE(c.serve_stale(d, t0 + 1000ms, 1000ms));  // Redis did not answer
  const auto* e = c.find(d, t0 + 1999ms);
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(e->stale);
  EXPECT_EQ(e->principal, p);
  EXPECT_EQ(c.find(d, t0 + 2000ms), nullptr);
  // Revived at most until inserted + ttl + stale_ttl.
  EXPECT_TRUE(c.serve_stale(d, t0 + 5500ms, 1000ms));
  EXPECT_NE(c.find(d, t0 + 5999ms), nullptr);
  EXPECT_EQ(c.find(d, t0 + 6000ms), nullptr);
  EXPECT_FALSE(c.serve_stale(d, t0 + 6000ms, 1000ms));
  EXPECT_EQ(p.use_count(), 1);  // past the cap: dropped
  // A key never found, or refused, is never revived.
  EXPECT_FALSE(c.serve_stale(never, t0 + 1500ms, 1000ms));
  EXPECT_FALSE(c.serve_stale(refused, t0 + 1500ms, 1000ms));
  // A fresh answer replaces a stale entry and ends its staleness.
  c.insert(d, RedisKeyCache::State::found, p, nullptr, t0 + 10s, 1000ms, 5000ms);
  ASSERT_TRUE(c.serve_stale(d, t0 + 11s, 1000ms));
  c.insert(d, RedisKeyCache::State::found, p, nullptr, t0 + 11s, 1000ms, 5000ms);
  EXPECT_FALSE(c.find(d, t0 + 11s)->stale);
  // Without a stale_ttl (fail_open off) an expired found key is dropped at its TTL.
  c.insert(d, RedisKeyCache::State::found, p, nullptr, t0 + 20s, 1000ms);
  EXPECT_EQ(c.find(d, t0 + 21s), nullptr);
  EXPECT_FALSE(c.serve_stale(d, t0 + 21s, 1000ms));
}

TEST(RedisKeyCache, StaysBoundedAndSparesFoundKeysFromRefusals) {
  RedisKeyCache c(4);  // one set of four ways
  ASSERT_EQ(c.capacity(), 4u);
  const WallTime t0 = WallClock::now();
  std::vector<Sha256Digest> found;
  for (int i = 0; i < 3; ++i) {
    found.push_back(digest_of("sk-found-" + std::to_string(i)));
    c.insert(found.back(), RedisKeyCache::State::found, dummy_principal(), nullptr, t0, 60s);
  }
  // A flood of garbage keys cycles through the one way the found keys leave.
  for (int i = 0; i < 100; ++i)
    c.insert(digest_of("sk-garbage-" + std::to_string(i)), RedisKeyCache::State::unknown, nullptr, nullptr, t0, 5s);
  EXPECT_EQ(c.size(t0), 4u);
  for (const auto& d : found) EXPECT_NE(c.find(d, t0), nullptr);
  EXPECT_NE(c.find(digest_of("sk-garbage-99"), t0), nullptr);
  // A fourth found key takes the refusal's way; a fifth evicts the least recently used found key.
  const auto d4 = digest_of("sk-found-3"), d5 = digest_of("sk-found-4");
  c.insert(d4, RedisKeyCache::State::found, dummy_principal(), nullptr, t0, 60s);
  EXPECT_EQ(c.find(digest_of("sk-garbage-99"), t0), nullptr);
  EXPECT_NE(c.find(found[1], t0), nullptr);  // touch: found[0] is now the LRU
  EXPECT_NE(c.find(found[2], t0), nullptr);
  EXPECT_NE(c.find(d4, t0), nullptr);
  c.insert(d5, RedisKeyCache::State::found, dummy_principal(), nullptr, t0, 60s);
  EXPECT_EQ(c.find(found[0], t0), nullptr);
  EXPECT_NE(c.find(d5, t0), nullptr);
  // All four ways found: a refusal must still be cached (evicting the LRU), or its key would be looked up forever.
  c.insert(digest_of("sk-garbage-x"), RedisKeyCache::State::unknown, nullptr, nullptr, t0, 5s);
  EXPECT_NE(c.find(digest_of("sk-garbage-x"), t0), nullptr);
  EXPECT_EQ(c.size(t0), 4u);
}

TEST(RedisKeyCache, ManySetsHoldManyKeys) {
  RedisKeyCache c(1000);
  EXPECT_EQ(c.capacity(), 1024u);
  const WallTime t0 = WallClock::now();
  for (int i = 0; i < 5000; ++i)
    c.insert(digest_of("k" + std::to_string(i)), RedisKeyCache::State::unknown, nullptr, nullptr, t0, 5s);
  // Bounded, and (nearly) every way in use: the seeded set index spreads keys. Not exactly all: with a
  // random seed a set gets fewer than 4 of the 5,000 keys about once in 800 runs (Poisson, mean 19.5).
  EXPECT_LE(c.size(t0), 1024u);
  EXPECT_GE(c.size(t0), 1016u);
  int hits = 0;
  for (int i = 4000; i < 5000; ++i) hits += c.find(digest_of("k" + std::to_string(i)), t0) != nullptr;
  EXPECT_GT(hits, 500);  // the most recent keys mostly survive
}

// ---------------------------------------------------------------- against a real Redis

std::string policy_yaml(std::string_view extra_auth = "") {
  return fmt::format(R"(
tenants:
  acme:
    models: [gpt-4o-mini, "meta-llama/*"]
    tier: pro
    limits: {{requests_per_minute: 2}}
  beta:
    tier: free
redis:
  url: redis://127.0.0.1:1
auth:
  required: true
  redis_keys: true
  key_cache_ttl: 30s
  key_negative_ttl: 5s
  api_keys:
    - id: config-key
      sha256: {}
      tenant: beta
{}
)",
                     to_hex(sha256(kConfigKey)), extra_auth);
}

std::shared_ptr<const AuthPolicy> make_policy(std::string_view extra_auth = "") {
  auto cfg = parse_auth_config(YAML::Load(policy_yaml(extra_auth)), "test.yaml");
  EXPECT_TRUE(cfg) << cfg.error().to_string();
  return AuthPolicy::build(std::move(*cfg));
}

class RedisKeysTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new testing::RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(server_->ok()) << "redis-server did not start (scripts/setup installs it)";
    if (!server_->ping()) {  // a test before this one killed it
      ASSERT_TRUE(server_->start());
    }
    control_thread_ = std::thread([this] { control_.run(); });
    admin_ = std::make_unique<store::Client>(control_, client_options());
    on_control([&] { admin_->start(); });
    ASSERT_TRUE(wait_admin_up());
    ASSERT_TRUE(cmd({"FLUSHALL"}));
  }

  void TearDown() override {
    if (keys_) on_control([&] { keys_->stop(); });
    if (admin_) on_control([&] { admin_->stop(); });
    guard_.reset();
    control_thread_.join();
    keys_.reset();  // after the control io_context stopped: lookups in flight point at it
    admin_.reset();
    std::lock_guard lk(log_mu_);
    for (const auto& line : log_) {
      for (const auto& secret : secrets_) {
        EXPECT_EQ(line.find(secret), std::string::npos) << "a key or its hash reached the log: " << line;
        EXPECT_EQ(line.find(to_hex(sha256(secret))), std::string::npos) << "a key hash reached the log: " << line;
      }
    }
  }

  store::ClientOptions client_options(std::chrono::milliseconds command_timeout = 300ms) const {
    store::ClientOptions o;
    o.port = server_->port();
    o.connect_timeout = 300ms;
    o.command_timeout = command_timeout;
    o.reconnect_min = 10ms;
    o.reconnect_max = 50ms;
    return o;
  }

  // Runs `f` on the control thread and waits for it.
  template <class F>
  void on_control(F f) {
    std::promise<void> done;
    asio::post(control_, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }

  // One command through the admin connection (the test's `redis-cli`).
  store::Result<store::Reply> cmd(std::vector<std::string> args) {
    auto fut = asio::co_spawn(
        control_,
        [this, args]() -> store::Task<store::Result<store::Reply>> {
          co_return co_await admin_->exec(store::Command(std::span<const std::string>(args)));
        },
        asio::use_future);
    return fut.get();
  }

  bool wait_admin_up() {
    const auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline) {
      if (cmd({"PING"})) return true;
      std::this_thread::sleep_for(10ms);  // polls readiness, bounded by the deadline
    }
    return false;
  }

  // Stores a key record the way scripts/weir-key does; returns the key.
  std::string add_key(std::string key, std::vector<std::string> fields) {
    secrets_.push_back(key);
    std::vector<std::string> args = {"HSET", RedisKeys::redis_key("weir:", sha256(key))};
    args.insert(args.end(), fields.begin(), fields.end());
    EXPECT_TRUE(cmd(args));
    return key;
  }

  RedisKeys& start_keys(std::chrono::milliseconds command_timeout = 300ms, std::size_t max_inflight = 1024,
                        bool stale_if_error = false) {
    RedisKeysOptions o;
    o.stale_if_error = stale_if_error;
    o.client = client_options(command_timeout);
    o.key_prefix = "weir:";
    o.max_inflight = max_inflight;
    keys_ = std::make_unique<RedisKeys>(control_, std::move(o), [this](std::string_view m) {
      std::lock_guard lk(log_mu_);
      log_.emplace_back(m);
    });
    on_control([&] { keys_->start(); });
    return *keys_;
  }

  std::vector<std::string> log_lines() {
    std::lock_guard lk(log_mu_);
    return log_;
  }

  struct Outcome {
    tl::expected<PrincipalPtr, core::Error> result;
    bool waited = false;
    Clock::duration wait{};
  };

  // The gateway's authenticate phase: authenticate; if a Redis lookup is
  // wanted, wait once on this (worker) thread; authenticate again. `skew`
  // moves the wall clock the Authenticator sees (TTL tests, no sleeping).
  Outcome authenticate(Authenticator& a, std::string_view key, std::chrono::milliseconds skew = 0ms) {
    const std::string bearer = "Bearer " + std::string(key);
    Outcome o{a.authenticate(bearer, "", WallClock::now() + skew)};
    if (o.result || !a.key_lookup_pending()) return o;
    EXPECT_EQ(o.result.error().status, 503);  // what a caller that does not wait answers
    o.waited = true;
    bool done = false;
    const auto t0 = Clock::now();
    async_key_lookup(a, worker_.get_executor(), [&] { done = true; });
    worker_.restart();
    const auto deadline = Clock::now() + 10s;
    while (!done && Clock::now() < deadline) worker_.run_one_for(50ms);
    EXPECT_TRUE(done) << "async_key_lookup did not complete";
    o.wait = Clock::now() - t0;
    o.result = a.authenticate(bearer, "", WallClock::now() + skew);
    EXPECT_FALSE(a.key_lookup_pending()) << "the second authenticate must answer from the cache";
    return o;
  }

  static testing::RedisServer* server_;
  asio::io_context control_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_{control_.get_executor()};
  std::thread control_thread_;
  asio::io_context worker_;  // this thread plays the worker
  std::unique_ptr<store::Client> admin_;
  std::unique_ptr<RedisKeys> keys_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
  std::vector<std::string> secrets_;
};
testing::RedisServer* RedisKeysTest::server_ = nullptr;

TEST_F(RedisKeysTest, FoundKeyWaitsOnceThenHitsTheCache) {
  const auto key = add_key("sk-weir-found-1",
                           {"id", "acme-ci", "tenant", "acme", "models", " gpt-4o-mini , other ,", "tier", "gold"});
  auto& keys = start_keys();
  Authenticator a(make_policy(), nullptr, &keys);

  auto first = authenticate(a, key);
  ASSERT_TRUE(first.result) << first.result.error().message;
  EXPECT_TRUE(first.waited);
  const Principal& p = **first.result;
  EXPECT_EQ(p.kind, CredentialKind::api_key);
  EXPECT_EQ(p.tenant_name(), "acme");
  EXPECT_EQ(p.key_id(), "acme-ci");
  EXPECT_EQ(p.subject, "acme-ci");
  EXPECT_EQ(p.tier, "gold");
  ASSERT_NE(p.key, nullptr);
  EXPECT_EQ(p.key->scope, p.tenant->scope);  // the tenant's scope; no limits or budget of its own
  EXPECT_FALSE(p.key->limits.any());
  EXPECT_FALSE(p.key->budget.any());
  // models narrows the tenant's list: gpt-4o-mini (both), not meta-llama/x (tenant only), not other (key only).
  EXPECT_TRUE(Authenticator::check_model(p, "gpt-4o-mini"));
  EXPECT_FALSE(Authenticator::check_model(p, "meta-llama/x"));
  EXPECT_FALSE(Authenticator::check_model(p, "other"));

  const auto commands = keys.stats().commands;
  for (int i = 0; i < 100; ++i) {
    auto again = authenticate(a, key);  // also as x-api-key below
    ASSERT_TRUE(again.result);
    EXPECT_FALSE(again.waited);
    EXPECT_EQ(*again.result, *first.result);  // the same principal object: a pointer copy
  }
  auto via_header = a.authenticate("", key, WallClock::now());
  ASSERT_TRUE(via_header);
  EXPECT_EQ(*via_header, *first.result);
  EXPECT_EQ(keys.stats().commands, commands);
  EXPECT_EQ(keys.stats().found, 1u);
  EXPECT_EQ(a.stats().redis_key_hits, 102u);
  EXPECT_EQ(a.stats().redis_key_misses, 1u);
}

TEST_F(RedisKeysTest, WithoutModelsOrTierTheTenantsApply) {
  const auto key = add_key("sk-weir-plain", {"id", "plain", "tenant", "acme", "models", ""});
  Authenticator a(make_policy(), nullptr, &start_keys());
  auto r = authenticate(a, key);
  ASSERT_TRUE(r.result) << r.result.error().message;
  EXPECT_EQ((*r.result)->tier, "pro");
  EXPECT_TRUE(Authenticator::check_model(**r.result, "meta-llama/x"));
  EXPECT_FALSE(Authenticator::check_model(**r.result, "other"));
}

TEST_F(RedisKeysTest, UnknownKeyIsRefusedAndTheRefusalCached) {
  secrets_.push_back("sk-weir-nobody");
  auto& keys = start_keys();
  Authenticator a(make_policy(), nullptr, &keys);
  auto r = authenticate(a, "sk-weir-nobody");
  ASSERT_FALSE(r.result);
  EXPECT_TRUE(r.waited);
  EXPECT_EQ(r.result.error().status, 401);
  EXPECT_EQ(r.result.error().message, "Incorrect API key provided.");
  EXPECT_EQ(r.result.error().message.find("sk-weir"), std::string::npos);
  // Cached for key_negative_ttl (5 s): no lookup; then looked up again.
  auto cached = authenticate(a, "sk-weir-nobody", 4900ms);
  EXPECT_FALSE(cached.waited);
  EXPECT_EQ(cached.result.error().status, 401);
  EXPECT_EQ(keys.stats().commands, 1u);
  auto later = authenticate(a, "sk-weir-nobody", 5100ms);
  EXPECT_TRUE(later.waited);
  EXPECT_EQ(later.result.error().status, 401);
  EXPECT_EQ(keys.stats().commands, 2u);
  EXPECT_EQ(keys.stats().not_found, 2u);
}

TEST_F(RedisKeysTest, RevocationAndDeletionTakeEffectWithinTheCacheTtl) {
  const auto k1 = add_key("sk-weir-revoke-me", {"id", "r1", "tenant", "acme"});
  const auto k2 = add_key("sk-weir-delete-me", {"id", "r2", "tenant", "acme"});
  Authenticator a(make_policy(), nullptr, &start_keys());
  ASSERT_TRUE(authenticate(a, k1).result);
  ASSERT_TRUE(authenticate(a, k2).result);
  ASSERT_TRUE(cmd({"HSET", RedisKeys::redis_key("weir:", sha256(k1)), "revoked", "1"}));
  ASSERT_TRUE(cmd({"DEL", RedisKeys::redis_key("weir:", sha256(k2))}));
  // Still cached (key_cache_ttl = 30 s) ...
  EXPECT_TRUE(authenticate(a, k1, 29s).result);
  EXPECT_TRUE(authenticate(a, k2, 29s).result);
  // ... and refused once the entry expired.
  auto r1 = authenticate(a, k1, 30s);
  auto r2 = authenticate(a, k2, 30s);
  EXPECT_TRUE(r1.waited);
  ASSERT_FALSE(r1.result);
  EXPECT_EQ(r1.result.error().status, 401);
  ASSERT_FALSE(r2.result);
  EXPECT_EQ(r2.result.error().status, 401);
  // revoked: "0" means not revoked.
  ASSERT_TRUE(cmd({"HSET", RedisKeys::redis_key("weir:", sha256(k1)), "revoked", "0"}));
  EXPECT_TRUE(authenticate(a, k1, 36s).result);
}

TEST_F(RedisKeysTest, TenantMustBeConfigured) {
  const auto key = add_key("sk-weir-ghost-tenant", {"id", "ghost", "tenant", "nobody"});
  Authenticator a(make_policy(), nullptr, &start_keys());
  auto r = authenticate(a, key);
  ASSERT_FALSE(r.result);
  EXPECT_EQ(r.result.error().status, 403);
  EXPECT_EQ(r.result.error().code, "tenant_not_allowed");
  EXPECT_NE(r.result.error().message.find("nobody"), std::string::npos);
  auto cached = authenticate(a, key, 1s);
  EXPECT_FALSE(cached.waited);
  EXPECT_EQ(cached.result.error().status, 403);
}

TEST_F(RedisKeysTest, InvalidRecordsAreRefusedAndLoggedByIdOnly) {
  const auto no_tenant = add_key("sk-weir-no-tenant", {"id", "half-made", "tier", "x"});
  const auto no_id = add_key("sk-weir-no-id", {"tenant", "acme"});
  const auto not_hash = std::string("sk-weir-string");
  secrets_.push_back(not_hash);
  ASSERT_TRUE(cmd({"SET", RedisKeys::redis_key("weir:", sha256(not_hash)), "acme"}));
  Authenticator a(make_policy(), nullptr, &start_keys());
  EXPECT_EQ(authenticate(a, no_tenant).result.error().status, 401);
  EXPECT_EQ(authenticate(a, no_id).result.error().status, 401);
  EXPECT_EQ(authenticate(a, not_hash).result.error().status, 401);
  const auto lines = log_lines();
  bool named = false;
  for (const auto& l : lines) named = named || l.find("'half-made' has no tenant") != std::string::npos;
  EXPECT_TRUE(named) << "expected a log line naming the record by id";
  // (TearDown checks that no line holds a key or its hash.)
}

TEST_F(RedisKeysTest, ConfiguredKeysNeverReachRedis) {
  add_key(std::string(kConfigKey), {"id", "shadow", "tenant", "acme"});  // the same key in Redis: config wins
  auto& keys = start_keys();
  Authenticator a(make_policy(), nullptr, &keys);
  auto r = authenticate(a, kConfigKey);
  ASSERT_TRUE(r.result);
  EXPECT_FALSE(r.waited);
  EXPECT_EQ((*r.result)->key_id(), "config-key");
  EXPECT_EQ(keys.stats().lookups, 0u);
  // JWT-shaped credentials are API keys here (no auth.jwt), and anonymous requests never look anything up.
  EXPECT_EQ(a.authenticate("", "", WallClock::now()).error().status, 401);
  EXPECT_FALSE(a.key_lookup_pending());
}

TEST_F(RedisKeysTest, WithoutRedisKeysUnknownKeysAre401AtOnce) {
  Authenticator a(make_policy(), nullptr, nullptr);
  auto r = a.authenticate("Bearer sk-weir-whatever", "", WallClock::now());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 401);
  EXPECT_FALSE(a.key_lookup_pending());
}

TEST_F(RedisKeysTest, ConcurrentLookupsOfOneKeyShareOneCommand) {
  const auto key = add_key("sk-weir-busy", {"id", "busy", "tenant", "acme"});
  auto& keys = start_keys();
  // Two workers, each with its own Authenticator and io_context, 50 waits
  // each. Redis is paused until all 100 are issued, so they are in flight
  // together however the threads are scheduled (on a busy machine a lookup
  // could otherwise be answered before the next one starts).
  auto policy = make_policy();
  std::atomic<int> ok{0};
  std::atomic<int> issued{0};
  server_->pause();
  auto worker = [&] {
    asio::io_context io;
    Authenticator a(policy, nullptr, &keys);
    int done = 0;
    for (int i = 0; i < 50; ++i) {
      auto r = a.authenticate("Bearer " + key, "", WallClock::now());
      ASSERT_FALSE(r);
      ASSERT_TRUE(a.key_lookup_pending());
      async_key_lookup(a, io.get_executor(), [&] { ++done; });
      ++issued;
    }
    const auto deadline = Clock::now() + 10s;
    while (done < 50 && Clock::now() < deadline) io.run_one_for(50ms);
    ASSERT_EQ(done, 50);
    for (int i = 0; i < 50; ++i) ok += a.authenticate("Bearer " + key, "", WallClock::now()).has_value();
    // The control thread may still be inside the handler that posted the
    // last completion here (its copy of this io_context's tracked executor
    // not yet destroyed); `io` must outlive that, as a worker's io_context
    // outlives the key store in the gateway. One round trip through the
    // control thread waits it out.
    on_control([] {});
  };
  std::thread w1(worker), w2(worker);
  const auto until = Clock::now() + 10s;
  while (issued < 100 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  server_->resume();
  w1.join();
  w2.join();
  EXPECT_EQ(ok.load(), 100);
  const auto s = keys.stats();
  EXPECT_EQ(s.lookups, 100u);
  EXPECT_EQ(s.commands + s.coalesced, 100u);
  EXPECT_LE(s.commands, 4u) << "lookups of one key in flight together share one HMGET";
}

TEST_F(RedisKeysTest, TooManyDistinctLookupsInFlightAreRefusedAtOnce) {
  auto& keys = start_keys(300ms, /*max_inflight=*/2);
  server_->pause();  // nothing answers: lookups stay in flight
  std::atomic<int> unavailable{0}, done{0};
  for (int i = 0; i < 5; ++i)
    keys.lookup(sha256("sk-weir-flood-" + std::to_string(i)), [&](const KeyLookup& r) {
      unavailable += r.status == Status::unavailable;
      ++done;
    });
  const auto deadline = Clock::now() + 5s;
  while (done < 5 && Clock::now() < deadline) std::this_thread::sleep_for(5ms);  // polls, bounded
  server_->resume();
  EXPECT_EQ(done.load(), 5);
  EXPECT_EQ(unavailable.load(), 5);  // 3 refused at once, 2 timed out
  EXPECT_EQ(keys.stats().commands, 2u);
}

TEST_F(RedisKeysTest, RedisDownCachedKeysWorkUntilExpiryUnknownKeysFailFast) {
  const auto key = add_key("sk-weir-outage", {"id", "o", "tenant", "acme"});
  auto& keys = start_keys(/*command_timeout=*/300ms);
  Authenticator a(make_policy(), nullptr, &keys);
  ASSERT_TRUE(authenticate(a, key).result);
  secrets_.push_back("sk-weir-stranger");

  server_->kill();
  EXPECT_TRUE(authenticate(a, key, 29s).result);  // cached positive: no Redis needed
  auto stranger = authenticate(a, "sk-weir-stranger");
  EXPECT_TRUE(stranger.waited);
  ASSERT_FALSE(stranger.result);
  EXPECT_EQ(stranger.result.error().status, 503);
  EXPECT_EQ(stranger.result.error().retry_after_s, 1u);
  EXPECT_LT(stranger.wait, 300ms + 200ms) << "waited longer than command_timeout";
  auto expired = authenticate(a, key, 30s);  // the positive entry expired: Redis is needed now
  ASSERT_FALSE(expired.result);
  EXPECT_EQ(expired.result.error().status, 503);
  EXPECT_LT(expired.wait, 500ms);
  // The failure is cached briefly (min(key_negative_ttl, 1 s)): no lookup storm while Redis is down.
  const auto lookups = keys.stats().lookups;
  auto again = authenticate(a, "sk-weir-stranger", 900ms);
  EXPECT_FALSE(again.waited);
  EXPECT_EQ(again.result.error().status, 503);
  EXPECT_EQ(keys.stats().lookups, lookups);

  // Back (empty: the data was lost), the key is re-added; it works once the failure entry expired.
  ASSERT_TRUE(server_->start());
  ASSERT_TRUE(wait_admin_up());
  add_key(key, {"id", "o", "tenant", "acme"});
  bool back = false;
  const auto deadline = Clock::now() + 10s;  // the client reconnects with backoff (≤ 50 ms here)
  for (int i = 2; !back && Clock::now() < deadline; ++i)
    back = authenticate(a, key, std::chrono::seconds(30 * i)).result.has_value();
  EXPECT_TRUE(back);
}

TEST_F(RedisKeysTest, WithFailOpenAKeyRedisVouchedForIsServedStaleDuringAnOutageUpToItsCap) {
  // key_cache_ttl 30 s, key_negative_ttl 5 s, key_stale_ttl 60 s.
  const auto key = add_key("sk-weir-stale", {"id", "s", "tenant", "acme"});
  const auto gone = add_key("sk-weir-stale-revoked", {"id", "sr", "tenant", "acme"});
  const auto unseen = add_key("sk-weir-stale-unseen", {"id", "su", "tenant", "acme"});
  auto& keys = start_keys(/*command_timeout=*/300ms, 1024, /*stale_if_error=*/true);
  Authenticator a(make_policy("  key_stale_ttl: 60s"), nullptr, &keys);
  ASSERT_TRUE(authenticate(a, key).result);
  ASSERT_TRUE(authenticate(a, gone).result);
  ASSERT_TRUE(cmd({"HSET", RedisKeys::redis_key("weir:", sha256(gone)), "revoked", "1"}));
  auto refused = authenticate(a, gone, 30s);  // the cache saw it revoked
  ASSERT_FALSE(refused.result);
  ASSERT_EQ(refused.result.error().status, 401);

  server_->kill();
  auto stale = authenticate(a, key, 31s);  // past its TTL, Redis down: served from the expired entry
  EXPECT_TRUE(stale.waited);
  ASSERT_TRUE(stale.result) << stale.result.error().message;
  EXPECT_EQ((*stale.result)->key->id, "s");
  EXPECT_EQ(keys.stats().stale_served, 1u);
  // For min(key_negative_ttl, 1 s) without asking Redis, then asked again (and served again).
  const auto lookups = keys.stats().lookups;
  auto again = authenticate(a, key, 31s + 900ms);
  EXPECT_FALSE(again.waited);
  EXPECT_TRUE(again.result);
  EXPECT_EQ(keys.stats().lookups, lookups);
  auto later = authenticate(a, key, 80s);
  EXPECT_TRUE(later.waited);
  EXPECT_TRUE(later.result);
  EXPECT_EQ(keys.stats().stale_served, 3u);
  // Never a key the cache saw revoked, nor one it never saw.
  auto revoked = authenticate(a, gone, 40s);
  ASSERT_FALSE(revoked.result);
  EXPECT_EQ(revoked.result.error().status, 503);
  auto stranger = authenticate(a, unseen, 40s);
  ASSERT_FALSE(stranger.result);
  EXPECT_EQ(stranger.result.error().status, 503);
  // key_cache_ttl + key_stale_ttl after Redis last vouched for it: 503.
  auto capped = authenticate(a, key, 90s);
  ASSERT_FALSE(capped.result);
  EXPECT_EQ(capped.result.error().status, 503);
  EXPECT_EQ(keys.stats().stale_served, 3u);
}

TEST_F(RedisKeysTest, RedisHangingLookupsEndAtCommandTimeout) {
  const auto key = add_key("sk-weir-hang", {"id", "h", "tenant", "acme"});
  auto& keys = start_keys(/*command_timeout=*/250ms);
  Authenticator a(make_policy(), nullptr, &keys);
  server_->pause();  // accepts bytes, never answers
  auto r = authenticate(a, key);
  server_->resume();
  ASSERT_FALSE(r.result);
  EXPECT_EQ(r.result.error().status, 503);
  EXPECT_GE(r.wait, 200ms);
  EXPECT_LT(r.wait, 250ms + 250ms);
}

TEST_F(RedisKeysTest, StopAnswersEveryWaiter) {
  auto& keys = start_keys(/*command_timeout=*/5000ms);
  server_->pause();
  std::atomic<int> done{0};
  keys.lookup(sha256("sk-weir-a"), [&](const KeyLookup& r) { done += r.status == Status::unavailable; });
  keys.lookup(sha256("sk-weir-a"), [&](const KeyLookup& r) { done += r.status == Status::unavailable; });
  on_control([&] {});  // the lookups reached the control thread
  const auto t0 = Clock::now();
  on_control([&] { keys.stop(); });
  const auto deadline = Clock::now() + 2s;
  while (done < 2 && Clock::now() < deadline) std::this_thread::sleep_for(2ms);  // polls, bounded
  EXPECT_EQ(done.load(), 2);
  EXPECT_LT(Clock::now() - t0, 1s);  // not the 5 s command timeout
  server_->resume();
  // After stop(): at once, on the calling thread.
  bool inline_done = false;
  keys.lookup(sha256("sk-weir-b"), [&](const KeyLookup& r) { inline_done = r.status == Status::unavailable; });
  EXPECT_TRUE(inline_done);
}

TEST_F(RedisKeysTest, NewPolicyDropsCachedRedisKeys) {
  const auto key = add_key("sk-weir-reload", {"id", "rl", "tenant", "acme"});
  auto& keys = start_keys();
  Authenticator a(make_policy(), nullptr, &keys);
  auto before = authenticate(a, key);
  ASSERT_TRUE(before.result);
  auto policy2 = make_policy();
  a.set_policy(policy2);
  auto after = authenticate(a, key);
  EXPECT_TRUE(after.waited);  // looked up again: the old principal pointed at the old policy's tenant
  ASSERT_TRUE(after.result);
  EXPECT_EQ((*after.result)->policy, policy2);
  EXPECT_EQ((*after.result)->tenant, policy2->find_tenant("acme"));
  EXPECT_EQ((*before.result)->tenant_name(), "acme");  // the request in flight keeps its own
}

TEST_F(RedisKeysTest, TheTenantsLimitsGovernARedisKey) {
  const auto k1 = add_key("sk-weir-lim-1", {"id", "l1", "tenant", "acme"});
  const auto k2 = add_key("sk-weir-lim-2", {"id", "l2", "tenant", "acme"});
  auto policy = make_policy();
  Authenticator a(policy, nullptr, &start_keys());
  auto p1 = authenticate(a, k1).result;
  auto p2 = authenticate(a, k2).result;
  ASSERT_TRUE(p1 && p2);
  admission::LocalLimiter limiter(policy->scopes(), 1, admission::MonoClock::now());
  admission::Pricing pricing;
  admission::Admission adm(limiter, pricing, 0);
  const auto now = admission::MonoClock::now();
  // acme: 2 requests per minute, shared by both keys (no per-key scope).
  auto t1 = adm.admit(**p1, "gpt-4o-mini", 10, now);
  auto t2 = adm.admit(**p2, "gpt-4o-mini", 10, now);
  auto t3 = adm.admit(**p1, "gpt-4o-mini", 10, now);
  EXPECT_TRUE(t1);
  EXPECT_TRUE(t2);
  ASSERT_FALSE(t3);
  EXPECT_EQ(t3.error().status, 429);
  EXPECT_NE(t3.error().message.find("tenant `acme`"), std::string::npos) << t3.error().message;
}

}  // namespace
}  // namespace weir::auth
