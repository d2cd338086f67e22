// The admin API's pieces without sockets: the admin: section, the runtime
// key store (scopes, policies, the keys file), growing a limiter, the token
// check, the router and run_blocking (docs/admin-api.md).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "../auth/jwt_test_util.hpp"
#include "admission/local_limiter.hpp"
#include "auth/authenticator.hpp"
#include "core/time.hpp"
#include "gateway/admin.hpp"
#include "gateway/admin_json.hpp"
#include "gateway/admin_server.hpp"
#include "gateway/generation.hpp"
#include "gateway/key_json.hpp"
#include "gateway/key_store.hpp"
#include "gateway/load_config.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {
namespace {

namespace json = boost::json;

const char* env(const char* name) {
  return std::string_view(name) == "ADMIN_TOKEN" ? "a-long-enough-admin-token" : nullptr;
}

constexpr std::string_view kBase = R"(listen: 127.0.0.1:8080
pools:
  p: {endpoints: ["http://127.0.0.1:9"]}
models:
  m: {pool: p}
tenants:
  acme: {limits: {requests_per_minute: 100}}
)";

core::ConfigResult<LoadedConfig> load(std::string_view extra) {
  return load_config_text(std::string(kBase) + std::string(extra), "weir.yaml", &env);
}

TEST(AdminConfig, ParsesAndRefusesWhatCannotWork) {
  auto ok = load("admin: {listen: 127.0.0.1:8081, token_env: ADMIN_TOKEN, keys_file: /tmp/k.json}\n");
  ASSERT_TRUE(ok) << ok.error().to_string();
  ASSERT_TRUE(ok->admin);
  EXPECT_EQ(ok->admin->listen.port, 8081);
  EXPECT_EQ(ok->admin->token_sha256, auth::sha256("a-long-enough-admin-token"));
  EXPECT_EQ(ok->admin->keys_file, "/tmp/k.json");
  EXPECT_FALSE(load("")->admin);  // no admin: = nothing listens
  EXPECT_EQ(ok->admin->max_connections, 64u);
  auto capped = load("admin: {listen: 127.0.0.1:8081, token_env: ADMIN_TOKEN, max_connections: 3}\n");
  ASSERT_TRUE(capped) << capped.error().to_string();
  EXPECT_EQ(capped->admin->max_connections, 3u);
  EXPECT_FALSE(load("admin: {listen: 127.0.0.1:8081, token_env: ADMIN_TOKEN, max_connections: 0}\n"));

  auto err = [](std::string_view extra) {
    auto r = load(extra);
    EXPECT_FALSE(r) << extra;
    return r ? std::string() : r.error().key + ": " + r.error().message;
  };
  EXPECT_NE(err("admin: {token_env: ADMIN_TOKEN}\n").find("admin.listen"), std::string::npos);
  EXPECT_NE(err("admin: {listen: 127.0.0.1:8080, token_env: ADMIN_TOKEN}\n").find("client listener"),
            std::string::npos);
  EXPECT_NE(err("admin: {listen: 127.0.0.1:8081}\n").find("never open"), std::string::npos);
  EXPECT_NE(err("admin: {listen: 127.0.0.1:8081, token_env: UNSET}\n").find("not set"), std::string::npos);
  EXPECT_NE(err("admin: {listen: 127.0.0.1:8081, token_sha256: abc}\n").find("64 hex"), std::string::npos);
  EXPECT_NE(err("admin: {listen: 127.0.0.1:8081, token_env: ADMIN_TOKEN, jwt_claim: weir_admin}\n").find("auth.jwt"),
            std::string::npos);
  EXPECT_NE(err("admin: {listen: 127.0.0.1:8081, token_env: ADMIN_TOKEN, port: 1}\n").find("port"), std::string::npos);
  // The empty string's SHA-256 (an unset variable's): no token has it (stop 56).
  const std::string empty_sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  EXPECT_NE(err("admin: {listen: 127.0.0.1:8081, token_sha256: " + empty_sha + "}\n").find("empty string"),
            std::string::npos);
  EXPECT_NE(err("admin: {listen: 127.0.0.1:8081, token_sha256: E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B"
                "7852B855}\n")
                .find("empty string"),
            std::string::npos);
  EXPECT_NE(err("auth: {api_keys: [{id: k, tenant: acme, sha256: " + empty_sha + "}]}\n").find("empty string"),
            std::string::npos);
}

// Stop 56: a claim path with an empty step names no claim an identity provider issues: refused at load, for the
// admin claim and the client port's alike.
TEST(AdminConfig, AClaimPathWithAnEmptyStepIsRefused) {
  const std::string path = ::testing::TempDir() + "admin_claim_jwks.json";
  std::ofstream(path) << auth::testing::jwks_of({&auth::testing::Keys::get().rsa});
  const std::string jwt = "auth:\n  jwt: {jwks_file: " + path + ", issuer: https://idp.test, audience: weir";
  for (const char* bad : {".", "a..b", "a.", ".a"}) {
    auto a = load(jwt + "}\nadmin: {listen: 127.0.0.1:8081, jwt_claim: \"" + bad + "\"}\n");
    ASSERT_FALSE(a) << bad;
    EXPECT_EQ(a.error().key, "admin.jwt_claim") << bad;
    EXPECT_NE(a.error().message.find("empty step"), std::string::npos) << a.error().message;
    for (const char* key : {"tenant_claim", "tier_claim", "subject_claim"}) {
      auto c = load(jwt + ", " + key + ": \"" + bad + "\"}\n");
      ASSERT_FALSE(c) << key << " " << bad;
      EXPECT_EQ(c.error().key, std::string("auth.jwt.") + key);
    }
  }
  auto ok =
      load(jwt + ", tier_claim: \"\"}\nadmin: {listen: 127.0.0.1:8081, jwt_claim: \"https://example.com/admin\"}\n");
  ASSERT_TRUE(ok) << ok.error().to_string();
  EXPECT_EQ(ok->admin->jwt_claim, "https://example.com/admin");
}

TEST(Rfc3339, ParsesAndFormats) {
  std::int64_t s = 0;
  ASSERT_TRUE(core::parse_rfc3339("2020-01-01T00:00:00Z", s));
  EXPECT_EQ(s, 1577836800);
  ASSERT_TRUE(core::parse_rfc3339("2020-01-01T02:30:00.5+02:30", s));
  EXPECT_EQ(s, 1577836800);
  EXPECT_FALSE(core::parse_rfc3339("2020-02-30T00:00:00Z", s));
  EXPECT_FALSE(core::parse_rfc3339("2020-01-01T00:00:00", s));
  EXPECT_FALSE(core::parse_rfc3339("tomorrow", s));
  EXPECT_EQ(core::format_rfc3339(1577836800), "2020-01-01T00:00:00Z");
}

