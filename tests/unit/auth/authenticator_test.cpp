#include "auth/authenticator.hpp"

#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "auth/config.hpp"
#include "jwt_test_util.hpp"

namespace weir::auth {
namespace {

using namespace std::chrono_literals;
using testing::jwks_of;
using testing::Keys;
using testing::TestKey;

const WallTime kNow = WallTime(std::chrono::seconds(1'800'000'000));
// The JWKS refetch floor's steady clock (JwksOptions::clock), moved by hand:
// kMonoNow is the steady time of kNow.
const MonoTime kMonoNow = MonoTime(std::chrono::hours(1000));
MonoTime g_mono = kMonoNow;
MonoTime fake_mono() { return g_mono; }
constexpr std::int64_t kNowS = 1'800'000'000;
constexpr std::string_view kAcmeKey = "sk-acme-0123456789abcdef";
constexpr std::string_view kBetaKey = "sk-beta-fedcba9876543210";

const char* fake_env(const char* name) { return std::string_view(name) == "BETA_KEY" ? kBetaKey.data() : nullptr; }

std::string config_yaml(bool required = true, std::string jwt_extra = "") {
  return fmt::format(R"(
tenants:
  acme:
    models: [gpt-4o-mini, "meta-llama/*"]
    tier: pro
    priority: 10
  beta:
    tier: free
auth:
  required: {}
  jwt:
    jwks_file: /nonexistent/jwks.json
    issuer: https://issuer.test
    audience: [weir, other]
    tier_claim: plan
    min_refetch_interval: 30s
{}
  api_keys:
    - id: acme-prod
      sha256: {}
      tenant: acme
    - id: beta-env
      key_env: BETA_KEY
      tenant: beta
      models: [small-model]
)",
                     required, jwt_extra, to_hex(sha256(kAcmeKey)));
}

std::shared_ptr<const AuthPolicy> make_policy(bool required = true, std::string jwt_extra = "") {
  auto cfg = parse_auth_config(YAML::Load(config_yaml(required, jwt_extra)), "test.yaml", &fake_env);
  EXPECT_TRUE(cfg) << cfg.error().to_string();
  return AuthPolicy::build(std::move(*cfg));
}

// A JWKS source the test drives by hand.
struct FakeSource final : JwksSource {
  std::string body;
  bool down = false;
  int fetches = 0;
  void fetch(Callback done) override {
    ++fetches;
    if (down)
      done(tl::unexpected(std::string("connection refused")));
    else
      done(body);
  }
  std::string describe() const override { return "fake"; }
};

std::string claims(std::string tenant = R"("acme")", std::int64_t exp_offset = 600) {
  return fmt::format(
      R"({{"sub":"user-1","iss":"https://issuer.test","aud":"weir","exp":{},"tenant":{},"plan":"gold"}})",
      kNowS + exp_offset, tenant);
}

struct AuthJwtFlow : ::testing::Test {
  boost::asio::io_context control;
  FakeSource* source = nullptr;
  std::unique_ptr<JwksCache> jwks;
  std::unique_ptr<Authenticator> auth;

  void SetUp() override {
    auto src = std::make_unique<FakeSource>();
    source = src.get();
    const auto& k = Keys::get();
    source->body = jwks_of({&k.rsa, &k.ec});
    JwksOptions opt;
    opt.min_refetch_interval = 30s;
    opt.clock = &fake_mono;
    g_mono = kMonoNow - 60s;  // the startup fetch happened a minute ago
    jwks = std::make_unique<JwksCache>(control, std::move(src), opt);
    jwks->start();  // first fetch completes synchronously with the fake source
    control.poll();
    g_mono = kMonoNow;
    auth = std::make_unique<Authenticator>(make_policy(), jwks.get());
  }
  void TearDown() override { jwks->stop(); }

  // At `now`, the steady clock as far past kMonoNow as `now` is past kNow.
  tl::expected<PrincipalPtr, core::Error> bearer(const std::string& token, WallTime now = kNow) {
    g_mono = kMonoNow + (now - kNow);
    return auth->authenticate("Bearer " + token, "", now);
  }
  // At wall time `wall` and steady time `mono` (a step of the wall clock).
  tl::expected<PrincipalPtr, core::Error> bearer_at(const std::string& token, WallTime wall, MonoTime mono) {
    g_mono = mono;
    return auth->authenticate("Bearer " + token, "", wall);
  }
};

TEST(AuthAuthenticator, ApiKeyInBearerOrXApiKey) {
  Authenticator a(make_policy(), nullptr);
  auto p1 = a.authenticate(fmt::format("Bearer {}", kAcmeKey), "", kNow);
  ASSERT_TRUE(p1) << p1.error().message;
  EXPECT_EQ((*p1)->kind, CredentialKind::api_key);
  EXPECT_EQ((*p1)->tenant_name(), "acme");
  EXPECT_EQ((*p1)->key_id(), "acme-prod");
  EXPECT_EQ((*p1)->tier, "pro");
  EXPECT_EQ((*p1)->priority(), 10);
  auto p2 = a.authenticate("", kAcmeKey, kNow);
  ASSERT_TRUE(p2);
  EXPECT_EQ(p1->get(), p2->get());  // one principal per key and worker: no per-request copies
  auto p3 = a.authenticate("bearer   " + std::string(kBetaKey) + " ", "", kNow);  // scheme is case-insensitive
  ASSERT_TRUE(p3);
  EXPECT_EQ((*p3)->tenant_name(), "beta");
  EXPECT_EQ((*p3)->tier, "free");
  EXPECT_EQ(a.stats().api_key_hits, 3u);
}

TEST(AuthAuthenticator, UnknownOrMissingCredentialIs401AndNeverEchoed) {
  Authenticator a(make_policy(), nullptr);
  for (auto [authz, xkey] :
       std::initializer_list<std::pair<std::string_view, std::string_view>>{{"Bearer sk-wrong-secret-value", ""},
                                                                            {"", "sk-wrong-secret-value"},
                                                                            {"", ""},
                                                                            {"Bearer ", ""},
                                                                            {"Basic dXNlcjpwYXNz", ""},
                                                                            {"Bearer sk-acme-0123456789abcdeX", ""}}) {
    auto r = a.authenticate(authz, xkey, kNow);
    ASSERT_FALSE(r) << authz << "|" << xkey;
    EXPECT_EQ(r.error().status, 401);
    EXPECT_EQ(r.error().code, "invalid_api_key");
    EXPECT_EQ(r.error().message.find("wrong-secret"), std::string::npos);
    EXPECT_EQ(core::error_json(r.error()).find("dXNlcjpwYXNz"), std::string::npos);
  }
  // A non-Bearer Authorization falls back to x-api-key when one is given.
  EXPECT_TRUE(a.authenticate("Basic dXNlcjpwYXNz", kAcmeKey, kNow));
  EXPECT_FALSE(a.authenticate("", std::string(2000, 'k'), kNow));
  EXPECT_EQ(a.stats().rejected, 7u);
}

TEST(AuthAuthenticator, AnonymousWhenNotRequired) {
  Authenticator a(make_policy(false), nullptr);
  auto p = a.authenticate("", "", kNow);
  ASSERT_TRUE(p);
  EXPECT_EQ((*p)->kind, CredentialKind::anonymous);
  EXPECT_EQ((*p)->tenant_name(), "anonymous");
  EXPECT_FALSE(a.authenticate("Bearer sk-wrong", "", kNow));  // a wrong key is still refused
}

TEST(AuthAuthenticator, ModelAllowListIs403WithOpenAIShape) {
  Authenticator a(make_policy(), nullptr);
  auto acme = *a.authenticate("", kAcmeKey, kNow);
  EXPECT_TRUE(Authenticator::check_model(*acme, "gpt-4o-mini"));
  EXPECT_TRUE(Authenticator::check_model(*acme, "meta-llama/Llama-3.1-8B-Instruct"));
  auto denied = Authenticator::check_model(*acme, "gpt-4o");
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().status, 403);
  EXPECT_EQ(core::error_json(denied.error()),
            R"({"error":{"message":"The model `gpt-4o` is not available to tenant `acme`.",)"
            R"("type":"permission_error","param":null,"code":"model_not_allowed"}})");
  auto beta = *a.authenticate("", kBetaKey, kNow);  // tenant allows all, the key narrows to one
  EXPECT_TRUE(Authenticator::check_model(*beta, "small-model"));
  auto narrowed = Authenticator::check_model(*beta, "gpt-4o-mini");
  ASSERT_FALSE(narrowed);
  // The key's list refused it, not the tenant's: the message says so.
  EXPECT_NE(narrowed.error().message.find("not available to API key `"), std::string::npos) << narrowed.error().message;
}

TEST(AuthAuthenticator, NoModelOnlyForAPrincipalThatMayUseEveryModel) {
  // A request without a model goes to the default pool, whose upstream picks the model: a tenant or key
  // restricted to some models must not get it through (a model "" matches no list entry by accident either).
  Authenticator a(make_policy(), nullptr);
  auto acme = *a.authenticate("", kAcmeKey, kNow);  // tenant restricted
  auto denied = Authenticator::check_model(*acme, "");
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().status, 403);
  EXPECT_EQ(denied.error().code, "model_not_allowed");
  EXPECT_NE(denied.error().message.find("tenant `acme` may use only some"), std::string::npos)
      << denied.error().message;
  auto beta = *a.authenticate("", kBetaKey, kNow);  // tenant allows all, the key narrows
  auto narrowed = Authenticator::check_model(*beta, "");
  ASSERT_FALSE(narrowed);
  EXPECT_NE(narrowed.error().message.find("API key `"), std::string::npos) << narrowed.error().message;
  Authenticator open(make_policy(false), nullptr);
  auto anon = *open.authenticate("", "", kNow);  // anonymous: every model
  EXPECT_TRUE(Authenticator::check_model(*anon, ""));
}

TEST(AuthModelList, AnEmptyListAllowsNothingAndOnlyStarOrNoListAllowsAll) {
  EXPECT_TRUE(ModelList().allows("any"));  // a tenant that names no list
  EXPECT_FALSE(ModelList(std::vector<std::string>{}).allows("any"));
  EXPECT_FALSE(ModelList(std::vector<std::string>{}).allows_all());
  EXPECT_TRUE(ModelList({"m", "*"}).allows("any"));
  EXPECT_TRUE(ModelList({"meta/*"}).allows("meta/x"));
  EXPECT_FALSE(ModelList({"meta/*"}).allows("metax"));
  // Through the configuration: `models: []` on a tenant or a key locks it out; omitted keeps every model.
  auto cfg = parse_auth_config(YAML::Load(fmt::format(R"(
tenants:
  locked: {{models: []}}
  open: {{}}
auth:
  api_keys:
    - {{id: k1, sha256: {}, tenant: open, models: []}}
)",
                                                      to_hex(sha256(kAcmeKey)))),
                               "test.yaml", &fake_env);
  ASSERT_TRUE(cfg) << cfg.error().to_string();
  auto policy = AuthPolicy::build(std::move(*cfg));
  EXPECT_FALSE(policy->find_tenant("locked")->models.allows("m"));
  EXPECT_TRUE(policy->find_tenant("open")->models.allows("m"));
  Authenticator a(policy, nullptr);
  auto k = *a.authenticate("", kAcmeKey, kNow);
  EXPECT_FALSE(Authenticator::check_model(*k, "m"));
}

