// Admission with a remote limiter's extra outcomes (Limiter::refusing, a
// pending take, a refillable stream cap) and async_refill, against a fake
// limiter wrapped around LocalLimiter: no Redis needed.
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include "admission/admission.hpp"
#include "admission/local_limiter.hpp"
#include "admission/refill.hpp"
#include "auth/config.hpp"

namespace weir::admission {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
const Instant T0 = Instant(1000h);

class FakeRemote final : public Limiter {
 public:
  explicit FakeRemote(const std::vector<auth::ScopeInfo>& scopes) : inner_(scopes, 1, T0 - 1h) {}
  void set_refusing(bool v) { refusing_.store(v); }
  bool pending_tokens_ = false;
  bool streams_full_ = false;
  std::thread::id refill_thread_;
  int refills_ = 0;
  Shortfall last_;
  int stolen_ = 0;  // refills whose units another request takes first: the tokens stay pending
  std::chrono::milliseconds patience_{0};

  std::uint32_t workers() const noexcept override { return 1; }
  TakeResult take(std::uint32_t s, Bucket b, std::uint32_t w, double c, Instant now) override {
    if (b == Bucket::tokens && pending_tokens_) return TakeResult{.ok = false, .pending = true, .retry_after_s = 1};
    return inner_.take(s, b, w, c, now);
  }
  void give_back(std::uint32_t s, Bucket b, std::uint32_t w, double a, Instant now) override {
    inner_.give_back(s, b, w, a, now);
  }
  void charge(std::uint32_t s, Bucket b, std::uint32_t w, double a, Instant now) override {
    inner_.charge(s, b, w, a, now);
  }
  BucketView view(std::uint32_t s, Bucket b, Instant now) const override { return inner_.view(s, b, now); }
  bool acquire_stream(std::uint32_t s, std::uint32_t w) override {
    return !streams_full_ && inner_.acquire_stream(s, w);
  }
  void release_stream(std::uint32_t s, std::uint32_t w) override { inner_.release_stream(s, w); }
  std::uint64_t streams_in_use(std::uint32_t s) const override { return inner_.streams_in_use(s); }
  std::int64_t spent(std::uint32_t s, Instant now) override { return inner_.spent(s, now); }
  TakeResult reserve_spend(std::uint32_t s, std::int64_t n, Instant now) override {
    return inner_.reserve_spend(s, n, now);
  }
  void settle_spend(std::uint32_t s, std::int64_t reserved, std::int64_t actual, Instant now) override {
    inner_.settle_spend(s, reserved, actual, now);
  }
  bool streams_refillable(std::uint32_t) const noexcept override { return streams_full_; }
  // Completes from another thread, as RedisLimiter's control thread does.
  void refill(const Shortfall& need, std::uint32_t, std::function<void()> done) override {
    ++refills_;
    last_ = need;
    if (stolen_ > 0)
      --stolen_;
    else
      pending_tokens_ = false;
    streams_full_ = false;
    std::thread([done = std::move(done)] { done(); }).join();
  }
  std::chrono::milliseconds refill_patience(const Shortfall&) const noexcept override { return patience_; }
  double available(std::uint32_t s, Bucket b) const { return inner_.available(s, b, T0); }

 private:
  LocalLimiter inner_;
};

struct World {
  std::shared_ptr<const auth::AuthPolicy> policy;
  Pricing pricing;
  auth::Principal with_key;
  World() {
    auth::AuthConfig c;
    auth::TenantConfig t;
    t.name = "acme";
    t.limits.requests_per_minute = 60;
    t.limits.tokens_per_minute = 6000;
    t.limits.max_concurrent_streams = 2;
    c.tenants.emplace("acme", t);
    auth::ApiKeyConfig k;
    k.id = "acme-prod";
    k.sha256 = auth::sha256("sk-acme");
    k.tenant = "acme";
    k.limits.requests_per_minute = 30;
    c.api_keys.push_back(k);
    policy = auth::AuthPolicy::build(c);
    with_key.kind = auth::CredentialKind::api_key;
    with_key.tenant = policy->find_tenant("acme");
    with_key.key = &policy->keys()[0];
  }
  std::uint32_t tenant() const { return with_key.tenant->scope; }
  std::uint32_t key() const { return with_key.key->scope; }
};

TEST(AdmissionRemoteTest, RefusingStoreMeans503AndTakesNothing) {
  World w;
  FakeRemote lim(w.policy->scopes());
  Admission a(lim, w.pricing, 0);
  lim.set_refusing(true);
  Shortfall wait;
  auto r = a.admit(w.with_key, "m", 100, T0, &wait);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 503);
  EXPECT_EQ(r.error().retry_after_s, 1u);
  EXPECT_FALSE(wait.pending);
  EXPECT_EQ(lim.streams_in_use(w.tenant()), 0u);
  EXPECT_DOUBLE_EQ(lim.available(w.tenant(), Bucket::requests), 60.0);
}