TEST(Rfc3339, RoundsUpForADeadlineAndTakesALeapSecondOnlyAtAMonthsEnd) {
  std::int64_t s = 0;
  // A fraction: dropped, or the next second for a deadline (a key given
  // ...:00.999Z expired up to a second early).
  ASSERT_TRUE(core::parse_rfc3339("2020-01-01T00:00:00.999Z", s));
  EXPECT_EQ(s, 1577836800);
  ASSERT_TRUE(core::parse_rfc3339("2020-01-01T00:00:00.999Z", s, core::RoundSeconds::up));
  EXPECT_EQ(s, 1577836801);
  ASSERT_TRUE(core::parse_rfc3339("2020-01-01T00:00:00.000Z", s, core::RoundSeconds::up));
  EXPECT_EQ(s, 1577836800);
  ASSERT_TRUE(core::parse_rfc3339("2020-01-01T00:00:00Z", s, core::RoundSeconds::up));
  EXPECT_EQ(s, 1577836800);
  ASSERT_TRUE(core::parse_rfc3339("2020-01-01T02:30:00.000001+02:30", s, core::RoundSeconds::up));
  EXPECT_EQ(s, 1577836801);
  // Second 60: at the end of a month in UTC (RFC 3339 §5.7), whatever the
  // offset; 23:59:59 down, the next day's 00:00:00 up.
  ASSERT_TRUE(core::parse_rfc3339("2016-12-31T23:59:60Z", s));
  EXPECT_EQ(s, 1483228799);
  ASSERT_TRUE(core::parse_rfc3339("2016-12-31T23:59:60.5Z", s, core::RoundSeconds::up));
  EXPECT_EQ(s, 1483228800);
  ASSERT_TRUE(core::parse_rfc3339("2016-12-31T18:59:60-05:00", s));
  EXPECT_EQ(s, 1483228799);
  ASSERT_TRUE(core::parse_rfc3339("2015-06-30T23:59:60Z", s));
  ASSERT_TRUE(core::parse_rfc3339("2024-02-29T23:59:60Z", s));  // any month's end
  // Anywhere else it is no time at all.
  EXPECT_FALSE(core::parse_rfc3339("2020-01-01T00:00:60Z", s));
  EXPECT_FALSE(core::parse_rfc3339("2016-12-31T22:59:60Z", s));
  EXPECT_FALSE(core::parse_rfc3339("2016-12-30T23:59:60Z", s));
  EXPECT_FALSE(core::parse_rfc3339("2016-12-31T23:59:60+01:00", s));  // 22:59:60 UTC
  EXPECT_FALSE(core::parse_rfc3339("2023-02-28T23:59:60-00:30", s));  // March 1st, 00:29:60 UTC
  EXPECT_FALSE(core::parse_rfc3339("2016-12-31T23:59:61Z", s));
  EXPECT_TRUE(core::ends_utc_month(1483228799));
  EXPECT_FALSE(core::ends_utc_month(1483228800));
}

auth::AuthConfig base_auth() {
  auto r = load("auth:\n  api_keys: [{id: cfg, tenant: acme, sha256: " + auth::to_hex(auth::sha256("sk-cfg")) + "}]\n");
  EXPECT_TRUE(r) << r.error().to_string();
  return *r->auth;
}

json::object obj(std::string_view text) { return json::parse(text).as_object(); }

TEST(KeyStore, NewKeysGetNewScopesWithoutRenumberingAndReachTheLimiter) {
  KeyStore store(base_auth(), "");
  const auto first = store.policy();
  const auto cfg_scopes = static_cast<std::uint32_t>(first->scopes().size());  // acme, anonymous, cfg
  ASSERT_EQ(cfg_scopes, 3u);
  admission::LocalLimiter limiter(first->scopes(), 2, std::chrono::steady_clock::now());
  store.set_limiter(&limiter);
  const auto now = std::chrono::steady_clock::now();
  // State of an existing scope survives growth.
  ASSERT_TRUE(limiter.take(first->find_tenant("acme")->scope, admission::Bucket::requests, 0, 1, now).ok);

  auto a = store.create(obj(R"({"tenant":"acme","limits":{"requests_per_minute":2}})"), 1000);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(a->record.scope, cfg_scopes);
  EXPECT_TRUE(a->secret.starts_with("sk-weir-"));
  auto b = store.create(obj(R"({"tenant":"acme"})"), 1000);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->record.scope, cfg_scopes + 1);

  const auto p = store.policy();
  EXPECT_NE(p, first);  // a new immutable policy; the old one is unchanged
  EXPECT_EQ(first->find_key(auth::sha256(a->secret)), nullptr);
  const auth::KeyPolicy* ka = p->find_key(auth::sha256(a->secret));
  ASSERT_NE(ka, nullptr);
  EXPECT_TRUE(ka->runtime);
  EXPECT_EQ(ka->scope, cfg_scopes);
  EXPECT_EQ(p->scopes()[ka->scope].limits.requests_per_minute, 2u);
  EXPECT_EQ(p->find_key(auth::sha256("sk-cfg"))->scope, first->find_key(auth::sha256("sk-cfg"))->scope);
  EXPECT_EQ(limiter.scope_count(), p->scopes().size());
  EXPECT_EQ(limiter.view(0, admission::Bucket::requests, now).remaining, 99u);  // acme kept its take
  EXPECT_TRUE(limiter.take(ka->scope, admission::Bucket::requests, 0, 1, now).ok);
  EXPECT_TRUE(limiter.take(ka->scope, admission::Bucket::requests, 1, 1, now).ok);
  EXPECT_FALSE(limiter.take(ka->scope, admission::Bucket::requests, 0, 1, now).ok);

  // New limits: a fresh scope; other fields keep the scope.
  auto u = store.update(a->record.id, obj(R"({"limits":{"requests_per_minute":5},"metadata":{"x":1}})"));
  ASSERT_TRUE(u);
  EXPECT_EQ(u->record.scope, cfg_scopes + 2);
  auto m = store.update(a->record.id, obj(R"({"models":["m"]})"));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->record.scope, cfg_scopes + 2);
  EXPECT_FALSE(store.policy()->find_key(auth::sha256(a->secret))->models->allows("other"));
  EXPECT_FALSE(store.update(a->record.id, obj(R"({"tenant":"x"})")));
  EXPECT_FALSE(store.update("vk_none", obj("{}")));

  // Rotate: same id and scope, new secret; revoke: gone.
  auto r = store.rotate(a->record.id);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->record.scope, cfg_scopes + 2);
  EXPECT_EQ(store.policy()->find_key(auth::sha256(a->secret)), nullptr);
  EXPECT_NE(store.policy()->find_key(auth::sha256(r->secret)), nullptr);
  ASSERT_TRUE(store.revoke(a->record.id));
  EXPECT_EQ(store.policy()->find_key(auth::sha256(r->secret)), nullptr);
  EXPECT_EQ(store.keys().size(), 1u);
}