TEST_F(AuthJwtFlow, NoTokenMayNameTheImplicitAnonymousTenant) {
  // "anonymous" is made for requests without credentials (auth.required: false): a token naming it is
  // refused like one naming an unconfigured tenant, never given its unlimited, all-models policy.
  auto r = bearer(Keys::get().rsa.token(claims(R"("anonymous")")));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 403);
  EXPECT_EQ(r.error().code, "tenant_not_allowed");
}

TEST_F(AuthJwtFlow, RefusedTokenKeepsTheIdentityItNamesForTheLog) {
  // A verified token whose tenant is not configured: 403, and the access log
  // can still say who asked (the subject) and for which tenant.
  auto r = bearer(Keys::get().rsa.token(claims(R"("ghost")")));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 403);
  ASSERT_TRUE(auth->refused_identity());
  EXPECT_EQ(auth->refused_identity()->tenant, "ghost");
  EXPECT_EQ(auth->refused_identity()->subject, "user-1");
  EXPECT_EQ(auth->refused_identity()->key_id, "");
  // A signed token that expired names who it is for (its claims are authentic).
  ASSERT_FALSE(bearer(Keys::get().rsa.token(claims(R"("acme")", -3600))));
  ASSERT_TRUE(auth->refused_identity());
  EXPECT_EQ(auth->refused_identity()->tenant, "acme");
  EXPECT_EQ(auth->refused_identity()->subject, "user-1");
  // A token whose signature does not verify vouches for no one; a success clears it.
  auto forged = Keys::get().rsa.token(claims());
  forged.replace(forged.size() - 4, 4, forged.ends_with("AAAA") ? "BBBB" : "AAAA");
  ASSERT_FALSE(bearer(forged));
  EXPECT_FALSE(auth->refused_identity());
  ASSERT_FALSE(bearer(Keys::get().rsa.token(claims(R"("ghost")"))));
  ASSERT_TRUE(bearer(Keys::get().rsa.token(claims())));
  EXPECT_FALSE(auth->refused_identity());
}