// Fail closed only for what the store decides (stop 57): a tenant (and key) with no rate limit, stream cap or
// budget takes nothing from the store and is admitted while it refuses; one with any of them is not.
TEST(AdmissionRemoteTest, RefusingStoreAdmitsScopesThatNeedNothingFromIt) {
  auth::AuthConfig c;
  auth::TenantConfig open;
  open.name = "open";
  c.tenants.emplace("open", open);
  auth::TenantConfig spender;
  spender.name = "spender";
  spender.budget.limit_nano_usd = 1'000'000'000;
  c.tenants.emplace("spender", spender);
  auth::ApiKeyConfig k;
  k.id = "open-capped";
  k.sha256 = auth::sha256("sk-open");
  k.tenant = "open";
  k.limits.max_concurrent_streams = 1;
  c.api_keys.push_back(k);
  auto policy = auth::AuthPolicy::build(c);
  FakeRemote lim(policy->scopes());
  Pricing pricing;
  Admission a(lim, pricing, 0);
  lim.set_refusing(true);

  auth::Principal p;
  p.kind = auth::CredentialKind::api_key;
  p.tenant = policy->find_tenant("open");
  auto ok = a.admit(p, "m", 100, T0);
  EXPECT_TRUE(ok);

  p.key = &policy->keys()[0];  // its own stream cap: the store decides
  auto capped = a.admit(p, "m", 100, T0);
  ASSERT_FALSE(capped);
  EXPECT_EQ(capped.error().status, 503);

  p.key = nullptr;
  p.tenant = policy->find_tenant("spender");  // a budget: the store decides
  auto budget = a.admit(p, "m", 100, T0);
  ASSERT_FALSE(budget);
  EXPECT_EQ(budget.error().status, 503);
}

TEST(AdmissionRemoteTest, PendingTakeListsWhatTheRequestNeedsAndUndoes) {
  World w;
  FakeRemote lim(w.policy->scopes());
  Admission a(lim, w.pricing, 0);
  lim.pending_tokens_ = true;
  Shortfall wait;
  auto r = a.admit(w.with_key, "m", 100, T0, &wait);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 429);
  EXPECT_EQ(r.error().retry_after_s, 1u);
  ASSERT_TRUE(wait.pending);
  ASSERT_EQ(wait.count, 4);  // tenant: streams, requests, tokens; key: requests
  EXPECT_EQ(wait.needs[0].scope, w.tenant());
  EXPECT_EQ(wait.needs[0].what, Resource::streams);
  EXPECT_EQ(wait.needs[1].what, Resource::requests);
  EXPECT_EQ(wait.needs[2].what, Resource::tokens);
  EXPECT_DOUBLE_EQ(wait.needs[2].units, 100.0);
  EXPECT_EQ(wait.needs[3].scope, w.key());
  EXPECT_EQ(wait.needs[3].what, Resource::requests);
  // Everything taken before the pending step went back.
  EXPECT_EQ(lim.streams_in_use(w.tenant()), 0u);
  EXPECT_DOUBLE_EQ(lim.available(w.tenant(), Bucket::requests), 60.0);
  EXPECT_DOUBLE_EQ(lim.available(w.key(), Bucket::requests), 30.0);
  // Without a Shortfall (the final answer, after a refill wait) the caller gets the bucket's own 429, never
  // "while refreshing the shared limit" with a Retry-After of 1 that only invites a refusal again.
  auto r2 = a.admit(w.with_key, "m", 100, T0);
  ASSERT_FALSE(r2);
  EXPECT_EQ(r2.error().status, 429);
  EXPECT_EQ(r2.error().message.find("refreshing"), std::string::npos) << r2.error().message;
  EXPECT_NE(r2.error().message.find("tokens per min"), std::string::npos) << r2.error().message;
}

TEST(AdmissionRemoteTest, RefillableStreamCapIsPending) {
  World w;
  FakeRemote lim(w.policy->scopes());
  Admission a(lim, w.pricing, 0);
  lim.streams_full_ = true;
  Shortfall wait;
  auto r = a.admit(w.with_key, "m", 100, T0, &wait);
  ASSERT_FALSE(r);
  EXPECT_TRUE(wait.pending);
  EXPECT_EQ(wait.needs[0].what, Resource::streams);
  auto r2 = a.admit(w.with_key, "m", 100, T0);  // the final answer: the cap's own 429
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.error().message.find("concurrent"), std::string::npos) << r2.error().message;
}