TEST(KeyStore, RefusesBadFieldsNamingThem) {
  KeyStore store(base_auth(), "");
  auto param = [&](std::string_view body) {
    auto r = store.create(obj(body), 1);
    EXPECT_FALSE(r) << body;
    return r ? std::string() : r.error().param;
  };
  EXPECT_EQ(param(R"({})"), "tenant");
  EXPECT_EQ(param(R"({"tenant":"acme","limits":{"requests_per_minute":-1}})"), "limits.requests_per_minute");
  EXPECT_EQ(param(R"({"tenant":"acme","limits":{"rpm":1}})"), "limits.rpm");
  EXPECT_EQ(param(R"({"tenant":"acme","budget":{"period":"1h"}})"), "budget.usd");
  EXPECT_EQ(param(R"({"tenant":"acme","models":"m"})"), "models");
  EXPECT_EQ(param(R"({"tenant":"acme","metadata":[1]})"), "metadata");
  // What JSON cannot write back (1e999 is read as infinity), or deeper than the keys file can hold.
  EXPECT_EQ(param(R"({"tenant":"acme","metadata":{"n":1e999}})"), "metadata");
  EXPECT_EQ(param(R"({"tenant":"acme","metadata":{"n":[-1e400]}})"), "metadata");
  EXPECT_EQ(param(R"({"tenant":"acme","metadata":{"a":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}})"), "metadata");
  EXPECT_EQ(param(R"({"tenant":"acme","expires_at":"soon"})"), "expires_at");
  EXPECT_EQ(param(R"({"tenant":"acme","secret":"x"})"), "secret");
  // Stop 56: a model name must mean one model in Redis's comma-joined field too.
  for (const char* m : {R"(",")", R"(" ")", R"("zzz,m")", R"(" m")", R"("m ")", R"("a\u0000b")", R"("a\tb")"})
    EXPECT_EQ(param(std::string(R"({"tenant":"acme","models":["m",)") + m + "]}"), "models[1]") << m;
  std::string many = R"({"tenant":"acme","models":["m")";
  for (int i = 0; i < 700; ++i) many += fmt::format(R"(,"some-org/model-variant-{:04d}")", i);
  EXPECT_EQ(param(many + "]}"), "models");
  auto message = [&](std::string_view body) {
    auto r = store.create(obj(body), 1);
    EXPECT_FALSE(r) << body;
    return r ? std::string() : r.error().param + ": " + r.error().message;
  };
  // A limit past its range says so, whatever JSON spelling it has; a fraction is a fraction.
  EXPECT_EQ(message(R"({"tenant":"acme","limits":{"requests_per_minute":1e30}})"),
            "limits.requests_per_minute: 1000000000000000019884624838656 is out of range [0, 1125899906842624]");
  EXPECT_EQ(message(R"({"tenant":"acme","limits":{"requests_per_minute":18446744073709551615}})"),
            "limits.requests_per_minute: 18446744073709551615 is out of range [0, 1125899906842624]");
  EXPECT_EQ(message(R"({"tenant":"acme","limits":{"requests_per_minute":1.5}})"),
            "limits.requests_per_minute: limits.requests_per_minute must be an integer, not a number with a fraction");
  EXPECT_NE(message(R"({"tenant":"acme","budget":{"usd":1e30}})").find("out of range"), std::string::npos);
  // (Still accepted: an integer written with an exponent or a fraction of 0.)
  ASSERT_TRUE(
      store.create(obj(R"({"tenant":"acme","limits":{"requests_per_minute":6e1,"tokens_per_minute":100.0}})"), 1));
  ASSERT_TRUE(store.revoke(store.keys().back().id));
  auto t = store.create(obj(R"({"tenant":"nobody"})"), 1);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().status, 404);
  EXPECT_TRUE(store.keys().empty());
}

TEST(AdminJson, UnderflowingNumbersAreFound) {
  EXPECT_EQ(underflowing_number(R"({"a":1e-400})"), "1e-400");
  EXPECT_EQ(underflowing_number(R"([0, -0.0, 0e-999, 1.5, -2.5e-400])"), "-2.5e-400");
  EXPECT_EQ(underflowing_number("[0." + std::string(400, '0') + "1]"), "0." + std::string(400, '0') + "1");
  EXPECT_EQ(underflowing_number(R"({"1e-400":"1e-400","s":"\"1e-400","n":1e-300,"m":5e-324})"), std::nullopt);
  EXPECT_EQ(underflowing_number(R"({"limits":{"requests_per_minute":60}})"), std::nullopt);
}

// Stop 62: a member given twice, at any depth of an admin body, is found (and refused: parse_object), its path
// named; Boost.JSON kept the last copy ({"tenant":"other","tenant":"acme"} made an acme key).
TEST(AdminJson, RepeatedMembersAreFoundAtAnyDepth) {
  EXPECT_EQ(repeated_member_path(R"({"tenant":"other","tenant":"acme"})"), "tenant");
  EXPECT_EQ(repeated_member_path(R"({"limits":{"requests_per_minute":5,"requests_per_minute":0}})"),
            "limits.requests_per_minute");
  EXPECT_EQ(repeated_member_path(R"({"models":["m"], "models":null})"), "models");
  EXPECT_EQ(repeated_member_path(R"({"metadata":{"a":[1,{"x":1},{"b":1, "b":2}]}})"), "metadata.a[2].b");
  // Escapes are names as decoded; a name in a string value, or the same name in sibling objects, is no repeat.
  EXPECT_EQ(repeated_member_path(R"({"tenant":"a","tenant":"b"})"), "tenant");
  EXPECT_EQ(repeated_member_path(R"({"a":{"x":1},"b":{"x":1},"c":[{"x":1},{"x":2}],"d":""a":1,"a":2"})"), std::nullopt);
  EXPECT_EQ(repeated_member_path(R"({"a":{"a":{"a":1}}})"), std::nullopt);
  EXPECT_EQ(repeated_member_path(R"({})"), std::nullopt);
}

// Stop 62: a budget period that is not whole seconds is answered in seconds as the documentation says
// ("1.5s", not "1500ms"), exactly, and reads back as the same period.
TEST(KeyJson, BudgetPeriodsAreAnsweredInSecondsExactly) {
  for (const auto& [ms, text] :
       std::initializer_list<std::pair<std::int64_t, std::string>>{{86'400'000, "86400s"},
                                                                   {1500, "1.5s"},
                                                                   {1001, "1.001s"},
                                                                   {1010, "1.01s"},
                                                                   {31'535'999'999, "31535999.999s"}}) {
    auth::Budget b;
    b.limit_nano_usd = 5'000'000'000;
    b.period = std::chrono::milliseconds(ms);
    const auto v = budget_json(b);
    EXPECT_EQ(v.as_object().at("period").as_string(), text);
    const auto back = parse_budget_json(v, "budget");
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(back->period.count(), ms) << text;
  }
}

TEST(KeyStore, AnExpiryWithAFractionIsNeverEarly) {
  // "...:00.5Z" was cut to ...:00: the key stopped half a second before the instant given.
  KeyStore store(base_auth(), "");
  auto a = store.create(obj(R"({"tenant":"acme","expires_at":"2099-01-01T00:00:00.5Z"})"), 1);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->record.expires_at, 4070908801);
  auto u = store.update(a->record.id, obj(R"({"expires_at":"2098-12-31T23:59:59.001-00:00"})"));
  ASSERT_TRUE(u);
  EXPECT_EQ(u->record.expires_at, 4070908800);
  u = store.update(a->record.id, obj(R"({"expires_at":"2099-01-01T00:00:00.000Z"})"));
  ASSERT_TRUE(u);
  EXPECT_EQ(u->record.expires_at, 4070908800);
  // A second 60 where no leap second can be is no time.
  auto bad = store.update(a->record.id, obj(R"({"expires_at":"2099-01-01T00:00:60Z"})"));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().status, 400);
  EXPECT_EQ(bad.error().param, "expires_at");
}

TEST(KeyStore, BudgetChangeCarriesSpend) {
  KeyStore store(base_auth(), "");
  admission::LocalLimiter limiter(store.policy()->scopes(), 1, std::chrono::steady_clock::now());
  store.set_limiter(&limiter);
  auto a = store.create(obj(R"({"tenant":"acme","budget":{"usd":1}})"), 1);
  ASSERT_TRUE(a);
  const auto now = std::chrono::steady_clock::now();
  limiter.settle_spend(a->record.scope, 0, 300'000'000, now);  // $0.30 spent
  auto u = store.update(a->record.id, obj(R"({"budget":{"usd":2,"period":"24h"}})"));
  ASSERT_TRUE(u);
  EXPECT_NE(u->record.scope, a->record.scope);
  EXPECT_EQ(limiter.spent(u->record.scope, now), 300'000'000);
}