TEST_F(AuthJwtFlow, VerifiesOnceThenHitsTheCache) {
  const auto token = Keys::get().rsa.token(claims());
  auto p1 = bearer(token);
  ASSERT_TRUE(p1) << p1.error().message;
  EXPECT_EQ((*p1)->kind, CredentialKind::jwt);
  EXPECT_EQ((*p1)->tenant_name(), "acme");
  EXPECT_EQ((*p1)->subject, "user-1");
  EXPECT_EQ((*p1)->tier, "gold");
  auto p2 = bearer(token, kNow + 10s);
  ASSERT_TRUE(p2);
  EXPECT_EQ(p1->get(), p2->get());
  EXPECT_EQ(auth->stats().jwt_verified, 1u);
  EXPECT_EQ(auth->stats().jwt_cache_hits, 1u);
  // x-api-key may carry a JWT too.
  EXPECT_TRUE(auth->authenticate("", token, kNow));
  EXPECT_EQ(auth->stats().jwt_cache_hits, 2u);
}

TEST_F(AuthJwtFlow, CachedTokenExpiresAtExpPlusLeeway) {
  const auto token = Keys::get().ec.token(claims(R"("acme")", 100));
  ASSERT_TRUE(bearer(token));
  EXPECT_TRUE(bearer(token, kNow + 159s));  // exp 100 s + leeway 60 s
  auto r = bearer(token, kNow + 160s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 401);
  EXPECT_NE(r.error().message.find("expired"), std::string::npos);
  EXPECT_EQ(auth->stats().jwt_cache_hits, 1u);
}

