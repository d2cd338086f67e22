// Which admission scopes are held and which are free to reuse
// (admission/scope_ledger.hpp): a policy's hold, a carry's pin, and a
// LocalLimiter that starts a reused scope afresh (Limiter::adopt).
#include "admission/scope_ledger.hpp"

#include <chrono>

#include <gtest/gtest.h>

#include "admission/local_limiter.hpp"
#include "auth/policy.hpp"

namespace weir::admission {
namespace {

using V = std::vector<std::uint32_t>;

TEST(ScopeLedger, AScopeIsFreeOnceItsLastHolderWent) {
  auto ledger = std::make_shared<ScopeLedger>();
  V reused;
  auto a = ledger->hold({0, 1, 2}, reused);
  auto b = ledger->hold({1, 2, 3}, reused);
  EXPECT_TRUE(reused.empty());
  a.reset();
  EXPECT_EQ(ledger->reusable(), V({0}));
  b.reset();
  EXPECT_EQ(ledger->reusable(), V({0, 1, 2, 3}));
  // Taken again: said as reused, no longer free.
  auto c = ledger->hold({2, 5}, reused);
  EXPECT_EQ(reused, V({2}));
  EXPECT_EQ(ledger->reusable(), V({0, 1, 3}));
  EXPECT_EQ(ledger->held(), 2u);
}

TEST(ScopeLedger, AScopeCarriedToAnotherHoldsItWhileItIsHeld) {
  auto ledger = std::make_shared<ScopeLedger>();
  V reused;
  auto oldest = ledger->hold({0}, reused);  // a request still admitted under scope 0
  auto middle = ledger->hold({1}, reused);
  ledger->pin(0, 1);  // 0 carried to 1
  auto newest = ledger->hold({2}, reused);
  ledger->pin(1, 2);  // 1 carried to 2
  middle.reset();
  newest.reset();
  // 0's tickets follow 0 -> 1 -> 2: neither may be reused yet.
  EXPECT_TRUE(ledger->reusable().empty());
  oldest.reset();
  EXPECT_EQ(ledger->reusable(), V({0, 1, 2}));
  // A scope no one holds pins nothing (no ticket can name it).
  ledger->pin(0, 5);
  auto d = ledger->hold({5}, reused);
  d.reset();
  EXPECT_EQ(ledger->reusable(), V({0, 1, 2, 5}));
}

auth::AuthConfig tenants(int rpm_a) {
  auth::AuthConfig c;
  auth::TenantConfig a;
  a.name = "a";
  a.limits.requests_per_minute = static_cast<std::uint64_t>(rpm_a);
  a.limits.max_concurrent_streams = 1;
  c.tenants.emplace("a", a);
  auth::TenantConfig b;
  b.name = "b";
  b.limits.requests_per_minute = 5;
  c.tenants.emplace("b", b);
  return c;
}

TEST(LimiterAdopt, AReusedScopeStartsAfreshAndTheOldPolicysTicketsStillFollowTheirCarry) {
  const auto now = std::chrono::steady_clock::now();
  auto p0 = auth::AuthPolicy::build(tenants(10));
  LocalLimiter lim(p0->scopes(), 1, now - std::chrono::hours(1));
  auto held0 = lim.adopt(p0);
  p0.reset();
  const auto a0 = held0->find_tenant("a")->scope;
  ASSERT_TRUE(lim.acquire_stream(a0, 0));  // a stream admitted under the first policy, still running
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(lim.take(a0, Bucket::requests, 0, 1, now).ok);
  // Reload 1: a's limits change (a new scope, carried over).
  auto p1 =
      lim.adopt(auth::AuthPolicy::build(tenants(20), {}, {lim.scope_count(), lim.reusable_scopes()}, held0.get()));
  const auto a1 = p1->find_tenant("a")->scope;
  lim.carry(a0, a1, now);
  // Reload 2, then 3: p1 goes (as the workers drop it), a changes again each time.
  auto p2 = lim.adopt(auth::AuthPolicy::build(tenants(30), {}, {lim.scope_count(), lim.reusable_scopes()}, p1.get()));
  const auto a2 = p2->find_tenant("a")->scope;
  lim.carry(a1, a2, now);
  p1.reset();
  // a1 is named by no policy, but a0's stream follows a0 -> a1 -> a2: not reusable.
  EXPECT_TRUE(lim.reusable_scopes().empty());
  EXPECT_EQ(lim.streams_in_use(a2), 1u);
  lim.release_stream(a0, 0);
  EXPECT_EQ(lim.streams_in_use(a2), 0u);
  // The first policy goes too (its last request ended): a0 and a1 are free,
  // and the next change takes the lowest, started afresh (a full bucket of
  // the new limits, no spend, no forward link).
  held0.reset();
  EXPECT_EQ(lim.reusable_scopes(), V({a0, a1}));
  const auto count = lim.scope_count();
  auto p3 = lim.adopt(auth::AuthPolicy::build(tenants(40), {}, {lim.scope_count(), lim.reusable_scopes()}, p2.get()));
  const auto a3 = p3->find_tenant("a")->scope;
  EXPECT_EQ(a3, a0);
  lim.carry(a2, a3, now);
  EXPECT_EQ(lim.scope_count(), count);
  EXPECT_EQ(lim.view(a3, Bucket::requests, now).limit, 40u);
  EXPECT_TRUE(lim.acquire_stream(a3, 0));
  EXPECT_EQ(lim.streams_in_use(a3), 1u);
}

}  // namespace
}  // namespace weir::admission