TEST(KeyStore, KeysFilePersistsHashesOnlyWithMode0600) {
  const auto dir = std::filesystem::temp_directory_path() / ("weir-keys-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.json").string();
  std::filesystem::remove(file);
  std::string secret, id;
  {
    KeyStore store(base_auth(), file);
    ASSERT_TRUE(store.load());  // missing = empty
    auto a = store.create(obj(R"({"tenant":"acme","models":["m"],"limits":{"tokens_per_minute":1000},
                                 "budget":{"usd":0.5,"period":"1h"},"expires_at":"2099-01-01T00:00:00Z",
                                 "metadata":{"team":"c"},"name":"ci"})"),
                          1234);
    ASSERT_TRUE(a);
    secret = a->secret;
    id = a->record.id;
  }
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find(secret), std::string::npos);
  EXPECT_NE(text.find(auth::to_hex(auth::sha256(secret))), std::string::npos);

  KeyStore again(base_auth(), file);
  ASSERT_TRUE(again.load());
  ASSERT_EQ(again.keys().size(), 1u);
  const KeyRecord& k = again.keys()[0];
  EXPECT_EQ(k.id, id);
  EXPECT_EQ(k.name, "ci");
  EXPECT_EQ(k.limits.tokens_per_minute, 1000u);
  EXPECT_EQ(k.budget.limit_nano_usd, 500'000'000);
  EXPECT_EQ(k.budget.period, std::chrono::hours(1));
  EXPECT_EQ(k.expires_at, 4070908800);
  EXPECT_EQ(k.created_at, 1234);
  EXPECT_EQ(json::serialize(k.metadata), R"({"team":"c"})");
  EXPECT_NE(again.policy()->find_key(auth::sha256(secret)), nullptr);

  // The deepest metadata the API takes is read back from the file (it was refused there from 29 levels).
  {
    std::string deep =
        R"({"tenant":"acme","metadata":{"a":)" + std::string(14, '[') + "1" + std::string(14, ']') + "}}";
    ASSERT_TRUE(again.create(obj(deep), 1235));
    KeyStore reread(base_auth(), file);
    ASSERT_TRUE(reread.load());
    EXPECT_EQ(reread.keys().size(), 2u);
  }

  std::ofstream(file) << "not json";
  KeyStore broken(base_auth(), file);
  EXPECT_FALSE(broken.load());
  std::filesystem::remove_all(dir);
}

TEST(KeyStore, TheTemporaryFileIsMadeAnewNeverThroughALinkOrAStaleOne) {
  // FILE.tmp was opened with O_TRUNC and no O_NOFOLLOW: a symbolic link planted there had the hashes
  // written into its target (and the target's mode kept).
  const auto dir = std::filesystem::temp_directory_path() / ("weir-keys-tmp-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.json").string();
  const auto target = dir / "elsewhere";
  std::ofstream(target) << "untouched\n";
  ::chmod(target.c_str(), 0644);
  std::filesystem::create_symlink(target, file + ".tmp");
  KeyStore store(base_auth(), file);
  ASSERT_TRUE(store.load());
  auto a = store.create(obj(R"({"tenant":"acme"})"), 1234);
  ASSERT_TRUE(a);
  std::ifstream in(target);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), "untouched\n");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(file + ".tmp")));
  struct stat st {};
  ASSERT_EQ(::lstat(file.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600);
  // A stale FILE.tmp left by a crash (of another mode) does not block the next save.
  std::ofstream(file + ".tmp") << "stale";
  ::chmod((file + ".tmp").c_str(), 0644);
  ASSERT_TRUE(store.create(obj(R"({"tenant":"acme"})"), 1235));
  KeyStore again(base_auth(), file);
  ASSERT_TRUE(again.load());
  EXPECT_EQ(again.keys().size(), 2u);
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  std::filesystem::remove_all(dir);
}

TEST(KeyStore, AKeysFileWithADuplicateOrAWrongTypeIsRefused) {
  // A hand-edited or merged file: each id and each secret once (a rotate of a duplicated id moved another key
  // to another tenant), fields of their types, version 1.
  const auto dir = std::filesystem::temp_directory_path() / ("weir-keys-strict-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.json").string();
  const std::string a(64, 'a'), b(64, 'b');
  const auto rec = [](std::string_view id, std::string_view sha, std::string_view extra = "") {
    return fmt::format(R"({{"id":"{}","tenant":"acme","sha256":"{}"{}}})", id, sha, extra);
  };
  const auto refused = [&](const std::string& text, std::string_view why) {
    std::ofstream(file) << text;
    KeyStore store(base_auth(), file);
    auto r = store.load();
    ASSERT_FALSE(r) << text;
    EXPECT_NE(r.error().find(why), std::string::npos) << r.error();
  };
  refused(fmt::format(R"({{"version":1,"keys":[{},{}]}})", rec("k1", a), rec("k1", b)), "duplicate id");
  refused(fmt::format(R"({{"version":1,"keys":[{},{}]}})", rec("k1", a), rec("k2", a)), "the same secret");
  refused(fmt::format(R"({{"version":1,"keys":[{}]}})", rec("k1", a, R"(,"name":5)")), "name");
  refused(fmt::format(R"({{"version":1,"keys":[{}]}})", rec("k1", a, R"(,"created_at":"yesterday")")), "created_at");
  refused(fmt::format(R"({{"keys":[{}]}})", rec("k1", a)), "version");
  refused(fmt::format(R"({{"version":2,"keys":[{}]}})", rec("k1", a)), "version");
  std::ofstream(file) << fmt::format(R"({{"version":1,"keys":[{},{}]}})", rec("k1", a, R"(,"name":null)"),
                                     rec("k2", b));
  KeyStore fine(base_auth(), file);
  EXPECT_TRUE(fine.load());
  std::filesystem::remove_all(dir);
}

