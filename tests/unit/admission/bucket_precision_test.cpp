// LocalLimiter's buckets decide the same at any uptime (docs/admission.md, "Precision"): a full
// bucket gives exactly its depth, N takes of 1 empty a bucket of N, and a refill takes its exact
// time, whether the limiter has run a second or 1000 days. Its TAT was a double of ns since the
// limiter's epoch: from about a day on, its rounding (ulp(now) / t_ns units) passed the 1e-9 unit
// tolerance, and a full bucket read depth - 1e-8, refusing a request of cost == depth forever.
#include <gtest/gtest.h>

#include "admission/local_limiter.hpp"

namespace weir::admission {
namespace {

using namespace std::chrono_literals;
const Instant kEpoch = Instant(1000h);  // a fake steady clock
constexpr std::int64_t kDays[] = {0, 1, 10, 100, 1000};

Instant at_uptime(std::int64_t days) { return kEpoch + std::chrono::hours(24 * days) + 123'456'789ns; }

std::vector<auth::ScopeInfo> one(std::uint64_t rpm, std::uint64_t rburst, std::uint64_t tpm = 0,
                                 std::uint64_t tburst = 0) {
  std::vector<auth::ScopeInfo> s(1);
  s[0].name = "tenant:t";
  s[0].limits.requests_per_minute = rpm;
  s[0].limits.requests_burst = rburst;
  s[0].limits.tokens_per_minute = tpm;
  s[0].limits.tokens_burst = tburst;
  return s;
}

// The whole bucket's refill time for `units` at `per_min`, ns, rounded up.
std::int64_t refill_ns(double units, std::uint64_t per_min) {
  return static_cast<std::int64_t>(std::ceil(units * 60e9 / static_cast<double>(per_min)));
}

TEST(BucketPrecision, BurstOfOneAdmitsOnceARefillAtAnyUptime) {
  // Non-integer ns per unit (60e9 / 123457 = 486000.15...), one and several shards.
  for (std::int64_t days : kDays)
    for (std::uint64_t rpm : {600u, 3001u, 9999u, 123457u, 7777777u})
      for (std::uint32_t workers : {1u, 2u, 3u, 4u}) {
        LocalLimiter lim(one(rpm, 1), workers, kEpoch, 0);
        const Instant t0 = at_uptime(days);
        const auto period = std::chrono::nanoseconds(refill_ns(1, rpm));
        SCOPED_TRACE(testing::Message() << days << " d, rpm " << rpm << ", " << workers << " workers");
        EXPECT_EQ(lim.available(0, Bucket::requests, t0), 1.0);
        EXPECT_EQ(lim.view(0, Bucket::requests, t0).remaining, 1u);
        ASSERT_TRUE(lim.take(0, Bucket::requests, 0, 1, t0).ok);
        EXPECT_FALSE(lim.take(0, Bucket::requests, workers - 1, 1, t0).ok);
        EXPECT_FALSE(lim.take(0, Bucket::requests, 0, 1, t0 + period - 1us).ok);
        EXPECT_EQ(lim.millis_until(0, Bucket::requests, 1, t0), static_cast<std::uint32_t>((period + 999'999ns) / 1ms));
        // Full again one refill later, and so every second after (10 of 10: 0 of 10 at 1 day before).
        for (int i = 0; i < 10; ++i) {
          const Instant t = t0 + period + std::chrono::seconds(i) + std::chrono::nanoseconds(i * 7919);
          EXPECT_EQ(lim.available(0, Bucket::requests, t), 1.0) << i;
          EXPECT_TRUE(lim.take(0, Bucket::requests, static_cast<std::uint32_t>(i) % workers, 1, t).ok) << i;
        }
      }
}

// Under 1 ns of refill per unit (rates past ~1e9 units a second per worker) each unit costs 1 ns, and a
// bucket that is not quite full read have / t_ns: x-ratelimit-remaining said thousands for a burst of 26
// (regress61). What it shows never passes its depth.
TEST(BucketPrecision, TheLevelShownNeverPassesTheDepthAtSubNanosecondUnits) {
  for (std::uint32_t workers : {1u, 2u}) {
    LocalLimiter lim(one(std::uint64_t{1} << 50, 3, 1'000'000'000'000'000u, 26), workers, kEpoch, 0);
    const Instant t0 = at_uptime(1);
    SCOPED_TRACE(workers);
    for (int i = 0; i < 4; ++i) {
      const Instant t = t0 + std::chrono::microseconds(10 * i);
      (void)lim.take(0, Bucket::tokens, 0, 13, t);
      (void)lim.take(0, Bucket::requests, 0, 1, t);
      EXPECT_LE(lim.available(0, Bucket::tokens, t), 26.0);
      EXPECT_LE(lim.view(0, Bucket::tokens, t).remaining, 26u);
      EXPECT_LE(lim.available(0, Bucket::requests, t), 3.0);
      EXPECT_LE(lim.view(0, Bucket::requests, t).remaining, 3u);
    }
  }
}

TEST(BucketPrecision, BurstOfNAdmitsNAtOneInstantAtAnyUptime) {
  for (std::int64_t days : kDays)
    for (std::uint64_t rpm : {3001u, 9999u, 123457u, 10'000'019u})
      for (std::uint64_t burst : {5u, 37u, 1000u})
        for (std::uint32_t workers : {1u, 3u}) {
          LocalLimiter lim(one(rpm, burst), workers, kEpoch, 0);
          const Instant t0 = at_uptime(days);
          SCOPED_TRACE(testing::Message() << days << " d, rpm " << rpm << ", burst " << burst << ", " << workers);
          EXPECT_EQ(lim.view(0, Bucket::requests, t0).remaining, burst);
          std::uint64_t ok = 0;
          for (std::uint64_t i = 0; i < burst; ++i)
            ok += lim.take(0, Bucket::requests, static_cast<std::uint32_t>(i) % workers, 1, t0).ok ? 1 : 0;
          EXPECT_EQ(ok, burst);
          EXPECT_FALSE(lim.take(0, Bucket::requests, 0, 1, t0).ok);
          EXPECT_EQ(lim.view(0, Bucket::requests, t0).remaining, 0u);
          // The whole bucket back after its refill time, exactly: a take of all of it.
          const auto full = std::chrono::nanoseconds(refill_ns(static_cast<double>(burst), rpm));
          EXPECT_FALSE(lim.take(0, Bucket::requests, 0, static_cast<double>(burst), t0 + full - 1us).ok);
          EXPECT_TRUE(lim.take(0, Bucket::requests, 0, static_cast<double>(burst), t0 + full).ok);
        }
}

TEST(BucketPrecision, CostEqualToDepthFromAFullBucketAtAnyUptime) {
  // tokens_per_minute 1000003, tokens_burst 1000, a 1000-token request every 2 s: 0 of 10 at 1 day before.
  for (std::int64_t days : kDays)
    for (std::uint64_t tpm : {100003u, 1000003u, 2000000u, 7777777u})
      for (std::uint32_t workers : {1u, 2u}) {
        LocalLimiter lim(one(0, 0, tpm, 1000), workers, kEpoch, 0);
        SCOPED_TRACE(testing::Message() << days << " d, tpm " << tpm << ", " << workers << " workers");
        for (int i = 0; i < 10; ++i) {
          const Instant t = at_uptime(days) + std::chrono::seconds(2 * i) + std::chrono::nanoseconds(i * 7919);
          EXPECT_EQ(lim.available(0, Bucket::tokens, t), 1000.0) << i;
          EXPECT_TRUE(lim.take(0, Bucket::tokens, 0, 1000, t).ok) << i;
          EXPECT_FALSE(lim.take(0, Bucket::tokens, 1, 1, t).ok) << i;
        }
        // More than the depth is never admitted.
        EXPECT_TRUE(lim.take(0, Bucket::tokens, 0, 1000.5, at_uptime(days) + 1h).never);
      }
}

TEST(BucketPrecision, RefundsAndDebtAreExactAtAnyUptime) {
  for (std::int64_t days : kDays)
    for (std::uint32_t workers : {1u, 2u, 4u}) {
      // 1000003 tokens a minute (59999.82 ns a token in one shard), 1000 deep.
      LocalLimiter lim(one(0, 0, 1000003, 1000), workers, kEpoch, 0);
      const Instant t0 = at_uptime(days);
      SCOPED_TRACE(testing::Message() << days << " d, " << workers << " workers");
      // A reservation of the whole bucket given back whole: full again at once.
      ASSERT_TRUE(lim.take(0, Bucket::tokens, 0, 1000, t0).ok);
      lim.give_back(0, Bucket::tokens, workers - 1, 1000, t0);
      EXPECT_EQ(lim.available(0, Bucket::tokens, t0), 1000.0);
      ASSERT_TRUE(lim.take(0, Bucket::tokens, 0, 1000, t0).ok);
      // 300 of it given back in pieces: 300 can be taken again, not 301.
      for (int i = 0; i < 3; ++i) lim.give_back(0, Bucket::tokens, static_cast<std::uint32_t>(i) % workers, 100, t0);
      EXPECT_FALSE(lim.take(0, Bucket::tokens, 0, 301, t0).ok);
      EXPECT_TRUE(lim.take(0, Bucket::tokens, 0, 300, t0).ok);
      // A debt of 500 beyond an empty bucket: the whole bucket back after 1500 tokens' refill.
      lim.charge(0, Bucket::tokens, 0, 500, t0);
      EXPECT_EQ(lim.view(0, Bucket::tokens, t0).remaining, 0u);
      const auto full = std::chrono::nanoseconds(refill_ns(1500, 1000003));
      EXPECT_FALSE(lim.take(0, Bucket::tokens, 0, 1000, t0 + full - 1us).ok);
      EXPECT_TRUE(lim.take(0, Bucket::tokens, 0, 1000, t0 + full).ok);
    }
}

TEST(BucketPrecision, AFullBucketCarriedStaysFull) {
  // A reload that changes the rate (another ns per unit) carries the level: full stays exactly full.
  for (std::int64_t days : kDays) {
    auto scopes = one(123457, 3);
    scopes.push_back(scopes[0]);
    scopes[1].limits.requests_per_minute = 9999;
    LocalLimiter lim(scopes, 2, kEpoch, 0);
    const Instant t0 = at_uptime(days);
    lim.carry(0, 1, t0);
    EXPECT_EQ(lim.available(1, Bucket::requests, t0), 3.0) << days;
    ASSERT_TRUE(lim.take(1, Bucket::requests, 0, 3, t0).ok) << days;
    EXPECT_FALSE(lim.take(1, Bucket::requests, 1, 1, t0).ok) << days;
  }
}

}  // namespace
}  // namespace weir::admission