TEST_F(AuthJwtFlow, InvalidTokensAre401) {
  const auto& k = Keys::get();
  auto r = bearer(k.rsa.token(claims(R"("acme")", -3600)));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 401);
  TestKey confused = TestKey::hmac(k.rsa.kid, k.rsa.public_pem());
  r = bearer(confused.token(claims()));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 401);
  EXPECT_EQ(auth->stats().jwt_verified, 0u);
}

TEST_F(AuthJwtFlow, TenantComesFromTheClaim) {
  const auto& k = Keys::get();
  auto beta = bearer(k.rsa.token(claims(R"("beta")")));
  ASSERT_TRUE(beta);
  EXPECT_EQ((*beta)->tenant_name(), "beta");
  auto unknown = bearer(k.rsa.token(claims(R"("nobody")")));
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().status, 403);
  auto missing = bearer(k.rsa.token(claims("null")));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().status, 403);
  // With default_tenant, a token without the claim lands there.
  Authenticator with_default(make_policy(true, "    default_tenant: beta"), jwks.get());
  auto d = with_default.authenticate("Bearer " + k.rsa.token(claims("null")), "", kNow);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ((*d)->tenant_name(), "beta");
  // A claim that is there but names no tenant is refused, not given the default's rights.
  for (const char* bad : {R"("")", "7", R"({"name":"acme"})", R"(["acme"])", "true"}) {
    SCOPED_TRACE(bad);
    auto r = with_default.authenticate("Bearer " + k.rsa.token(claims(bad)), "", kNow);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().status, 403);
    EXPECT_EQ(r.error().code, "tenant_not_allowed");
    EXPECT_NE(r.error().message.find("does not name a tenant"), std::string::npos) << r.error().message;
  }
}