// Two stores on one keys file: the two Weirs of a zero-downtime restart (two descriptors of FILE.lock, as two
// processes have). Each change is made to the file as it is, and refresh() brings the other's changes in.
TEST(KeyStore, TwoStoresSharingTheKeysFileLoseNoChangeAndReadEachOthersIn) {
  const auto dir = std::filesystem::temp_directory_path() / ("weir-keys-shared-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.json").string();
  const auto now = std::chrono::steady_clock::now();
  KeyStore a(base_auth(), file), b(base_auth(), file);
  ASSERT_TRUE(a.load());
  ASSERT_TRUE(b.load());
  admission::LocalLimiter la(a.policy()->scopes(), 1, now), lb(b.policy()->scopes(), 1, now);
  a.set_limiter(&la);
  b.set_limiter(&lb);
  const auto file_ids = [&] {
    KeyStore r(base_auth(), file);
    EXPECT_TRUE(r.load());
    std::vector<std::string> ids;
    for (const auto& k : r.keys()) ids.push_back(k.id);
    return ids;
  };

  auto k1 = a.create(obj(R"({"tenant":"acme","budget":{"usd":1}})"), 1);
  ASSERT_TRUE(k1);
  auto k2 = b.create(obj(R"({"tenant":"acme"})"), 2);  // b had not seen k1: it reads the file first
  ASSERT_TRUE(k2);
  EXPECT_EQ(file_ids(), (std::vector<std::string>{k1->record.id, k2->record.id}));
  EXPECT_NE(b.policy()->find_key(auth::sha256(k1->secret)), nullptr);

  // k1's state on a: its spend. b renames it (same limits): a keeps k1's scope and so its spend.
  la.settle_spend(k1->record.scope, 0, 300'000'000, now);
  ASSERT_TRUE(b.update(k1->record.id, obj(R"({"name":"renamed"})")));
  const auto v = a.version();
  auto r = a.refresh();
  ASSERT_TRUE(r) << r.error();
  EXPECT_TRUE(*r);
  EXPECT_NE(a.version(), v);
  ASSERT_NE(a.find(k1->record.id), nullptr);
  EXPECT_EQ(a.find(k1->record.id)->name, "renamed");
  EXPECT_EQ(a.find(k1->record.id)->scope, k1->record.scope);
  EXPECT_NE(a.policy()->find_key(auth::sha256(k2->secret)), nullptr);
  r = a.refresh();
  ASSERT_TRUE(r);
  EXPECT_FALSE(*r);  // nothing new: a stat, no read
  EXPECT_EQ(la.spent(k1->record.scope, now), 300'000'000);
  // A new budget on b: a fresh scope on a, the spend carried to it (as a's own update would).
  ASSERT_TRUE(b.update(k1->record.id, obj(R"({"budget":{"usd":2}})")));
  ASSERT_TRUE(a.refresh());
  const auto moved = a.find(k1->record.id)->scope;
  EXPECT_NE(moved, k1->record.scope);
  EXPECT_EQ(la.spent(moved, now), 300'000'000);

  // Revoked on b, made on a: gone from the file, and from a's policy once a reads it.
  ASSERT_TRUE(b.revoke(k1->record.id));
  EXPECT_EQ(file_ids(), (std::vector<std::string>{k2->record.id}));
  r = a.refresh();
  ASSERT_TRUE(r);
  EXPECT_TRUE(*r);
  EXPECT_EQ(a.policy()->find_key(auth::sha256(k1->secret)), nullptr);
  // A change on a to a file b changed since a last read it starts from b's version: revoking what b revoked
  // is a 404, and k2 (rotated on b) keeps b's secret.
  auto k2r = b.rotate(k2->record.id);
  ASSERT_TRUE(k2r);
  auto again = a.revoke(k1->record.id);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().status, 404);
  EXPECT_EQ(a.policy()->find_key(auth::sha256(k2->secret)), nullptr);  // read in by the failed change too
  EXPECT_NE(a.policy()->find_key(auth::sha256(k2r->secret)), nullptr);
  ASSERT_TRUE(a.create(obj(R"({"tenant":"acme"})"), 3));
  ASSERT_TRUE(b.refresh());
  EXPECT_EQ(b.keys().size(), 2u);
  EXPECT_EQ(file_ids().size(), 2u);

  // The lock file: 0600, beside the keys file.
  struct stat st {};
  ASSERT_EQ(::lstat((file + ".lock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600);
  std::filesystem::remove_all(dir);
}

TEST(KeyStore, ABrokenSharedKeysFileIsSaidOnceAndNeverWrittenOver) {
  const auto dir = std::filesystem::temp_directory_path() / ("weir-keys-broken-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.json").string();
  KeyStore a(base_auth(), file);
  ASSERT_TRUE(a.load());
  auto k = a.create(obj(R"({"tenant":"acme"})"), 1);
  ASSERT_TRUE(k);
  std::ofstream(file + ".new") << "{\"version\":1,\"keys\":[{\"id\":\"x\"}]}";  // (replaced whole, as Weir does)
  std::filesystem::rename(file + ".new", file);
  auto r = a.refresh();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("admin.keys_file " + file + ": keys[0]"), std::string::npos) << r.error();
  r = a.refresh();  // said once
  ASSERT_TRUE(r);
  EXPECT_FALSE(*r);
  EXPECT_NE(a.policy()->find_key(auth::sha256(k->secret)), nullptr);  // kept as it was
  auto c = a.create(obj(R"({"tenant":"acme"})"), 2);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().status, 500);
  EXPECT_NE(c.error().message.find("keys[0]"), std::string::npos) << c.error().message;
  std::ifstream in(file);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()),
            "{\"version\":1,\"keys\":[{\"id\":\"x\"}]}");
  std::filesystem::remove_all(dir);
}

// A keys file moved away or deleted is as a broken one: the keys stay, with their scopes (buckets, spend);
// brought back, the same ids keep them. (A file that was never there is an empty store: load().)
TEST(KeyStore, AKeysFileGoneAfterItWasThereKeepsTheKeysAndTheirState) {
  const auto dir = std::filesystem::temp_directory_path() / ("weir-keys-gone-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.json").string();
  const auto now = std::chrono::steady_clock::now();
  KeyStore a(base_auth(), file);
  ASSERT_TRUE(a.load());
  admission::LocalLimiter la(a.policy()->scopes(), 1, now);
  a.set_limiter(&la);
  auto k = a.create(obj(R"({"tenant":"acme","budget":{"usd":1}})"), 1);
  ASSERT_TRUE(k);
  la.settle_spend(k->record.scope, 0, 300'000'000, now);
  std::filesystem::rename(file, file + ".bak");
  auto r = a.refresh();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("is gone (moved or deleted)"), std::string::npos) << r.error();
  r = a.refresh();  // said once
  ASSERT_TRUE(r);
  EXPECT_FALSE(*r);
  ASSERT_NE(a.policy()->find_key(auth::sha256(k->secret)), nullptr);
  // Back, changed (another key added by hand): read again, the known id keeps its scope and spend.
  {
    std::ifstream in(file + ".bak");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto root = boost::json::parse(text).as_object();
    auto added = root["keys"].as_array()[0].as_object();
    added["id"] = "vk_byhand";
    added["sha256"] = auth::to_hex(auth::sha256("sk-by-hand"));
    root["keys"].as_array().push_back(added);
    std::ofstream(file + ".new") << boost::json::serialize(root);
    std::filesystem::rename(file + ".new", file);
  }
  r = a.refresh();
  ASSERT_TRUE(r) << r.error();
  EXPECT_TRUE(*r);
  EXPECT_EQ(a.keys().size(), 2u);
  EXPECT_EQ(a.find(k->record.id)->scope, k->record.scope);
  EXPECT_EQ(la.spent(k->record.scope, now), 300'000'000);
  // Deleted: kept again; the next change writes every key.
  std::filesystem::remove(file);
  ASSERT_FALSE(a.refresh());
  EXPECT_EQ(a.keys().size(), 2u);
  auto k2 = a.create(obj(R"({"tenant":"acme"})"), 2);
  ASSERT_TRUE(k2) << k2.error().message;
  KeyStore reader(base_auth(), file);
  ASSERT_TRUE(reader.load());
  EXPECT_EQ(reader.keys().size(), 3u);
  std::filesystem::remove_all(dir);
}

