#include "bench/lib/schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

namespace weir::bench {
namespace {

TEST(BenchSchedule, ConstantRateIsExact) {
  Schedule s(Arrivals::constant, 500.0);  // 2 ms apart
  for (std::int64_t i = 0; i < 100'000; ++i) {
    ASSERT_EQ(s.peek(), i * 2'000'000) << i;
    s.advance();
  }
}

TEST(BenchSchedule, ConstantRateWithoutDriftForNonIntegerPeriods) {
  Schedule s(Arrivals::constant, 3.0);  // 333,333,333.3 ns apart
  for (std::int64_t i = 0; i < 30'000; ++i) {
    const auto want = static_cast<std::int64_t>(std::llround(static_cast<long double>(i) * 1e9L / 3.0L));
    ASSERT_EQ(s.peek(), want) << i;
    s.advance();
  }
  EXPECT_EQ(s.peek(), 10'000'000'000'000);  // i = 30,000 lands exactly on 10,000 s
}

TEST(BenchSchedule, ThreadsInterleaveToTheSingleSchedule) {
  // Four streams with phases 0..3 at 1,000 req/s together equal one stream at 1,000 req/s.
  std::multiset<std::int64_t> merged;
  for (std::uint32_t k = 0; k < 4; ++k) {
    Schedule s(Arrivals::constant, 1000.0, 4, k);
    for (int i = 0; i < 1000; ++i) {
      merged.insert(s.peek());
      s.advance();
    }
  }
  Schedule one(Arrivals::constant, 1000.0);
  for (auto t : merged) {
    ASSERT_EQ(t, one.peek());
    one.advance();
  }
}

TEST(BenchSchedule, PoissonMeanRateAndGapsLookExponential) {
  const double rate = 2000.0;
  Schedule s(Arrivals::poisson, rate, 1, 0, 12345);
  const int n = 200'000;
  std::int64_t prev = 0;
  double sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    const auto gap = static_cast<double>(s.peek() - prev);
    ASSERT_GE(gap, 0);
    sum_sq += gap * gap;
    prev = s.peek();
    s.advance();
  }
  const double mean_gap = static_cast<double>(prev) / n;
  EXPECT_NEAR(1e9 / mean_gap, rate, rate * 0.02);
  // Exponential: standard deviation equals the mean (coefficient of variation 1).
  const double var = sum_sq / n - mean_gap * mean_gap;
  EXPECT_NEAR(std::sqrt(var) / mean_gap, 1.0, 0.03);
}

TEST(BenchSchedule, PoissonIsReproducibleFromItsSeed) {
  Schedule a(Arrivals::poisson, 100.0, 1, 0, 9), b(Arrivals::poisson, 100.0, 1, 0, 9),
      c(Arrivals::poisson, 100.0, 1, 0, 10);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(a.peek(), b.peek());
    differs = differs || a.peek() != c.peek();
    a.advance();
    b.advance();
    c.advance();
  }
  EXPECT_TRUE(differs);
}

TEST(BenchSchedule, PoissonSharesSumToTheTotalRate) {
  const double rate = 4000.0;
  std::uint64_t count = 0;
  const std::int64_t horizon = 50'000'000'000;  // 50 s of schedule
  for (std::uint32_t k = 0; k < 4; ++k) {
    Schedule s(Arrivals::poisson, rate, 4, k, 77);
    while (s.peek() < horizon) {
      ++count;
      s.advance();
    }
  }
  EXPECT_NEAR(static_cast<double>(count) / 50.0, rate, rate * 0.02);
}

TEST(BenchPacer, NeverEarlyAndLatenessFromIntendedUnderSimulatedLoad) {
  // A fake clock that advances by irregular "processing" steps, sometimes
  // stalling for many periods (a generator that falls behind).
  const std::int64_t start = 1'000'000'000;
  const std::int64_t end = start + 2'000'000'000;
  Pacer p(Schedule(Arrivals::constant, 10'000.0), start, end);  // 100 µs apart
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<std::int64_t> step(0, 80'000);
  std::int64_t now = 0;
  std::uint64_t released = 0;
  std::int64_t max_lateness = 0;
  std::int64_t last_intended = -1;
  while (!p.done()) {
    now += step(rng);
    if (rng() % 1000 == 0) now += 25'000'000;  // a 25 ms stall
    while (auto d = p.poll(now)) {
      ASSERT_LE(d->intended_ns, now);                   // never before its time
      ASSERT_EQ(d->lateness_ns, now - d->intended_ns);  // charged from the intended time
      ASSERT_EQ(d->intended_ns, start + static_cast<std::int64_t>(d->seq) * 100'000);
      ASSERT_GT(d->intended_ns, last_intended);  // in order, none skipped
      last_intended = d->intended_ns;
      max_lateness = std::max(max_lateness, d->lateness_ns);
      ++released;
    }
    if (auto next = p.next_due()) {
      ASSERT_GT(*next, now);  // nothing due is left behind
    }
  }
  EXPECT_EQ(released, 20'000u);  // every request of the 2 s window, none dropped
  EXPECT_EQ(p.released(), released);
  EXPECT_GE(max_lateness, 25'000'000 - 100'000);  // the stall shows up as lateness
  EXPECT_LE(last_intended, end);
}

TEST(BenchPacer, NothingBeforeStartAndNothingAfterStop) {
  Pacer p(Schedule(Arrivals::constant, 1000.0), 5'000'000, 1'000'000'000);
  EXPECT_FALSE(p.poll(4'999'999).has_value());
  ASSERT_EQ(p.next_due().value(), 5'000'000);
  auto d = p.poll(5'000'000);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->lateness_ns, 0);
  p.stop();
  EXPECT_FALSE(p.poll(900'000'000).has_value());
  EXPECT_FALSE(p.next_due().has_value());
}

}  // namespace
}  // namespace weir::bench