TEST_F(AuthJwtFlow, UnknownKidTriggersOneRateLimitedRefetch) {
  TestKey rotated = TestKey::ed("ed-rotated");
  const auto token = rotated.token(claims());
  EXPECT_EQ(source->fetches, 1);
  auto r = bearer(token);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 401);  // no waiting on I/O: refused now, refetch in the background
  const auto& k = Keys::get();
  source->body = jwks_of({&k.rsa, &k.ec, &rotated});
  control.poll();
  EXPECT_EQ(source->fetches, 2);
  EXPECT_TRUE(bearer(token));

  // Another unknown kid within min_refetch_interval: refused, no fetch.
  TestKey other = TestKey::ed("ed-other");
  EXPECT_FALSE(bearer(other.token(claims()), kNow + 10s));
  EXPECT_FALSE(bearer(other.token(claims()), kNow + 20s));
  control.poll();
  EXPECT_EQ(source->fetches, 2);
  EXPECT_EQ(jwks->stats().refresh_limited, 2u);
  // After the interval, the next miss fetches again.
  EXPECT_FALSE(bearer(other.token(claims()), kNow + 31s));
  control.poll();
  EXPECT_EQ(source->fetches, 3);
  EXPECT_EQ(jwks->stats().refresh_requests, 2u);
}

TEST_F(AuthJwtFlow, AWallClockStepNeitherBlocksNorHastensARefetch) {
  // The refetch floor was kept in wall-clock time: after the clock stepped
  // back an hour (NTP, an operator), every unknown kid was refused without a
  // fetch for that hour. It is kept in steady time now.
  TestKey rotated = TestKey::ed("ed-rotated");
  const auto& k = Keys::get();
  EXPECT_FALSE(bearer(rotated.token(claims())));  // refetch at kNow: the floor is 30 s on
  control.poll();
  EXPECT_EQ(source->fetches, 2);
  // 31 s later on the steady clock, the wall clock an hour back: the next miss fetches.
  source->body = jwks_of({&k.rsa, &k.ec, &rotated});
  TestKey other = TestKey::ed("ed-other");
  const WallTime back = kNow - 1h;
  EXPECT_FALSE(bearer_at(other.token(claims()), back, kMonoNow + 31s));
  control.poll();
  EXPECT_EQ(source->fetches, 3);
  EXPECT_TRUE(bearer_at(rotated.token(claims()), back, kMonoNow + 31s));
  // A step forward by an hour 10 s later: still under the floor, no fetch.
  const WallTime ahead = kNow + 1h;
  EXPECT_FALSE(bearer_at(other.token(claims(R"("acme")", 7200)), ahead, kMonoNow + 41s));
  control.poll();
  EXPECT_EQ(source->fetches, 3);
  EXPECT_EQ(jwks->stats().refresh_limited, 1u);
}