// An older Weir sharing the file writes it from its memory without the lock: what this store revoked, and a
// secret it rotated away, come back in the file. They are never admitted again, and repair() writes the file
// without them.
TEST(KeyStore, ARevocationIsNeverUndoneByAReRead) {
  const auto dir = std::filesystem::temp_directory_path() / ("weir-keys-tomb-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.json").string();
  KeyStore a(base_auth(), file);
  ASSERT_TRUE(a.load());
  auto gone = a.create(obj(R"({"tenant":"acme"})"), 1);
  auto turned = a.create(obj(R"({"tenant":"acme"})"), 2);
  ASSERT_TRUE(gone && turned);
  std::string old_memory;
  {
    std::ifstream in(file);
    old_memory.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  ASSERT_TRUE(a.revoke(gone->record.id));
  auto rotated = a.rotate(turned->record.id);
  ASSERT_TRUE(rotated);
  auto r = a.repair();
  ASSERT_TRUE(r);
  EXPECT_FALSE(*r);  // nothing to do
  {
    auto root = boost::json::parse(old_memory).as_object();
    auto added = root["keys"].as_array()[0].as_object();
    added["id"] = "vk_old";
    added["sha256"] = auth::to_hex(auth::sha256("sk-old-build"));
    root["keys"].as_array().push_back(added);
    std::ofstream(file + ".new") << boost::json::serialize(root);
    std::filesystem::rename(file + ".new", file);
  }
  r = a.refresh();
  ASSERT_TRUE(r) << r.error();
  EXPECT_TRUE(*r);
  EXPECT_EQ(a.policy()->find_key(auth::sha256(gone->secret)), nullptr);
  EXPECT_EQ(a.policy()->find_key(auth::sha256(turned->secret)), nullptr);
  EXPECT_NE(a.policy()->find_key(auth::sha256(rotated->secret)), nullptr);
  EXPECT_NE(a.policy()->find_key(auth::sha256("sk-old-build")), nullptr);
  EXPECT_EQ(a.find(gone->record.id), nullptr);
  r = a.repair();
  ASSERT_TRUE(r) << r.error();
  EXPECT_TRUE(*r);
  KeyStore reader(base_auth(), file);
  ASSERT_TRUE(reader.load());
  ASSERT_EQ(reader.keys().size(), 2u);
  EXPECT_EQ(reader.find(gone->record.id), nullptr);
  ASSERT_NE(reader.find(turned->record.id), nullptr);
  EXPECT_EQ(reader.find(turned->record.id)->sha256, auth::sha256(rotated->secret));
  r = a.repair();
  ASSERT_TRUE(r);
  EXPECT_FALSE(*r);
  std::filesystem::remove_all(dir);
}

TEST(KeyStore, TheLockFileIsNeverFollowedAndAHeldLockIsWaitedForBounded) {
  const auto dir = std::filesystem::temp_directory_path() / ("weir-keys-lock-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.json").string();
  const auto target = dir / "elsewhere";
  std::ofstream(target) << "untouched\n";
  std::filesystem::create_symlink(target, file + ".lock");
  KeyStore a(base_auth(), file);
  ASSERT_TRUE(a.load());
  auto c = a.create(obj(R"({"tenant":"acme"})"), 1);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().status, 500);
  EXPECT_NE(c.error().message.find("lock file"), std::string::npos) << c.error().message;
  EXPECT_FALSE(std::filesystem::exists(file));
  std::filesystem::remove(file + ".lock");
  // Another process holding the lock (past 200 ms): 503, nothing written; released, the change goes through.
  const int fd = ::open((file + ".lock").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  c = a.create(obj(R"({"tenant":"acme"})"), 2);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().status, 503);
  EXPECT_FALSE(std::filesystem::exists(file));
  ::close(fd);
  ASSERT_TRUE(a.create(obj(R"({"tenant":"acme"})"), 3));
  EXPECT_TRUE(std::filesystem::exists(file));
  std::filesystem::remove_all(dir);
}

TEST(KeyStore, PublishedPolicyAuthenticatesAndExpiryIsRefusedSayingSo) {
  KeyStore store(base_auth(), "");
  auth::Authenticator authn(store.policy(), nullptr);
  auto a = store.create(obj(R"({"tenant":"acme","expires_at":2000000000})"), 1);
  ASSERT_TRUE(a);
  const auto before = auth::WallTime(std::chrono::seconds(1999999999));
  EXPECT_FALSE(authn.authenticate("Bearer " + a->secret, "", before));  // the old policy: unknown
  authn.set_policy(store.policy());                                     // what a worker does on the post
  auto ok = authn.authenticate("Bearer " + a->secret, "", before);
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ((*ok)->key_id(), a->record.id);
  auto expired = authn.authenticate("Bearer " + a->secret, "", auth::WallTime(std::chrono::seconds(2000000000)));
  ASSERT_FALSE(expired);
  EXPECT_EQ(expired.error().status, 401);
  EXPECT_NE(expired.error().message.find("expired at 2033-05-18T03:33:20Z"), std::string::npos)
      << expired.error().message;
}

// Anthropic's List Models query (API reference, "List Models").
TEST(AnthropicPage, ReadsLimitAndOneCursorAndRefusesTheRestNamingIt) {
  auto p = anthropic_page("");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->limit, 20u);
  EXPECT_TRUE(p->after_id.empty() && p->before_id.empty());
  p = anthropic_page("beta=true&limit=1000&after_id=org%2Fm+1&x");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->limit, 1000u);
  EXPECT_EQ(p->after_id, "org/m 1");
  p = anthropic_page("before_id=a&limit=1");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->before_id, "a");
  EXPECT_EQ(p->limit, 1u);
  for (const auto& [q, param] :
       std::initializer_list<std::pair<const char*, const char*>>{{"limit=0", "limit"},
                                                                  {"limit=1001", "limit"},
                                                                  {"limit=", "limit"},
                                                                  {"limit", "limit"},
                                                                  {"limit=+1", "limit"},
                                                                  {"limit=1x", "limit"},
                                                                  {"limit=18446744073709551617", "limit"},
                                                                  {"limit=1&limit=1", "limit"},
                                                                  {"after_id=", "after_id"},
                                                                  {"before_id", "before_id"},
                                                                  {"after_id=a&after_id=b", "after_id"},
                                                                  {"after_id=%g1", "after_id"},
                                                                  {"after_id=a&before_id=b", "before_id"}}) {
    const auto e = anthropic_page(q);
    ASSERT_FALSE(e) << q;
    EXPECT_EQ(e.error().status, 400) << q;
    EXPECT_EQ(e.error().param, param) << q;
  }
}

TEST(AdminRouter, MatchesPatternsAndTellsAllowedMethods) {
  AdminRouter router;
  auto h = [](AdminRequest&) -> core::Task<AdminResponse> { co_return AdminResponse{}; };
  router.add("GET", "/admin/v1/keys", h);
  router.add("POST", "/admin/v1/keys", h);
  router.add("GET", "/admin/v1/keys/{id}", h);
  router.add("POST", "/admin/v1/keys/{id}/rotate", h);
  std::vector<std::string> params;
  EXPECT_TRUE(router.match("GET", "/admin/v1/keys", params).handler);
  auto m = router.match("POST", "/admin/v1/keys/vk_1/rotate", params);
  ASSERT_TRUE(m.handler);
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0], "vk_1");
  auto wrong = router.match("DELETE", "/admin/v1/keys", params);
  EXPECT_FALSE(wrong.handler);
  EXPECT_EQ(wrong.allow, "GET, HEAD, POST");  // (a GET route answers HEAD too)
  auto none = router.match("GET", "/admin/v1/keys/a/b", params);
  EXPECT_FALSE(none.handler);
  EXPECT_TRUE(none.allow.empty());
  EXPECT_TRUE(router.match("HEAD", "/admin/v1/keys/x", params).handler);
  // Parameters are percent-decoded after the split: an id may hold '/', '%' or '<'.
  ASSERT_TRUE(router.match("GET", "/admin/v1/keys/a%2Fb%3Cc%25%zz%4", params).handler);
  EXPECT_EQ(params.at(0), "a/b<c%%zz%4");
}

TEST(AdminServer, TokenIsCheckedAgainstItsHash) {
  boost::asio::io_context io;
  Shared shared;
  AdminConfig cfg;
  cfg.has_token = true;
  cfg.token_sha256 = auth::sha256("the-admin-token");
  AdminServer server(io, cfg, shared, nullptr);
  EXPECT_TRUE(server.check_token("Bearer the-admin-token"));
  EXPECT_TRUE(server.check_token("bearer  the-admin-token "));
  for (std::string_view bad : {"", "Bearer", "Bearer the-admin-toke", "Basic the-admin-token", "the-admin-token"}) {
    auto r = server.check_token(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().status, 401);
  }
}

