#include "admission/admission.hpp"

#include <thread>

#include <limits>

#include <gtest/gtest.h>

#include "admission/local_limiter.hpp"
#include "auth/config.hpp"

namespace weir::admission {
namespace {

using namespace std::chrono_literals;
const Instant T0 = Instant(1000h);  // a fake steady clock: tests move it by hand

auth::AuthConfig config(auth::Limits tenant_limits, auth::Budget tenant_budget = {}, auth::Limits key_limits = {},
                        auth::Budget key_budget = {}) {
  auth::AuthConfig c;
  auth::TenantConfig t;
  t.name = "acme";
  t.limits = tenant_limits;
  t.budget = tenant_budget;
  c.tenants.emplace("acme", t);
  auth::ApiKeyConfig k;
  k.id = "acme-prod";
  k.sha256 = auth::sha256("sk-acme");
  k.tenant = "acme";
  k.limits = key_limits;
  k.budget = key_budget;
  c.api_keys.push_back(k);
  return c;
}

// A policy, a limiter for `workers`, and principals for the tenant (via JWT-like
// principal without key) and the key.
struct World {
  std::shared_ptr<const auth::AuthPolicy> policy;
  std::unique_ptr<LocalLimiter> limiter;
  Pricing pricing;
  auth::Principal tenant_only;
  auth::Principal with_key;