TEST_F(AuthJwtFlow, SourceDownKeepsCachedKeys) {
  const auto& k = Keys::get();
  source->down = true;
  TestKey stranger = TestKey::ec("unknown");
  EXPECT_FALSE(bearer(stranger.token(claims())));  // asks for a refetch that fails
  control.poll();
  EXPECT_EQ(jwks->stats().failures, 1u);
  EXPECT_EQ(jwks->keys()->keys.size(), 2u);
  EXPECT_TRUE(bearer(k.ec.token(claims())));  // a fresh token, verified with the kept keys
  source->down = false;
  source->body = "{not json";
  EXPECT_TRUE(jwks->request_refresh(kMonoNow + 60s));
  control.poll();
  EXPECT_EQ(jwks->stats().failures, 2u);
  EXPECT_TRUE(bearer(k.rsa.token(claims())));
}

TEST_F(AuthJwtFlow, KeySetChangeDropsCachedTokens) {
  const auto& k = Keys::get();
  const auto token = k.rsa.token(claims());
  ASSERT_TRUE(bearer(token));
  ASSERT_TRUE(bearer(token));
  // Same document again: nothing changes, the cache stays.
  EXPECT_TRUE(jwks->request_refresh(kMonoNow + 60s));
  control.poll();
  const auto gen = jwks->generation();
  EXPECT_TRUE(bearer(token));
  EXPECT_EQ(auth->stats().jwt_cache_hits, 2u);
  // The RSA key is withdrawn: its cached tokens stop working.
  source->body = jwks_of({&k.ec});
  EXPECT_TRUE(jwks->request_refresh(kMonoNow + 120s));
  control.poll();
  EXPECT_GT(jwks->generation(), gen);
  auto r = bearer(token);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 401);
}

// A JWKS source whose fetches the test answers by hand (a remote IdP: the fetch stays in flight meanwhile).
struct HeldSource final : JwksSource {
  std::vector<Callback> held;
  void fetch(Callback done) override { held.push_back(std::move(done)); }
  std::string describe() const override { return "held"; }
  void answer(std::string body) {
    auto done = std::move(held.front());
    held.erase(held.begin());
    done(std::move(body));
  }
};

TEST(AuthJwksCache, AnUnknownKidJoinsTheFetchInFlightInsteadOfBeingRefused) {
  // A rotation's burst: only the request that won the refetch waited for it; the rest, refused by the floor
  // it had just set, got 401 at once though the fetch brought their key moments later.
  boost::asio::io_context control;
  auto work = boost::asio::make_work_guard(control);  // (poll() with no work would stop it for good)
  auto src = std::make_unique<HeldSource>();
  HeldSource* source = src.get();
  JwksOptions opt;
  opt.min_refetch_interval = 30s;
  opt.clock = &fake_mono;
  g_mono = kMonoNow;
  JwksCache cache(control, std::move(src), opt);
  cache.start();  // the start-up fetch, in flight
  ASSERT_EQ(source->held.size(), 1u);
  // Asking during it: wait for it (mark 0), start nothing.
  EXPECT_EQ(cache.fetch_for_unknown_kid(kMonoNow), std::optional<std::uint64_t>(0));
  EXPECT_EQ(cache.fetch_for_unknown_kid(kMonoNow), std::optional<std::uint64_t>(0));
  control.poll();
  EXPECT_EQ(cache.stats().fetches, 1u);
  EXPECT_EQ(cache.stats().refresh_joined, 2u);
  const auto& k = Keys::get();
  source->answer(jwks_of({&k.rsa}));
  EXPECT_EQ(cache.completed_fetches(), 1u);
  // The start-up fetch set no floor: a kid published just after it is fetched on demand at once.
  EXPECT_EQ(cache.fetch_for_unknown_kid(kMonoNow + 1s), std::optional<std::uint64_t>(1));
  // The burst's others, before the control thread started that refetch, and after: they join it.
  EXPECT_EQ(cache.fetch_for_unknown_kid(kMonoNow + 1s), std::optional<std::uint64_t>(1));
  control.poll();
  ASSERT_EQ(source->held.size(), 1u);
  EXPECT_EQ(cache.fetch_for_unknown_kid(kMonoNow + 1s), std::optional<std::uint64_t>(1));
  source->answer(jwks_of({&k.rsa, &k.ec}));
  EXPECT_EQ(cache.completed_fetches(), 2u);
  EXPECT_EQ(cache.stats().fetches, 2u);
  EXPECT_EQ(cache.stats().refresh_requests, 1u);
  // No fetch in flight and under the on-demand floor: refused at once (a flood of made-up kids).
  EXPECT_EQ(cache.fetch_for_unknown_kid(kMonoNow + 10s), std::nullopt);
  EXPECT_EQ(cache.stats().refresh_limited, 1u);
  control.poll();
  EXPECT_TRUE(source->held.empty());
  // A periodic (or reload's) fetch sets no floor either, and is joined.
  cache.refetch_now();
  EXPECT_EQ(cache.fetch_for_unknown_kid(kMonoNow + 11s), std::optional<std::uint64_t>(2));
  source->answer(jwks_of({&k.rsa, &k.ec}));
  EXPECT_EQ(cache.fetch_for_unknown_kid(kMonoNow + 31s), std::optional<std::uint64_t>(3));
  control.poll();
  ASSERT_EQ(source->held.size(), 1u);
  source->answer(jwks_of({&k.rsa, &k.ec}));
  cache.stop();
}