// Stop 56: the scheme alone is no credential, as no header: never the empty string's hash compared with the
// token's (a token_sha256 of "" is refused at load, and an AdminConfig made otherwise still admits nobody).
TEST(AdminServer, TheBearerSchemeWithoutATokenIsNoCredential) {
  boost::asio::io_context io;
  Shared shared;
  AdminConfig cfg;
  cfg.has_token = true;
  cfg.token_sha256 = auth::sha256("");
  AdminServer server(io, cfg, shared, nullptr);
  for (std::string_view none : {"", "Bearer", "Bearer ", "bearer   ", "BEARER\t"}) {
    auto r = server.check_token(none);
    ASSERT_FALSE(r) << none;
    EXPECT_EQ(r.error().status, 401);
    EXPECT_NE(r.error().message.find("didn't provide an admin token"), std::string::npos) << r.error().message;
  }
}

struct StaticJwks final : auth::JwksSource {
  std::string body;
  void fetch(Callback done) override { done(body); }
  std::string describe() const override { return "static"; }
};

TEST(AdminServer, JwtWithTheAdminClaimIsAnAdmin) {
  boost::asio::io_context io;
  const auto& keys = auth::testing::Keys::get();
  auto src = std::make_unique<StaticJwks>();
  src->body = auth::testing::jwks_of({&keys.rsa});
  auth::JwksCache jwks(io, std::move(src), auth::JwksOptions{});
  jwks.start();
  io.poll();
  // (The file is read at load, as --check reads it; the keys come from `jwks`.)
  const std::string path = ::testing::TempDir() + "admin_jwt_jwks.json";
  std::ofstream(path) << auth::testing::jwks_of({&keys.rsa});
  auto loaded = load("auth:\n  jwt: {jwks_file: " + path + ", issuer: https://idp.test, audience: weir}\n");
  ASSERT_TRUE(loaded) << loaded.error().to_string();
  Shared shared;
  shared.auth_policy = auth::AuthPolicy::build(*loaded->auth);
  shared.jwks = &jwks;
  AdminConfig cfg;
  cfg.jwt_claim = "weir.admin";  // no static token: only the claim grants admin
  AdminServer server(io, cfg, shared, nullptr);
  const auto exp = auth::testing::unix_seconds(std::chrono::system_clock::now()) + 600;
  auto token = [&](std::string_view admin, std::string_view iss = "https://idp.test") {
    return "Bearer " +
           keys.rsa.token(fmt::format(R"({{"sub":"ops","iss":"{}","aud":"weir","exp":{},"weir":{{"admin":{}}}}})", iss,
                                      exp, admin));
  };
  EXPECT_TRUE(server.check_token(token("true")));
  auto no = server.check_token(token("false"));
  ASSERT_FALSE(no);
  EXPECT_NE(no.error().message.find("does not grant admin"), std::string::npos);
  // Only the JSON boolean true: a string an identity provider mapped from a user attribute is not.
  for (const char* v : {R"("true")", R"("True")", "1", R"(["true"])", R"({"v":true})", "null"}) {
    auto r = server.check_token(token(v));
    ASSERT_FALSE(r) << v;
    EXPECT_NE(r.error().message.find("does not grant admin"), std::string::npos) << v;
  }
  EXPECT_FALSE(server.check_token(token("true", "https://other.test")));  // verified like a client's token
  EXPECT_FALSE(server.check_token("Bearer not-a-token"));
  jwks.stop();
}