  World(auth::Limits tl, auth::Budget tb = {}, auth::Limits kl = {}, auth::Budget kb = {}, std::uint32_t workers = 1) {
    policy = auth::AuthPolicy::build(config(tl, tb, kl, kb));
    // The epoch is 2026-01-01T00:00:00Z: budget windows (UTC-aligned) start
    // at T0 - 1h, T0, T0 + 1h, ... for a period of 1h.
    limiter =
        std::make_unique<LocalLimiter>(policy->scopes(), workers, T0 - 1h, std::int64_t{1'767'225'600} * 1'000'000'000);
    tenant_only.kind = auth::CredentialKind::jwt;
    tenant_only.tenant = policy->find_tenant("acme");
    with_key = tenant_only;
    with_key.kind = auth::CredentialKind::api_key;
    with_key.key = &policy->keys()[0];
    pricing.set("m", ModelPrice{1'000'000, 2'000'000, 500'000});  // $1 / $2 / $0.5 per 1M tokens
  }
  World(auth::Limits tl, std::uint32_t workers) : World(tl, {}, {}, {}, workers) {}
  std::uint32_t tenant_scope() const { return policy->find_tenant("acme")->scope; }
  std::uint32_t key_scope() const { return policy->keys()[0].scope; }
};

auth::Limits rpm(std::uint64_t r, std::uint64_t burst = 0) {
  auth::Limits l;
  l.requests_per_minute = r;
  l.requests_burst = burst;
  return l;
}
auth::Limits tpm(std::uint64_t t) {
  auth::Limits l;
  l.tokens_per_minute = t;
  return l;
}
auth::Limits streams(std::uint64_t n) {
  auth::Limits l;
  l.max_concurrent_streams = n;
  return l;
}

TEST(AdmissionTokenBucket, BurstThenRefillOnAFakeClock) {
  World w(rpm(60));  // one per second, 60 deep
  Admission a(*w.limiter, w.pricing, 0);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(a.admit(w.tenant_only, "m", 0, T0)) << i;
  auto r = a.admit(w.tenant_only, "m", 0, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 429);
  EXPECT_EQ(r.error().code, "rate_limit_exceeded");
  EXPECT_EQ(r.error().type, "requests");
  EXPECT_EQ(r.error().retry_after_s, 1u);
  EXPECT_FALSE(a.admit(w.tenant_only, "m", 0, T0 + 999ms));
  EXPECT_TRUE(a.admit(w.tenant_only, "m", 0, T0 + 1s));
  EXPECT_FALSE(a.admit(w.tenant_only, "m", 0, T0 + 1s));
  // A long idle period refills to the depth, not beyond.
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(a.admit(w.tenant_only, "m", 0, T0 + 1h)) << i;
  EXPECT_FALSE(a.admit(w.tenant_only, "m", 0, T0 + 1h));
}

TEST(AdmissionTokenBucket, BurstSmallerThanTheRate) {
  World w(rpm(600, 5));  // 10 per second, 5 deep
  Admission a(*w.limiter, w.pricing, 0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a.admit(w.tenant_only, "m", 0, T0));
  EXPECT_FALSE(a.admit(w.tenant_only, "m", 0, T0));
  EXPECT_TRUE(a.admit(w.tenant_only, "m", 0, T0 + 100ms));
  EXPECT_FALSE(a.admit(w.tenant_only, "m", 0, T0 + 100ms));
  EXPECT_DOUBLE_EQ(w.limiter->available(w.tenant_scope(), Bucket::requests, T0 + 10s), 5.0);
}

TEST(AdmissionTokenBucket, RetryAfterComesFromTheTokenDeficit) {
  World w(tpm(6000));  // 100 tokens per second
  Admission a(*w.limiter, w.pricing, 0);
  ASSERT_TRUE(a.admit(w.tenant_only, "m", 6000, T0));
  auto r = a.admit(w.tenant_only, "m", 1000, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().type, "tokens");
  EXPECT_EQ(r.error().retry_after_s, 10u);
  r = a.admit(w.tenant_only, "m", 1000, T0 + 7500ms);  // 750 back, 250 short: 2.5 s -> 3
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().retry_after_s, 3u);
  EXPECT_TRUE(a.admit(w.tenant_only, "m", 1000, T0 + 10s));
  // More than the bucket can ever hold: refused with no retry hint.
  r = a.admit(w.tenant_only, "m", 6001, T0 + 1h);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().retry_after_s, 0u);
  EXPECT_NE(r.error().message.find("too large"), std::string::npos);
}

TEST(AdmissionTokenBucket, SettleReconcilesUpAndDown) {
  World w(tpm(6000));
  Admission a(*w.limiter, w.pricing, 0);
  const auto scope = w.tenant_scope();
  auto t = a.admit(w.tenant_only, "m", 1000, T0);
  ASSERT_TRUE(t);
  EXPECT_DOUBLE_EQ(w.limiter->available(scope, Bucket::tokens, T0), 5000);
  a.settle(*t, api::Usage{300, 200, 500, 0}, T0);  // used 500 of 1000: 500 back
  EXPECT_DOUBLE_EQ(w.limiter->available(scope, Bucket::tokens, T0), 5500);
  EXPECT_TRUE(t->settled());
  a.settle(*t, api::Usage{300, 200, 500, 0}, T0);  // a second settle does nothing
  EXPECT_DOUBLE_EQ(w.limiter->available(scope, Bucket::tokens, T0), 5500);

  auto t2 = a.admit(w.tenant_only, "m", 1000, T0);
  ASSERT_TRUE(t2);
  a.settle(*t2, api::Usage{1000, 2500, 3500, 0}, T0);  // 2500 over the estimate
  EXPECT_DOUBLE_EQ(w.limiter->available(scope, Bucket::tokens, T0), 2000);
  // Going into debt: the next request waits it out.
  auto t3 = a.admit(w.tenant_only, "m", 2000, T0);
  ASSERT_TRUE(t3);
  a.settle(*t3, api::Usage{2000, 3000, 5000, 0}, T0);
  EXPECT_DOUBLE_EQ(w.limiter->available(scope, Bucket::tokens, T0), -3000);
  auto r = a.admit(w.tenant_only, "m", 100, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().retry_after_s, 31u);  // 3100 tokens at 100/s
  // A refund never fills the bucket past its depth.
  auto t4 = a.admit(w.tenant_only, "m", 100, T0 + 1h);
  ASSERT_TRUE(t4);
  a.settle(*t4, api::Usage{}, T0 + 1h);
  EXPECT_DOUBLE_EQ(w.limiter->available(scope, Bucket::tokens, T0 + 1h), 6000);
}

TEST(AdmissionTokenBucket, ShardsBorrowSoOneWorkerCanUseTheWholeLimit) {
  World w(rpm(60), 4);  // 4 workers: 15 per shard
  Admission w0(*w.limiter, w.pricing, 0), w3(*w.limiter, w.pricing, 3);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(w0.admit(w.tenant_only, "m", 0, T0)) << i;
  EXPECT_FALSE(w0.admit(w.tenant_only, "m", 0, T0));
  EXPECT_FALSE(w3.admit(w.tenant_only, "m", 0, T0));  // nothing left anywhere
  // Refill is shared too: one second gives back one request in total (1/4 per shard).
  EXPECT_TRUE(w3.admit(w.tenant_only, "m", 0, T0 + 1s));
  EXPECT_FALSE(w0.admit(w.tenant_only, "m", 0, T0 + 1s));
}

TEST(AdmissionTokenBucket, ConcurrentWorkersNeverExceedTheBucket) {
  constexpr std::uint32_t kWorkers = 4;
  World w(tpm(100'000), kWorkers);
  std::atomic<std::uint64_t> admitted{0};
  std::vector<std::thread> threads;
  for (std::uint32_t i = 0; i < kWorkers; ++i)
    threads.emplace_back([&, i] {
      Admission a(*w.limiter, w.pricing, i);
      for (int n = 0; n < 20'000; ++n)
        if (auto t = a.admit(w.tenant_only, "m", 7, T0)) admitted += 7;
    });
  for (auto& t : threads) t.join();
  // 100000 / 7 = 14285 whole requests fit; contention may only make it fewer.
  EXPECT_LE(admitted.load(), 100'000u);
  EXPECT_GE(admitted.load(), 100'000u - 7 * kWorkers * 2);
}

TEST(AdmissionConcurrency, CapIsReleasedOnEveryPath) {
  World w(streams(2));
  Admission a(*w.limiter, w.pricing, 0);
  const auto scope = w.tenant_scope();
  {
    auto t1 = a.admit(w.tenant_only, "m", 10, T0);
    auto t2 = a.admit(w.tenant_only, "m", 10, T0);
    ASSERT_TRUE(t1 && t2);
    EXPECT_EQ(w.limiter->streams_in_use(scope), 2u);
    auto t3 = a.admit(w.tenant_only, "m", 10, T0);
    ASSERT_FALSE(t3);
    EXPECT_EQ(t3.error().status, 429);
    EXPECT_EQ(t3.error().retry_after_s, 1u);
    a.settle(*t1, api::Usage{}, T0);  // settle releases
    EXPECT_EQ(w.limiter->streams_in_use(scope), 1u);
    Ticket moved = std::move(*t2);  // moving keeps one slot, not two
    EXPECT_EQ(w.limiter->streams_in_use(scope), 1u);
    moved.release();  // explicit release, idempotent
    moved.release();
    EXPECT_EQ(w.limiter->streams_in_use(scope), 0u);
    auto t4 = a.admit(w.tenant_only, "m", 10, T0);
    ASSERT_TRUE(t4);
    EXPECT_EQ(w.limiter->streams_in_use(scope), 1u);
  }  // destruction (error path, disconnect) releases
  EXPECT_EQ(w.limiter->streams_in_use(scope), 0u);
}

TEST(AdmissionConcurrency, RefusalByALaterCheckGivesTheSlotBack) {
  auth::Limits l = streams(5);
  l.requests_per_minute = 1;
  World w(l);
  Admission a(*w.limiter, w.pricing, 0);
  auto t1 = a.admit(w.tenant_only, "m", 10, T0);
  ASSERT_TRUE(t1);
  auto t2 = a.admit(w.tenant_only, "m", 10, T0);
  ASSERT_FALSE(t2);  // refused by the requests bucket after taking a slot
  EXPECT_EQ(w.limiter->streams_in_use(w.tenant_scope()), 1u);
}

TEST(AdmissionConcurrency, SlotsAreBorrowedAcrossShards) {
  World w(streams(3), 2);  // shards hold 2 and 1
  Admission w0(*w.limiter, w.pricing, 0), w1(*w.limiter, w.pricing, 1);
  std::vector<Ticket> held;
  for (int i = 0; i < 3; ++i) {
    auto t = w1.admit(w.tenant_only, "m", 0, T0);
    ASSERT_TRUE(t) << i;
    held.push_back(std::move(*t));
  }
  EXPECT_FALSE(w0.admit(w.tenant_only, "m", 0, T0));
  held.clear();
  EXPECT_EQ(w.limiter->streams_in_use(w.tenant_scope()), 0u);
  for (int i = 0; i < 3; ++i) {
    auto t = w0.admit(w.tenant_only, "m", 0, T0);
    ASSERT_TRUE(t) << i;
    held.push_back(std::move(*t));
  }
  EXPECT_FALSE(w1.admit(w.tenant_only, "m", 0, T0));
}

TEST(AdmissionScopes, KeyLimitsApplyOnTopOfTheTenant) {
  World w(rpm(100), {}, rpm(2));
  Admission a(*w.limiter, w.pricing, 0);
  EXPECT_TRUE(a.admit(w.with_key, "m", 0, T0));
  EXPECT_TRUE(a.admit(w.with_key, "m", 0, T0));
  auto r = a.admit(w.with_key, "m", 0, T0);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("key `acme-prod`"), std::string::npos);
  // The refused request did not spend the tenant's bucket.
  EXPECT_DOUBLE_EQ(w.limiter->available(w.tenant_scope(), Bucket::requests, T0), 98);
  EXPECT_TRUE(a.admit(w.tenant_only, "m", 0, T0));  // the tenant without the key still goes
}

TEST(AdmissionBudget, SpendIsChargedAndExhaustionIsInsufficientQuota) {
  auth::Budget b;
  b.limit_nano_usd = 10'000'000;  // $0.01
  World w({}, b);
  Admission a(*w.limiter, w.pricing, 0);
  auto t = a.admit(w.tenant_only, "m", 100, T0);
  ASSERT_TRUE(t);
  // 4000 prompt of which 1000 cached, 2000 completion:
  // 3000 * $1/1M + 1000 * $0.5/1M + 2000 * $2/1M = $0.0075
  EXPECT_EQ(a.settle(*t, api::Usage{4000, 2000, 6000, 1000}, T0), 7'500'000);
  EXPECT_EQ(w.limiter->spent(w.tenant_scope(), T0), 7'500'000);
  t = a.admit(w.tenant_only, "m", 100, T0);
  ASSERT_TRUE(t);  // $0.0075 < $0.01: still admitted (the check is before the request)
  a.settle(*t, api::Usage{4000, 2000, 6000, 1000}, T0);
  auto r = a.admit(w.tenant_only, "m", 100, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 429);
  EXPECT_EQ(r.error().type, "insufficient_quota");
  EXPECT_EQ(r.error().code, "insufficient_quota");
  // Unknown model without a "*" price costs nothing.
  EXPECT_EQ(cost_nano_usd(ModelPrice{}, api::Usage{1, 1, 2, 0}), 0);
}

TEST(AdmissionBudget, PeriodRollsOver) {
  auth::Budget b;
  b.limit_nano_usd = 2'000'000;  // $0.002: covers one request's worst case (1 token), then the settled $0.002 spends it
  b.period = 24h;
  World w({}, {}, {}, b);  // on the key
  Admission a(*w.limiter, w.pricing, 0);
  auto t = a.admit(w.with_key, "m", 1, T0);
  ASSERT_TRUE(t);
  a.settle(*t, api::Usage{0, 1000, 1000, 0}, T0);  // $0.002
  EXPECT_FALSE(a.admit(w.with_key, "m", 1, T0 + 1h));
  EXPECT_TRUE(a.admit(w.tenant_only, "m", 1, T0 + 1h));  // the tenant has no budget
  EXPECT_TRUE(a.admit(w.with_key, "m", 1, T0 + 24h));
  EXPECT_EQ(w.limiter->spent(w.key_scope(), T0 + 24h), 0);
}

// The worst case of a request with a 400-byte prompt and max_tokens 100 at
// $1 / $2 per 1M tokens: 100 x $1/1M + 100 x $2/1M = $0.0003.
constexpr std::int64_t kWorst = 300'000;
const TokenEstimate kEst = TokenEstimate::of(400, 100);

TEST(AdmissionBudget, ConcurrentRequestsReserveAndNeverOverspend) {
  // A budget worth 7.5 worst cases; 64 requests in flight at once on 4 workers
  // (the reported fault: 64 of 64 admitted). Exactly 7 may pass.
  for (auto key_budget : {false, true}) {
    auth::Budget b;
    b.limit_nano_usd = 7 * kWorst + kWorst / 2;
    World w({}, key_budget ? auth::Budget{} : b, {}, key_budget ? b : auth::Budget{}, 4);
    std::vector<std::unique_ptr<Admission>> adm;
    for (std::uint32_t i = 0; i < 4; ++i) adm.push_back(std::make_unique<Admission>(*w.limiter, w.pricing, i));
    std::atomic<int> admitted{0}, quota{0};
    std::vector<std::vector<Ticket>> held(4);
    std::vector<std::thread> threads;
    for (std::uint32_t i = 0; i < 4; ++i)
      threads.emplace_back([&, i] {
        for (int k = 0; k < 16; ++k) {
          auto t = adm[i]->admit(w.with_key, "m", kEst, T0);
          if (t) {
            ++admitted;
            held[i].push_back(std::move(*t));
          } else if (t.error().code == "insufficient_quota") {
            ++quota;
          }
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(admitted.load(), 7) << (key_budget ? "key" : "tenant");
    EXPECT_EQ(quota.load(), 64 - 7);
    const auto scope = key_budget ? w.key_scope() : w.tenant_scope();
    EXPECT_EQ(w.limiter->committed(scope, T0), 7 * kWorst);
    // Every admitted request uses its whole worst case: spend ends at the reserved total, within the budget.
    for (std::uint32_t i = 0; i < 4; ++i)
      for (auto& t : held[i]) adm[i]->settle(t, api::Usage{100, 100, 200, 0}, T0);
    EXPECT_EQ(w.limiter->spent(scope, T0), 7 * kWorst);
    EXPECT_LE(w.limiter->spent(scope, T0), b.limit_nano_usd);
    EXPECT_EQ(w.limiter->committed(scope, T0), 7 * kWorst);
  }
}

TEST(AdmissionBudget, ABudgetSmallerThanOneWorstCaseAdmitsNothing) {
  auth::Budget b;
  b.limit_nano_usd = kWorst - 1;
  World w({}, b);
  Admission a(*w.limiter, w.pricing, 0);
  for (int i = 0; i < 8; ++i) {
    auto t = a.admit(w.tenant_only, "m", kEst, T0);
    ASSERT_FALSE(t) << i;
    EXPECT_EQ(t.error().status, 429);
    EXPECT_EQ(t.error().code, "insufficient_quota");
    EXPECT_NE(t.error().message.find("worst-case cost"), std::string::npos) << t.error().message;
  }
  // A cheaper request (smaller max_tokens) still fits.
  EXPECT_TRUE(a.admit(w.tenant_only, "m", TokenEstimate::of(400, 10), T0));
}

TEST(AdmissionBudget, ZeroMeansNothingMayBeSpent) {
  auth::Budget b;
  b.enabled = true;  // budget: {usd: 0}
  b.limit_nano_usd = 0;
  World w({}, b);
  Admission a(*w.limiter, w.pricing, 0);
  auto t = a.admit(w.tenant_only, "m", kEst, T0);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, "insufficient_quota");
  EXPECT_NE(t.error().message.find("$0"), std::string::npos) << t.error().message;
  // Not even a request that costs nothing (no price for the model, no tokens).
  EXPECT_FALSE(a.admit(w.tenant_only, "unpriced", 0, T0));
  // Without a `budget:` key there is no budget at all.
  World open({});
  Admission b2(*open.limiter, open.pricing, 0);
  EXPECT_TRUE(b2.admit(open.tenant_only, "m", kEst, T0));
}

TEST(AdmissionBudget, TheReservationIsReleasedOnEveryPath) {
  auth::Budget b;
  b.limit_nano_usd = kWorst;  // exactly one request at a time
  auth::Limits l = rpm(1);    // a second request is refused by the requests bucket, after its reservation
  World w(l, b);
  Admission a(*w.limiter, w.pricing, 0);
  {
    auto t = a.admit(w.tenant_only, "m", kEst, T0);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->reserved_nano_usd(), kWorst);
    EXPECT_FALSE(a.admit(w.tenant_only, "m", kEst, T0)) << "the first one's reservation fills the budget";
  }  // destroyed without settle (an exception, a bug): the reservation goes back
  EXPECT_EQ(w.limiter->committed(w.tenant_scope(), T0), 0);
  // Refused by a later step (requests per minute): the budget step is undone.
  auto r = a.admit(w.tenant_only, "m", kEst, T0);
  EXPECT_FALSE(r);
  EXPECT_EQ(r.error().code, "rate_limit_exceeded");
  EXPECT_EQ(w.limiter->committed(w.tenant_scope(), T0), 0);
  // Settled with no usage (upstream error, client gone before any work): nothing spent, nothing held.
  World w2({}, b);
  Admission a2(*w2.limiter, w2.pricing, 0);
  auto t = a2.admit(w2.tenant_only, "m", kEst, T0);
  ASSERT_TRUE(t);
  EXPECT_EQ(a2.settle(*t, api::Usage{}, T0), 0);
  EXPECT_EQ(w2.limiter->committed(w2.tenant_scope(), T0), 0);
  EXPECT_EQ(w2.limiter->spent(w2.tenant_scope(), T0), 0);
  // A settled request cheaper than its worst case gives the rest back.
  t = a2.admit(w2.tenant_only, "m", kEst, T0);
  ASSERT_TRUE(t);
  EXPECT_EQ(a2.settle(*t, api::Usage{100, 20, 120, 0}, T0), 140'000);
  EXPECT_EQ(w2.limiter->committed(w2.tenant_scope(), T0), 140'000);
  EXPECT_FALSE(a2.admit(w2.tenant_only, "m", kEst, T0)) << "$0.00014 spent: $0.00016 left < one worst case";
  EXPECT_TRUE(a2.admit(w2.tenant_only, "m", TokenEstimate::of(400, 30), T0));
}

TEST(AdmissionBudget, RefusalCarriesRetryAfterUntilTheBudgetCanAdmitAgain) {
  // The limiter's epoch is T0 - 1h, a whole UTC hour: with period 1h, windows start at T0, T0 + 1h, ...
  auth::Budget b;
  b.limit_nano_usd = kWorst;  // one worst case
  b.period = 1h;
  for (auto key_budget : {false, true}) {
    World w({}, key_budget ? auth::Budget{} : b, {}, key_budget ? b : auth::Budget{});
    Admission a(*w.limiter, w.pricing, 0);
    const Instant at = T0 + 10min + 500ms;
    {
      auto held = a.admit(w.with_key, "m", kEst, at);
      ASSERT_TRUE(held);
      // Only the reservation of a request in flight is in the way: it may be back at once.
      auto r = a.admit(w.with_key, "m", kEst, at);
      ASSERT_FALSE(r);
      EXPECT_EQ(r.error().code, "insufficient_quota");
      EXPECT_EQ(r.error().retry_after_s, 1u);
      a.settle(*held, api::Usage{100, 100, 200, 0}, at);  // spends the whole budget
    }
    // Spent: the budget admits again when its window rolls, 49 min 59.5 s later (rounded up).
    auto r = a.admit(w.with_key, "m", kEst, at);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, "insufficient_quota");
    EXPECT_EQ(r.error().retry_after_s, 3000u) << (key_budget ? "key" : "tenant");
    r = a.admit(w.with_key, "m", kEst, T0 + 1h - 1ms);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().retry_after_s, 1u);  // 1 ms left: 1 s
    EXPECT_TRUE(a.admit(w.with_key, "m", kEst, T0 + 1h)) << "the promised time";
  }
  // Never resets (no period): no Retry-After once the settled spend fills it.
  auth::Budget forever;
  forever.limit_nano_usd = kWorst;
  World w({}, forever);
  Admission a(*w.limiter, w.pricing, 0);
  auto t = a.admit(w.tenant_only, "m", kEst, T0);
  ASSERT_TRUE(t);
  a.settle(*t, api::Usage{100, 100, 200, 0}, T0);
  auto r = a.admit(w.tenant_only, "m", kEst, T0 + 100h);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().retry_after_s, 0u);
  // Nor for a request whose worst case exceeds the whole budget, nor for a budget of $0: no wait helps.
  auth::Budget small = b;
  small.limit_nano_usd = kWorst - 1;
  World ws({}, small);
  Admission as(*ws.limiter, ws.pricing, 0);
  r = as.admit(ws.tenant_only, "m", kEst, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().retry_after_s, 0u);
  auth::Budget zero = b;
  zero.enabled = true;
  zero.limit_nano_usd = 0;
  World wz({}, zero);
  Admission az(*wz.limiter, wz.pricing, 0);
  r = az.admit(wz.tenant_only, "unpriced", 0, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().retry_after_s, 0u);
}

TEST(AdmissionBudget, UsageAboveTheReservationIsRecorded) {
  auth::Budget b;
  b.limit_nano_usd = 2 * kWorst;
  World w({}, b);
  Admission a(*w.limiter, w.pricing, 0);
  auto t = a.admit(w.tenant_only, "m", kEst, T0);
  ASSERT_TRUE(t);
  // The prompt tokenized to 3x the estimate: the real cost is charged (overshoot is spend, never hidden).
  EXPECT_EQ(a.settle(*t, api::Usage{300, 100, 400, 0}, T0), 500'000);
  EXPECT_EQ(w.limiter->spent(w.tenant_scope(), T0), 500'000);
  EXPECT_FALSE(a.admit(w.tenant_only, "m", kEst, T0));
}

TEST(AdmissionHeaders, ResetIsWhenEveryShardIsFull) {
  // 6 requests a minute. One worker: one taken is back in 10 s. Four workers:
  // the shard that gave it holds 1.5 and refills at 1.5 a minute, and the three
  // full ones gain nothing, so the bucket is full again in 40 s (it read 10 s:
  // a request for the whole 6 was refused until 40 s). One taken from each
  // shard: 4 short at the whole rate, 40 s either way.
  for (std::uint32_t workers : {1u, 4u}) {
    std::vector<auth::ScopeInfo> scopes(1);
    scopes[0].limits.requests_per_minute = 6;
    LocalLimiter lim(scopes, workers, T0 - std::chrono::hours(1));
    ASSERT_TRUE(lim.take(0, Bucket::requests, 0, 1, T0).ok);
    EXPECT_EQ(lim.view(0, Bucket::requests, T0).reset_ms, workers == 1 ? 10000u : 40000u) << workers;
    EXPECT_EQ(lim.view(0, Bucket::requests, T0).remaining, 5u) << workers;
    EXPECT_FALSE(lim.take(0, Bucket::requests, 0, 6, T0 + (workers == 1 ? 9s : 39s)).ok) << workers;
    EXPECT_TRUE(lim.take(0, Bucket::requests, 0, 6, T0 + (workers == 1 ? 10s : 40s)).ok) << workers;
  }
  std::vector<auth::ScopeInfo> scopes(1);
  scopes[0].limits.requests_per_minute = 6;
  LocalLimiter even(scopes, 4, T0 - std::chrono::hours(1));
  for (std::uint32_t worker = 0; worker < 4; ++worker) ASSERT_TRUE(even.take(0, Bucket::requests, worker, 1, T0).ok);
  EXPECT_EQ(even.view(0, Bucket::requests, T0).reset_ms, 40000u);
}

TEST(AdmissionLimiter, RetryAfterOfUnevenShardsIsWhenTheyHoldTheCostBetweenThem) {
  // 2 workers, 600 tokens a minute, 60 deep: shards of 30 refilling at 5 a
  // second each. Worker 0's shard holds 4, worker 1's is full at 30: 40
  // tokens are 6 short, and only worker 0's shard gains (1.2 s). It said
  // Retry-After: 1 (6 short at the whole rate of 10 a second), and the retry
  // then was refused again.
  std::vector<auth::ScopeInfo> scopes(1);
  scopes[0].limits.tokens_per_minute = 600;
  scopes[0].limits.tokens_burst = 60;
  LocalLimiter lim(scopes, 2, T0 - std::chrono::hours(1));
  ASSERT_TRUE(lim.take(0, Bucket::tokens, 0, 26, T0).ok);
  const TakeResult r = lim.take(0, Bucket::tokens, 0, 40, T0);
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, 2u);
  EXPECT_EQ(lim.seconds_until(0, Bucket::tokens, 40, T0), 2u);
  EXPECT_FALSE(lim.take(0, Bucket::tokens, 0, 40, T0 + 1s).ok);  // a second earlier: 39
  EXPECT_TRUE(lim.take(0, Bucket::tokens, 0, 40, T0 + 2s).ok);
  // Full again when worker 0's shard is: 26 at 5 a second (it read 2.6 s, 26 at the whole rate).
  LocalLimiter full(scopes, 2, T0 - std::chrono::hours(1));
  ASSERT_TRUE(full.take(0, Bucket::tokens, 0, 26, T0).ok);
  EXPECT_EQ(full.view(0, Bucket::tokens, T0).reset_ms, 5200u);
  EXPECT_FALSE(full.take(0, Bucket::tokens, 1, 60, T0 + 5100ms).ok);
  EXPECT_TRUE(full.take(0, Bucket::tokens, 1, 60, T0 + 5200ms).ok);
  // Three shards (20 deep, 10/3 a second each) holding 5, 15 and 20: 58
  // tokens are 18 short. Both short shards gain until the one at 15 is full
  // (1.5 s, +10), then the other alone: 8 more, 2.4 s; 3.9 s in all -> 4
  // (the whole rate said 1.8 s -> 2).
  LocalLimiter three(scopes, 3, T0 - std::chrono::hours(1));
  ASSERT_TRUE(three.take(0, Bucket::tokens, 0, 15, T0).ok);
  ASSERT_TRUE(three.take(0, Bucket::tokens, 1, 5, T0).ok);
  const TakeResult t = three.take(0, Bucket::tokens, 2, 58, T0);
  ASSERT_FALSE(t.ok);
  EXPECT_EQ(t.retry_after_s, 4u);
  EXPECT_EQ(three.seconds_until(0, Bucket::tokens, 40, T0), 0u);  // there now
  EXPECT_EQ(three.seconds_until(0, Bucket::tokens, 61, T0), 0u);  // never: above the depth
  EXPECT_FALSE(three.take(0, Bucket::tokens, 2, 58, T0 + 3s).ok);
  EXPECT_TRUE(three.take(0, Bucket::tokens, 2, 58, T0 + 4s).ok);
}

TEST(AdmissionLimiter, AShardInDebtGivesNothingUntilItIsPaid) {
  // 2 workers, shards of 30 refilling at 5 a second. Worker 0's shard owes
  // 10, worker 1's holds 5: take() borrows only what a shard holds, so 10
  // tokens are there once worker 1's shard gains 5 (1 s), though the bucket
  // as a whole (-5) is 15 short.
  std::vector<auth::ScopeInfo> scopes(1);
  scopes[0].limits.tokens_per_minute = 600;
  scopes[0].limits.tokens_burst = 60;
  LocalLimiter lim(scopes, 2, T0 - std::chrono::hours(1));
  ASSERT_TRUE(lim.take(0, Bucket::tokens, 0, 30, T0).ok);
  ASSERT_TRUE(lim.take(0, Bucket::tokens, 1, 30, T0).ok);
  lim.charge(0, Bucket::tokens, 0, 20, T0);  // -10 each
  lim.give_back(0, Bucket::tokens, 1, 15, T0);
  ASSERT_NEAR(lim.available(0, Bucket::tokens, T0), -5, 1e-6);
  const TakeResult r = lim.take(0, Bucket::tokens, 0, 10, T0);
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.retry_after_s, 1u);
  EXPECT_TRUE(lim.take(0, Bucket::tokens, 0, 10, T0 + 1s).ok);
  // 40: worker 1's shard gains alone until worker 0's has paid its debt (2 s), then both do: 4.5 s.
  LocalLimiter owed(scopes, 2, T0 - std::chrono::hours(1));
  ASSERT_TRUE(owed.take(0, Bucket::tokens, 0, 30, T0).ok);
  ASSERT_TRUE(owed.take(0, Bucket::tokens, 1, 30, T0).ok);
  owed.charge(0, Bucket::tokens, 0, 20, T0);
  owed.give_back(0, Bucket::tokens, 1, 15, T0);
  EXPECT_EQ(owed.seconds_until(0, Bucket::tokens, 40, T0), 5u);  // 27.5 + 12.5 at 4.5 s
  EXPECT_EQ(owed.view(0, Bucket::tokens, T0).reset_ms, 8000u);   // worker 0's: 40 at 5 a second
  EXPECT_FALSE(owed.take(0, Bucket::tokens, 0, 40, T0 + 4s).ok);
  EXPECT_TRUE(owed.take(0, Bucket::tokens, 0, 40, T0 + 5s).ok);
}

TEST(AdmissionTokenBucket, RetryAfterOfEveryBucketCountsItsShards) {
  // The requests bucket refuses first (1 s); the tokens bucket's shards hold
  // 4 and 30 and 40 tokens need 1.2 s: Retry-After is 2, and the retry passes.
  auth::Limits l = rpm(120, 1);
  l.tokens_per_minute = 600;
  l.tokens_burst = 60;
  World w(l, 2);
  Admission a(*w.limiter, w.pricing, 0);
  ASSERT_TRUE(a.admit(w.tenant_only, "m", 26, T0));
  auto r = a.admit(w.tenant_only, "m", 40, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().type, "requests");
  EXPECT_EQ(r.error().retry_after_s, 2u);
  EXPECT_FALSE(a.admit(w.tenant_only, "m", 40, T0 + 1s));
  EXPECT_TRUE(a.admit(w.tenant_only, "m", 40, T0 + 2s));
  // Refused by the tokens bucket itself: the same.
  auth::Limits tl = tpm(600);
  tl.tokens_burst = 60;
  World u(tl, 2);
  Admission b(*u.limiter, u.pricing, 0);
  ASSERT_TRUE(b.admit(u.tenant_only, "m", 26, T0));
  r = b.admit(u.tenant_only, "m", 40, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().type, "tokens");
  EXPECT_EQ(r.error().retry_after_s, 2u);
  EXPECT_TRUE(b.admit(u.tenant_only, "m", 40, T0 + 2s));
}

TEST(AdmissionLimiter, ARefundOfBorrowedUnitsIsNotLost) {
  // 2 workers, a 1,000-token bucket: 500 per shard. A reservation of 859 on
  // worker 0 borrows 359 from worker 1's shard; giving 853 back must leave
  // the bucket at 994, not at what worker 0's shard alone can hold.
  std::vector<auth::ScopeInfo> scopes(1);
  scopes[0].limits.tokens_per_minute = 60000;
  scopes[0].limits.tokens_burst = 1000;
  LocalLimiter lim(scopes, 2, T0 - std::chrono::hours(1));
  ASSERT_TRUE(lim.take(0, Bucket::tokens, 0, 859, T0).ok);
  EXPECT_NEAR(lim.available(0, Bucket::tokens, T0), 141, 1e-6);
  lim.give_back(0, Bucket::tokens, 0, 853, T0);
  EXPECT_NEAR(lim.available(0, Bucket::tokens, T0), 994, 1e-6);
  // A request that needs 709 is admitted at once.
  EXPECT_TRUE(lim.take(0, Bucket::tokens, 1, 709, T0).ok);
  // Never above full: more given back than was taken is dropped.
  lim.give_back(0, Bucket::tokens, 0, 5000, T0);
  EXPECT_NEAR(lim.available(0, Bucket::tokens, T0), 1000, 1e-6);
}

TEST(AdmissionLimiter, ADebtHoldsEveryWorkerNotOnlyTheOneThatSettled) {
  // 2 workers, 120 tokens a minute: 60 per shard. Worker 0 reserved 13 and the answer used 305: 292 more
  // are charged. The bucket owes 185; worker 1 admitted from its own shard while worker 0's owed it all.
  std::vector<auth::ScopeInfo> scopes(1);
  scopes[0].limits.tokens_per_minute = 120;
  LocalLimiter lim(scopes, 2, T0 - std::chrono::hours(1));
  ASSERT_TRUE(lim.take(0, Bucket::tokens, 0, 13, T0).ok);
  lim.charge(0, Bucket::tokens, 0, 292, T0);
  EXPECT_NEAR(lim.available(0, Bucket::tokens, T0), -185, 1e-6);
  for (std::uint32_t worker : {0u, 1u}) EXPECT_FALSE(lim.take(0, Bucket::tokens, worker, 13, T0).ok) << worker;
  // Paid back at 2 tokens a second: 13 are there after 99 s, on either worker, not before.
  EXPECT_FALSE(lim.take(0, Bucket::tokens, 1, 13, T0 + std::chrono::seconds(98)).ok);
  EXPECT_TRUE(lim.take(0, Bucket::tokens, 1, 13, T0 + std::chrono::seconds(99)).ok);
  // A charge the bucket can still pay is no debt, wherever the units are.
  ASSERT_TRUE(lim.take(0, Bucket::tokens, 0, 1, T0 + std::chrono::hours(1)).ok);
  lim.charge(0, Bucket::tokens, 0, 100, T0 + std::chrono::hours(1));
  EXPECT_NEAR(lim.available(0, Bucket::tokens, T0 + std::chrono::hours(1)), 19, 1e-6);
  EXPECT_TRUE(lim.take(0, Bucket::tokens, 0, 19, T0 + std::chrono::hours(1)).ok);
}

TEST(AdmissionHeaders, RateLimitValuesAndResetFormat) {
  auth::Limits l = rpm(60);
  l.tokens_per_minute = 6000;
  World w(l);
  Admission a(*w.limiter, w.pricing, 0);
  auto none = a.rate_limit_headers(w.tenant_only, T0);
  EXPECT_TRUE(none.has_requests && none.has_tokens);
  EXPECT_EQ(none.requests.remaining, 60u);
  EXPECT_EQ(none.requests.reset_ms, 0u);
  ASSERT_TRUE(a.admit(w.tenant_only, "m", 1500, T0));
  auto h = a.rate_limit_headers(w.tenant_only, T0);
  EXPECT_EQ(h.requests.limit, 60u);
  EXPECT_EQ(h.requests.remaining, 59u);
  EXPECT_EQ(h.requests.reset_ms, 1000u);
  EXPECT_EQ(h.tokens.limit, 6000u);
  EXPECT_EQ(h.tokens.remaining, 4500u);
  EXPECT_EQ(h.tokens.reset_ms, 15000u);
  EXPECT_EQ(format_reset(h.tokens.reset_ms), "15s");
  // Tenant and key both limited: the tighter one is shown.
  World both(rpm(1000), {}, rpm(10));
  Admission b(*both.limiter, both.pricing, 0);
  ASSERT_TRUE(b.admit(both.with_key, "m", 0, T0));
  auto hb = b.rate_limit_headers(both.with_key, T0);
  EXPECT_EQ(hb.requests.limit, 10u);
  EXPECT_EQ(hb.requests.remaining, 9u);
  EXPECT_FALSE(hb.has_tokens);
  // Both buckets full (nothing charged yet): the key's smaller limit is the caller's, not the
  // tenant's (a tie of shares once went to the tenant, on a 429 in particular).
  World full(rpm(1000), {}, rpm(10));
  Admission c(*full.limiter, full.pricing, 0);
  auto hc = c.rate_limit_headers(full.with_key, T0);
  EXPECT_EQ(hc.requests.limit, 10u);
  EXPECT_EQ(hc.requests.remaining, 10u);

  EXPECT_EQ(format_reset(0), "0s");
  EXPECT_EQ(format_reset(20), "20ms");
  EXPECT_EQ(format_reset(1000), "1s");
  EXPECT_EQ(format_reset(1500), "1.5s");
  EXPECT_EQ(format_reset(1234), "1.234s");
  EXPECT_EQ(format_reset(360000), "6m0s");
  EXPECT_EQ(format_reset(3723500), "1h2m3.5s");
  EXPECT_EQ(format_reset(3600000), "1h0m0s");
  EXPECT_EQ(format_reset(60010), "1m0.01s");
  EXPECT_EQ(format_reset(999), "999ms");
}

TEST(AdmissionTokenBucket, RetryAfterIsTheLongestWaitOfEveryBucket) {
  // A requests refusal whose tokens bucket needs longer: Retry-After says the longer (a client that
  // waited the requests bucket's second was refused again, by the tokens bucket, for 27 s more).
  auth::Limits l = rpm(60, 1);
  l.tokens_per_minute = 200;  // 3.33 tokens per second
  World w(l);
  Admission a(*w.limiter, w.pricing, 0);
  ASSERT_TRUE(a.admit(w.tenant_only, "m", 150, T0));
  auto r = a.admit(w.tenant_only, "m", 150, T0);  // requests: 1 s; tokens: 100 short, 30 s
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().type, "requests");
  EXPECT_EQ(r.error().retry_after_s, 30u);
  EXPECT_NE(r.error().message.find("try again in 30s"), std::string::npos) << r.error().message;
  EXPECT_FALSE(a.admit(w.tenant_only, "m", 150, T0 + 29s));
  EXPECT_TRUE(a.admit(w.tenant_only, "m", 150, T0 + 30s));
  // Across scopes: the tenant's tokens refuse, the key's requests bucket needs longer.
  auth::Limits tenant = tpm(600);  // 10 per second
  World k(tenant, {}, rpm(1, 1));  // the key: one a minute
  Admission b(*k.limiter, k.pricing, 0);
  ASSERT_TRUE(b.admit(k.with_key, "m", 600, T0));
  r = b.admit(k.with_key, "m", 100, T0);  // the key's requests bucket: 60 s; the tenant's tokens: 10 s
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().retry_after_s, 60u);
  // A bucket that needs nothing adds nothing.
  World one(rpm(60, 1));
  Admission c(*one.limiter, one.pricing, 0);
  ASSERT_TRUE(c.admit(one.tenant_only, "m", 0, T0));
  r = c.admit(one.tenant_only, "m", 0, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().retry_after_s, 1u);
}

TEST(AdmissionTokenBucket, ARequestNoWaitCanAdmitIsToldSoWhicheverCheckRefusesFirst) {
  // The key's requests bucket refused first and said Retry-After: 9; the tenant's tokens bucket (depth 500)
  // can never hold a 609-token request, so a client that waited was refused again, for good.
  auth::Limits tenant = tpm(3000);
  tenant.tokens_burst = 500;
  World w(tenant, {}, rpm(7));
  Admission a(*w.limiter, w.pricing, 0);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(a.admit(w.with_key, "m", 10, T0));
  auto r = a.admit(w.with_key, "m", 609, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().type, "tokens");
  EXPECT_EQ(r.error().retry_after_s, 0u) << r.error().message;
  EXPECT_NE(r.error().message.find("Request too large"), std::string::npos) << r.error().message;
  // A request that fits is still told when to come back.
  r = a.admit(w.with_key, "m", 10, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().type, "requests");
  EXPECT_GT(r.error().retry_after_s, 0u);
  // The concurrency check first: the same.
  auth::Limits both = tpm(3000);
  both.tokens_burst = 500;
  both.max_concurrent_streams = 1;
  World c(both);
  Admission b(*c.limiter, c.pricing, 0);
  auto held = b.admit(c.tenant_only, "m", 10, T0);
  ASSERT_TRUE(held);
  r = b.admit(c.tenant_only, "m", 609, T0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().retry_after_s, 0u) << r.error().message;
  EXPECT_EQ(r.error().type, "tokens");
}

TEST(AdmissionTokenBucket, AConcurrencyRefusalWaitsForTheTokensBucketToo) {
  // The only stream slot was held: Retry-After said 1, and the client that came back then was refused by the
  // tokens bucket for 27 s more.
  auth::Limits l = tpm(120);  // 2 tokens per second
  l.max_concurrent_streams = 1;
  World w(l);
  Admission a(*w.limiter, w.pricing, 0);
  auto held = a.admit(w.tenant_only, "m", 105, T0);
  ASSERT_TRUE(held);
  auto r = a.admit(w.tenant_only, "m", 60, T0);  // 15 tokens left, 45 short: 23 s
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("concurrent"), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().retry_after_s, 23u);
}

TEST(AdmissionHeaders, TheLimitIsWhatTheBucketHoldsSoRemainingNeverExceedsIt) {
  // requests_burst above the rate: the bucket holds 100, and the header's limit says so (it said 10,
  // with 99 remaining).
  auth::Limits l = rpm(10, 100);
  l.tokens_per_minute = 1000;
  l.tokens_burst = 50000;
  World w(l);
  Admission a(*w.limiter, w.pricing, 0);
  ASSERT_TRUE(a.admit(w.tenant_only, "m", 14, T0));
  const auto h = a.rate_limit_headers(w.tenant_only, T0);
  EXPECT_EQ(h.requests.limit, 100u);
  EXPECT_EQ(h.requests.remaining, 99u);
  EXPECT_EQ(h.tokens.limit, 50000u);
  EXPECT_EQ(h.tokens.remaining, 49986u);
  // A burst below the rate: the limit stays the rate (remaining is at most the burst).
  World small(rpm(600, 5));
  Admission b(*small.limiter, small.pricing, 0);
  const auto hs = b.rate_limit_headers(small.tenant_only, T0);
  EXPECT_EQ(hs.requests.limit, 600u);
  EXPECT_EQ(hs.requests.remaining, 5u);
}

TEST(AdmissionHeaders, ThreeLinesPerBucketAppended) {
  std::string out = "x: y\r\n";
  append_rate_limit_headers(out, "requests", BucketView{.limit = 600, .remaining = 599, .reset_ms = 100});
  append_rate_limit_headers(out, "tokens", BucketView{.limit = 0, .remaining = 18446744073709551615ull, .reset_ms = 0});
  EXPECT_EQ(out,
            "x: y\r\n"
            "x-ratelimit-limit-requests: 600\r\nx-ratelimit-remaining-requests: 599\r\n"
            "x-ratelimit-reset-requests: 100ms\r\n"
            "x-ratelimit-limit-tokens: 0\r\nx-ratelimit-remaining-tokens: 18446744073709551615\r\n"
            "x-ratelimit-reset-tokens: 0s\r\n");
}

TEST(AdmissionEstimate, PromptBytesOverFourPlusMaxTokens) {
  EXPECT_EQ(estimate_tokens(0, 0), 0u);
  EXPECT_EQ(estimate_tokens(1, 0), 1u);
  EXPECT_EQ(estimate_tokens(1600, 128), 528u);
  EXPECT_EQ(estimate_tokens(1601, 128), 529u);
}

TEST(AdmissionPricing, ParsesAndFallsBackToStar) {
  auto p = parse_pricing_config(YAML::Load(R"(
pricing:
  gpt-4o-mini: {input: 0.15, output: 0.6, cached_input: 0.075}
  "*": {input: 1, output: 2}
)"));
  ASSERT_TRUE(p) << p.error().to_string();
  ASSERT_NE(p->find("gpt-4o-mini"), nullptr);
  EXPECT_EQ(p->find("gpt-4o-mini")->input, 150'000);
  EXPECT_EQ(p->find("gpt-4o-mini")->cached_input, 75'000);
  EXPECT_EQ(p->find("other")->output, 2'000'000);
  EXPECT_EQ(p->find("other")->cached_input, 1'000'000);  // defaults to input
  // 1000 tokens at $0.15/1M = $0.00015 = 150000 nano-USD; one token rounds up.
  EXPECT_EQ(cost_nano_usd(*p->find("gpt-4o-mini"), api::Usage{1000, 0, 1000, 0}), 150'000);
  EXPECT_EQ(cost_nano_usd(*p->find("gpt-4o-mini"), api::Usage{1, 0, 1, 0}), 150);
  // Absurd usage from a faulty upstream saturates (no int64 overflow, UBSan-clean).
  const std::uint64_t huge = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(cost_nano_usd(*p->find("gpt-4o-mini"), api::Usage{huge, 0, huge, huge}), kMaxCostNanoUsd);
  EXPECT_EQ(cost_nano_usd(*p->find("gpt-4o-mini"), api::Usage{1'000'000'000'000'000, 0, 0, 0}), kMaxCostNanoUsd);

  auto bad = parse_pricing_config(YAML::Load("pricing:\n  m: {input: 1, ouput: 2}\n"), "w.yaml");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().key, "pricing.m.ouput");
  EXPECT_EQ(bad.error().line, 2);
  EXPECT_EQ(bad.error().file, "w.yaml");
  bad = parse_pricing_config(YAML::Load("pricing:\n  m:\n    input: cheap\n"));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().key, "pricing.m.input");
  EXPECT_EQ(bad.error().line, 3);
}

// Prices are whole pico-USD per token: one finer was charged as another in silence (1e-9 free, 1.5e-6 as 2e-6).
TEST(AdmissionPricing, RefusesPricesFinerThanItsResolution) {
  // (Within 1 % of a step passed too: 1.0000001 was charged as 1, 100.0000005 as 100.000001; config audit.)
  for (const char* y : {"pricing:\n  m: {input: 1e-9}\n", "pricing:\n  m: {output: 0.0000015}\n",
                        "pricing:\n  m: {input: 1.0000001}\n", "pricing:\n  m: {output: 100.0000005}\n"}) {
    auto bad = parse_pricing_config(YAML::Load(y));
    ASSERT_FALSE(bad) << y;
    EXPECT_NE(bad.error().to_string().find("finer than"), std::string::npos) << bad.error().to_string();
  }
  auto ok = parse_pricing_config(YAML::Load("pricing:\n  m: {input: 0.000001, output: 0.000003, cached_input: 0}\n"));
  ASSERT_TRUE(ok) << ok.error().to_string();
  EXPECT_EQ(ok->find("m")->input, 1);
  EXPECT_EQ(ok->find("m")->output, 3);
  // Every whole step reads as itself, however many digits (decimal fractions a double cannot hold exactly).
  ok = parse_pricing_config(
      YAML::Load("pricing:\n  m: {input: 123456.789012, output: 0.3, cached_input: 999999.999999}\n"));
  ASSERT_TRUE(ok) << ok.error().to_string();
  EXPECT_EQ(ok->find("m")->input, 123'456'789'012);
  EXPECT_EQ(ok->find("m")->output, 300'000);
  EXPECT_EQ(ok->find("m")->cached_input, 999'999'999'999);
}

// Anthropic bills cache writes above input (1.25× for 5 minutes, 2× for an hour): they have their own prices,
// which default to input's (nothing changes unless set), and the reservation prices the prompt at the dearest.
TEST(AdmissionPricing, CacheWritesHaveTheirOwnPrice) {
  auto p = parse_pricing_config(YAML::Load(R"(
pricing:
  claude: {input: 1, output: 2, cached_input: 0.1, cache_write: 1.25, cache_write_1h: 2}
  plain: {input: 1, output: 2}
  five: {input: 1, output: 2, cache_write: 1.25}
)"));
  ASSERT_TRUE(p) << p.error().to_string();
  const ModelPrice& c = *p->find("claude");
  EXPECT_EQ(c.cache_write, 1'250'000);
  EXPECT_EQ(c.cache_write_1h, 2'000'000);
  EXPECT_EQ(c.prompt_worst(), 2'000'000);
  EXPECT_EQ(p->find("plain")->cache_write, 1'000'000);     // input's
  EXPECT_EQ(p->find("plain")->cache_write_1h, 1'000'000);  // cache_write's
  EXPECT_EQ(p->find("plain")->prompt_worst(), 1'000'000);
  EXPECT_EQ(p->find("five")->cache_write_1h, 1'250'000);
  // 1210 prompt tokens: 200 read, 1000 written (600 of them for an hour), 10 plain; 5 output.
  api::Usage u{1210, 5, 1215, 200, 1000, 600};
  EXPECT_EQ(cost_nano_usd(c, u), 10 * 1000 + 200 * 100 + 400 * 1250 + 600 * 2000 + 5 * 2000);
  EXPECT_EQ(cost_nano_usd(*p->find("plain"), u), (1210 - 200) * 1000 + 200 * 1000 + 5 * 2000);
  // Parts larger than what is left of the prompt are taken as what is left (never a negative remainder).
  EXPECT_EQ(cost_nano_usd(c, api::Usage{100, 0, 100, 80, 80, 90}), 80 * 100 + 20 * 2000);
  auto bad = parse_pricing_config(YAML::Load("pricing:\n  m: {input: 1, cache_write: lots}\n"));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().key, "pricing.m.cache_write");
}

}  // namespace
}  // namespace weir::admission