TEST(AdmissionRemoteTest, AsyncRefillResumesOnTheWorkerThenAdmits) {
  World w;
  FakeRemote lim(w.policy->scopes());
  Admission a(lim, w.pricing, 0);
  lim.pending_tokens_ = true;
  asio::io_context worker;
  std::thread::id resumed_on;
  auto task = [&]() -> asio::awaitable<bool, asio::io_context::executor_type> {
    Shortfall wait;
    auto t = a.admit(w.with_key, "m", 100, T0, &wait);
    if (!t && wait.pending) {
      co_await async_refill(lim, wait, 0, worker.get_executor(),
                            asio::as_tuple(asio::use_awaitable_t<asio::io_context::executor_type>{}));
      resumed_on = std::this_thread::get_id();
      t = a.admit(w.with_key, "m", 100, T0);
    }
    co_return static_cast<bool>(t);
  };
  auto f = asio::co_spawn(worker, task(), asio::use_future);
  worker.run();
  EXPECT_TRUE(f.get());
  EXPECT_EQ(lim.refills_, 1);
  EXPECT_EQ(lim.last_.count, 4);
  EXPECT_EQ(resumed_on, std::this_thread::get_id()) << "the completion must run on the worker's executor";
}

// admit_after_refills on a worker: the answer, the refills it waited for.
struct Waited {
  bool admitted = false;
  std::string message;
};
Waited admit_waiting(FakeRemote& lim, Admission& a, const auth::Principal& p) {
  asio::io_context worker;
  auto task = [&]() -> core::Task<Waited> {
    Shortfall wait;
    auto t = a.admit(p, "m", 100, T0, &wait);
    if (!t && wait.pending)
      t = co_await admit_after_refills(lim, wait, 0, worker.get_executor(),
                                       [&](Shortfall* again) { return a.admit(p, "m", 100, T0, again); });
    co_return Waited{static_cast<bool>(t), t ? std::string() : t.error().message};
  };
  auto f = asio::co_spawn(worker, task(), asio::use_future);
  worker.run();
  return f.get();
}

TEST(AdmissionRemoteTest, AWaiterWhoseRefillAnotherRequestTookWaitsAgainWithinThePatience) {
  // A burst: the units a sync granted for waiting requests went into the
  // shared lease and requests that had not waited took them; the waiter's
  // one retry was final, refused while the shared bucket still had units.
  World w;
  FakeRemote lim(w.policy->scopes());
  Admission a(lim, w.pricing, 0);
  lim.pending_tokens_ = true;
  lim.stolen_ = 2;
  lim.patience_ = std::chrono::hours(1);
  EXPECT_TRUE(admit_waiting(lim, a, w.with_key).admitted);
  EXPECT_EQ(lim.refills_, 3);
  EXPECT_TRUE(lim.last_.again);  // the later waits are marked: served by the next regular sync
  EXPECT_EQ(lim.last_.count, 4);
}

TEST(AdmissionRemoteTest, WithoutPatienceAWaiterRefillsOnceThenHasTheFinalAnswer) {
  // Patience 0 (a limiter that failed over or is stopping; the default): one refill, then the bucket's own 429.
  World w;
  FakeRemote lim(w.policy->scopes());
  Admission a(lim, w.pricing, 0);
  lim.pending_tokens_ = true;
  lim.stolen_ = 5;
  const Waited r = admit_waiting(lim, a, w.with_key);
  EXPECT_FALSE(r.admitted);
  EXPECT_EQ(lim.refills_, 1);
  EXPECT_NE(r.message.find("tokens per min"), std::string::npos) << r.message;
  EXPECT_EQ(r.message.find("refreshing"), std::string::npos) << r.message;
}

TEST(AdmissionRemoteTest, APatientWaiterStopsWaitingOnceThePatienceIsOver) {
  World w;
  FakeRemote lim(w.policy->scopes());
  Admission a(lim, w.pricing, 0);
  lim.pending_tokens_ = true;
  lim.stolen_ = 1000000;
  lim.patience_ = std::chrono::milliseconds(30);
  const Waited r = admit_waiting(lim, a, w.with_key);
  EXPECT_FALSE(r.admitted);
  EXPECT_GE(lim.refills_, 1);
  EXPECT_NE(r.message.find("tokens per min"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace weir::admission
