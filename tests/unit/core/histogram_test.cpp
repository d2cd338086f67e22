// core::Histogram's bucket search against std::lower_bound: every bucket set
// Weir uses, values at, below and above every bound, and random ones.
#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "core/metrics.hpp"

namespace weir::core {
namespace {

std::size_t bucket_of(std::span<const std::int64_t> bounds, std::int64_t us) {
  Histogram h(bounds);
  h.observe_us(us);
  const auto& c = h.counts();
  return static_cast<std::size_t>(std::find(c.begin(), c.end(), 1u) - c.begin());
}

std::size_t expected(std::span<const std::int64_t> bounds, std::int64_t us) {
  return static_cast<std::size_t>(std::lower_bound(bounds.begin(), bounds.end(), std::max<std::int64_t>(us, 0)) -
                                  bounds.begin());
}

TEST(Histogram, EveryValueLandsInLowerBoundsBucket) {
  std::mt19937_64 rng(5);
  for (const auto bounds : {latency_buckets_us(), added_latency_buckets_us(), ttft_buckets_us(), itl_buckets_us()}) {
    for (const std::int64_t b : bounds)
      for (const std::int64_t us : {b - 1, b, b + 1}) ASSERT_EQ(bucket_of(bounds, us), expected(bounds, us)) << us;
    for (const std::int64_t us : {std::int64_t{-5}, std::int64_t{0}, std::int64_t{1}, INT64_MAX})
      ASSERT_EQ(bucket_of(bounds, us), expected(bounds, us)) << us;
    for (int i = 0; i < 20000; ++i) {
      const auto us = static_cast<std::int64_t>(rng() % 100'000'000);
      ASSERT_EQ(bucket_of(bounds, us), expected(bounds, us)) << us;
    }
  }
  // Every length of bound list, 1 to 40.
  for (std::size_t n = 1; n <= 40; ++n) {
    std::vector<std::int64_t> bounds(n);
    for (std::size_t i = 0; i < n; ++i) bounds[i] = static_cast<std::int64_t>(10 * (i + 1));
    for (std::int64_t us = 0; us <= static_cast<std::int64_t>(10 * n + 11); ++us)
      ASSERT_EQ(bucket_of(bounds, us), expected(bounds, us)) << n << ' ' << us;
  }
  Histogram none{std::span<const std::int64_t>()};
  none.observe_us(7);
  EXPECT_EQ(none.counts(), std::vector<std::uint64_t>{1});
}

}  // namespace
}  // namespace weir::core