TEST(AuthAuthenticator, NoKeysLoadedIs503) {
  boost::asio::io_context control;
  auto src = std::make_unique<FakeSource>();
  src->down = true;
  JwksCache jwks(control, std::move(src), JwksOptions{});
  jwks.start();
  control.poll();
  Authenticator a(make_policy(), &jwks);
  auto r = a.authenticate("Bearer " + Keys::get().rsa.token(claims()), "", kNow);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 503);
  jwks.stop();
}

TEST(AuthTokenCache, BoundedLruWithExactMatch) {
  TokenCache c(8);  // two sets of four
  EXPECT_EQ(c.capacity(), 8u);
  auto p = std::make_shared<const Principal>();
  std::vector<std::string> tokens;
  for (int i = 0; i < 64; ++i) tokens.push_back(fmt::format("token-{}-{}", i, std::string(40, 'x')));
  for (const auto& t : tokens) c.insert(t, p, kNow + 60s);
  EXPECT_EQ(c.size(), 8u);
  int hits = 0;
  for (const auto& t : tokens) hits += c.find(t, kNow) != nullptr;
  EXPECT_EQ(hits, 8);
  // A token differing in one byte never hits.
  c.clear();
  c.insert(tokens[0], p, kNow + 60s);
  std::string near = tokens[0];
  near.back() = 'y';
  EXPECT_EQ(c.find(near, kNow), nullptr);
  EXPECT_NE(c.find(tokens[0], kNow), nullptr);
  EXPECT_EQ(c.find(tokens[0], kNow + 60s), nullptr);  // expired: dropped
  EXPECT_EQ(c.size(), 0u);
  TokenCache off(0);
  off.insert(tokens[0], p, kNow + 60s);
  EXPECT_EQ(off.find(tokens[0], kNow), nullptr);
}

TEST(AuthTokenCache, EvictsLeastRecentlyUsedInASet) {
  TokenCache c(4);  // one set
  auto p = std::make_shared<const Principal>();
  for (int i = 0; i < 4; ++i) c.insert(fmt::format("t{}", i), p, kNow + 60s);
  ASSERT_NE(c.find("t0", kNow), nullptr);  // t1 is now the oldest
  c.insert("t4", p, kNow + 60s);
  EXPECT_NE(c.find("t0", kNow), nullptr);
  EXPECT_EQ(c.find("t1", kNow), nullptr);
  EXPECT_NE(c.find("t4", kNow), nullptr);
}

}  // namespace
}  // namespace weir::auth