// Runs authorize() on `io` until it answers (the JWKS refresh timer keeps io.run() from returning).
tl::expected<void, AdminError> authorize_now(boost::asio::io_context& io, AdminServer& server,
                                             const std::string& authorization) {
  std::optional<tl::expected<void, AdminError>> got;
  boost::asio::co_spawn(io, server.authorize(authorization), [&](std::exception_ptr e, auto r) {
    if (!e) got = std::move(r);
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!got && std::chrono::steady_clock::now() < until) io.run_one_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(got);
  return got ? *got : tl::unexpected(AdminError{});
}

TEST(AdminServer, AnAdminJwtWithANewKidRefetchesTheKeySetAsTheClientPortDoes) {
  // check_token took the cached key set as it was: an admin JWT signed with the identity provider's new
  // key got 401 "token kid is not in the key set" until a client request (or the periodic refresh) refetched it.
  boost::asio::io_context io;
  const auto& keys = auth::testing::Keys::get();
  auto owned = std::make_unique<StaticJwks>();
  StaticJwks* src = owned.get();
  src->body = auth::testing::jwks_of({&keys.rsa});
  auth::JwksOptions opts;
  opts.min_refetch_interval = std::chrono::milliseconds(200);
  auth::JwksCache jwks(io, std::move(owned), opts);
  jwks.start();
  io.poll();
  const std::string path = ::testing::TempDir() + "admin_jwt_newkid_jwks.json";
  std::ofstream(path) << auth::testing::jwks_of({&keys.rsa});
  auto loaded = load("auth:\n  jwt: {jwks_file: " + path + ", issuer: https://idp.test, audience: weir}\n");
  ASSERT_TRUE(loaded) << loaded.error().to_string();
  Shared shared;
  shared.auth_policy = auth::AuthPolicy::build(*loaded->auth);
  shared.jwks = &jwks;
  AdminConfig cfg;
  cfg.jwt_claim = "weir.admin";
  AdminServer server(io, cfg, shared, nullptr);
  const auto exp = auth::testing::unix_seconds(std::chrono::system_clock::now()) + 600;
  const std::string claims =
      fmt::format(R"({{"sub":"ops","iss":"https://idp.test","aud":"weir","exp":{},"weir":{{"admin":true}}}})", exp);
  const std::string by_ec = "Bearer " + keys.ec.token(claims);
  const std::string by_ed = "Bearer " + keys.ed.token(claims);

  // The identity provider publishes its new key; the first admin request signed with it is an admin.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past the start-up fetch's refetch floor
  src->body = auth::testing::jwks_of({&keys.rsa, &keys.ec});
  const auto fetches = jwks.stats().fetches;
  EXPECT_TRUE(authorize_now(io, server, by_ec));
  EXPECT_EQ(jwks.stats().fetches, fetches + 1);
  // Under the client port's rate limit: right after a refetch (here the client port's), an unknown kid is
  // refused at once, without another fetch.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  ASSERT_TRUE(jwks.request_refresh());
  io.poll();
  src->body = auth::testing::jwks_of({&keys.rsa, &keys.ec, &keys.ed});
  const auto before = jwks.stats().fetches;
  auto limited = authorize_now(io, server, by_ed);
  ASSERT_FALSE(limited);
  EXPECT_NE(limited.error().message.find("kid"), std::string::npos) << limited.error().message;
  EXPECT_EQ(jwks.stats().fetches, before);
  // Once the interval passed, it refetches and passes.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_TRUE(authorize_now(io, server, by_ed));
  jwks.stop();
}

TEST(AdminServer, AKeyChangeAStalledWorkerHasNotInstalledIsA202NotASuccessThatClaimsMore) {
  // The answer came when the 2 s timer fired, whether or not every worker had installed the change: a key
  // create on a stalled worker answered 201, as if the key worked everywhere.
  boost::asio::io_context control;  // (declared first: destroyed after the worker's queue that points at it)
  auto loaded =
      load("auth:\n  api_keys: [{id: cfg, tenant: acme, sha256: " + auth::to_hex(auth::sha256("sk-cfg")) + "}]\n");
  ASSERT_TRUE(loaded) << loaded.error().to_string();
  KeyStore store(*loaded->auth, "");
  admission::LocalLimiter limiter(store.policy()->scopes(), 1, std::chrono::steady_clock::now());
  store.set_limiter(&limiter);
  Shared shared;
  std::string err;
  shared.log_sink = core::AccessLogSink::open("off", err);
  GenerationInput in;
  in.config = std::make_shared<const core::Config>(loaded->config);
  in.policy = store.policy().get();
  auto gen = build_generation(std::move(in), nullptr);
  ASSERT_TRUE(gen) << gen.error();
  shared.generation = *gen;
  shared.auth_policy = store.policy();
  shared.limiter = &limiter;
  Worker stalled(shared, 0);  // never started: its loop runs nothing until polled below
  shared.workers = {&stalled};
  AdminConfig cfg;
  cfg.listen.port = 0;
  cfg.has_token = true;
  cfg.token_sha256 = auth::sha256("the-admin-token");
  AdminServer server(control, cfg, shared, &store);
  const std::uint16_t port = server.listen(/*exclusive=*/false, err);
  ASSERT_NE(port, 0) << err;
  server.start();
  std::thread control_thread([&] { control.run(); });

  boost::asio::io_context client_io;
  boost::asio::ip::tcp::socket sock(client_io);
  sock.connect({boost::asio::ip::make_address("127.0.0.1"), port});
  const std::string body = R"({"tenant":"acme"})";
  const std::string request = fmt::format(
      "POST /admin/v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer the-admin-token\r\n"
      "Connection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
      body.size(), body);
  boost::asio::write(sock, boost::asio::buffer(request));
  std::string answer;
  boost::system::error_code ec;
  boost::asio::read(sock, boost::asio::dynamic_buffer(answer), ec);  // until the server closes
  server.stop();
  control.stop();
  control_thread.join();

  ASSERT_TRUE(answer.starts_with("HTTP/1.1 202 ")) << answer;
  const auto o = json::parse(answer.substr(answer.find("\r\n\r\n") + 4)).as_object();
  EXPECT_EQ(o.at("pending_workers").as_int64(), 1);
  const std::string secret(o.at("key").as_string());  // the secret still comes back: it is shown nowhere else
  ASSERT_TRUE(secret.starts_with("sk-weir-"));
  EXPECT_EQ(store.keys().size(), 1u);  // saved
  // The stalled worker installs it once its loop runs again.
  EXPECT_FALSE(stalled.authenticator()->authenticate("Bearer " + secret, "", auth::WallClock::now()));
  stalled.io().poll();
  EXPECT_TRUE(stalled.authenticator()->authenticate("Bearer " + secret, "", auth::WallClock::now()));
}

TEST(RunBlocking, RunsOffTheCallingThreadAndResumesOnIt) {
  boost::asio::io_context io;
  boost::asio::thread_pool pool(1);
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on, resumed_on;
  int result = 0;
  boost::asio::co_spawn(
      io,
      [&]() -> core::Task<void> {
        result = co_await run_blocking(pool, [&] {
          ran_on = std::this_thread::get_id();
          return 42;
        });
        resumed_on = std::this_thread::get_id();
      },
      boost::asio::detached);
  io.run();
  pool.join();
  EXPECT_EQ(result, 42);
  EXPECT_NE(ran_on, caller);
  EXPECT_EQ(resumed_on, caller);
}

// The upstream's model list written again (one model's object, or the list a key may see) keeps an integer
// beyond 64 bits exactly: Boost.JSON holds it as a double, which would be written 1.8446744073709552E19.
TEST(UpstreamModels, AModelsObjectKeepsIntegersBeyond64Bits) {
  const std::string list =
      R"({"object":"list","data":[{"id":"m","object":"model","max_model_len":18446744073709551617},)"
      R"({"id":"n","object":"model","max_model_len":1.5}]})";
  const auto r = upstream_models_response(list, "/v1/models/m", nullptr);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, R"({"id":"m","object":"model","max_model_len":18446744073709551617})");
  const auto plain =
      upstream_models_response(R"({"object":"list","data":[{"id":"m","n":1}]})", "/v1/models/m", nullptr);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(*plain, R"({"id":"m","n":1})");
}

// Stop 59: an expires_at a JSON double past int64 (1e30, -1e30, 1e19, 9.3e18) threw std::out_of_range from
// std::stoll: the admin connection dropped, a keys file with it aborted start-up. Each is a 400 (a keys file:
// an invalid file, said), and a whole double within range is still Unix seconds.
TEST(KeyStore, AnExpiryPastInt64IsRefusedNeverThrown) {
  KeyStore store(base_auth(), "");
  for (const char* v : {"1e30", "-1e30", "1e19", "9.3e18", "-9.3e18", "1.8446744073709552e19", "1e300", "-1e300",
                        "253402300800", "2.534023008e11", "0.0", "-0.0", "-1", "-9223372036854775808",
                        "9223372036854775807", "9223372036854775808", "18446744073709551615"}) {
    auto r = store.create(obj(std::string(R"({"tenant":"acme","expires_at":)") + v + "}"), 1);
    ASSERT_FALSE(r) << v;
    EXPECT_EQ(r.error().status, 400) << v;
    EXPECT_EQ(r.error().param, "expires_at") << v;
  }
  auto a = store.create(obj(R"({"tenant":"acme","expires_at":2e9})"), 1);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->record.expires_at, 2000000000);
  auto b = store.create(obj(R"({"tenant":"acme","expires_at":2.534023007990e11})"), 1);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->record.expires_at, 253402300799);
  auto u = store.update(a->record.id, obj(R"({"expires_at":1e19})"));
  ASSERT_FALSE(u);
  EXPECT_EQ(u.error().param, "expires_at");

  const auto dir = std::filesystem::temp_directory_path() / ("weir-keys-expiry59-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.json").string();
  std::ofstream(file) << R"({"version":1,"keys":[{"id":"vk_1","tenant":"acme","sha256":")" << std::string(64, 'a')
                      << R"(","expires_at":1e30}]})";
  KeyStore f(base_auth(), file);
  auto loaded = f.load();
  ASSERT_FALSE(loaded);
  EXPECT_NE(loaded.error().find("keys[0]: expires_at: "), std::string::npos) << loaded.error();
  std::filesystem::remove_all(dir);
}

// Stop 59: JSON Schema's maxLength (the OpenAPI file's 256 for a key's name) counts characters, not bytes.
TEST(KeyStore, ANamesLimitIsInCharacters) {
  KeyStore store(base_auth(), "");
  std::string e256;
  for (int i = 0; i < 256; ++i) e256 += "\u00e9";  // 512 bytes
  auto a = store.create(obj(R"({"tenant":"acme","name":")" + e256 + "\"}"), 1);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(a->record.name, e256);
  auto b = store.create(obj(R"({"tenant":"acme","name":")" + e256 + "x\"}"), 1);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().param, "name");
  EXPECT_NE(b.error().message.find("at most 256 characters"), std::string::npos) << b.error().message;
  EXPECT_FALSE(store.create(obj(R"({"tenant":"acme","name":")" + std::string(257, 'a') + "\"}"), 1));
  EXPECT_TRUE(store.create(obj(R"({"tenant":"acme","name":")" + std::string(256, 'a') + "\"}"), 1));
}

TEST(AdminServer, FindsTheFirstQueryParameter) {
  EXPECT_FALSE(AdminServer::first_query_parameter(""));
  EXPECT_FALSE(AdminServer::first_query_parameter("&&"));
  EXPECT_EQ(AdminServer::first_query_parameter("tenant=nobody"), "tenant");
  EXPECT_EQ(AdminServer::first_query_parameter("&limit"), "limit");
  EXPECT_EQ(AdminServer::first_query_parameter("=x&y=1"), "");
}

}  // namespace
}  // namespace weir::gateway
