#include "bench/lib/histogram.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace weir::bench {
namespace {

// The nearest-rank percentile of sorted data, the definition the histogram follows.
std::int64_t exact_percentile(const std::vector<std::int64_t>& sorted, double q) {
  if (q >= 100) return sorted.back();
  auto rank = static_cast<std::size_t>(std::ceil(q / 100.0 * static_cast<double>(sorted.size())));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

void expect_within(std::int64_t got, std::int64_t want, double rel) {
  EXPECT_LE(std::abs(static_cast<double>(got - want)), rel * static_cast<double>(want) + 0.5)
      << "got " << got << " want " << want;
}

TEST(BenchHistogram, BucketsCoverRangeWithBoundedWidth) {
  // Every bucket is at most 1/128 of its lower edge wide, from 256 ns to 60 s,
  // and buckets below 256 ns are 1 ns wide.
  for (std::int64_t v : {0LL, 1LL, 255LL, 256LL, 1000LL, 999'999LL, 1'000'000LL, 60'000'000'000LL}) {
    const auto i = Histogram::index_of(v);
    ASSERT_LT(i, Histogram::kBuckets) << v;
    EXPECT_LE(Histogram::bucket_low(i), v);
    EXPECT_GE(Histogram::bucket_high(i), v);
    const auto width = Histogram::bucket_high(i) - Histogram::bucket_low(i) + 1;
    if (v < 256) {
      EXPECT_EQ(width, 1);
    } else {
      EXPECT_LE(static_cast<double>(width), static_cast<double>(Histogram::bucket_low(i)) / 128.0);
    }
  }
  // Consecutive buckets tile the line with no gap.
  for (std::size_t i = 0; i + 1 < Histogram::kBuckets; ++i) {
    ASSERT_EQ(Histogram::bucket_high(i) + 1, Histogram::bucket_low(i + 1)) << i;
  }
}

TEST(BenchHistogram, PercentilesOfUniformDataWithinStatedError) {
  Histogram h;
  std::vector<std::int64_t> v;
  for (std::int64_t i = 1; i <= 100'000; ++i) {
    v.push_back(i * 1000);  // 1 µs .. 100 ms
    h.record(i * 1000);
  }
  for (double q : {1.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99}) {
    expect_within(h.value_at_percentile(q), exact_percentile(v, q), Histogram::kRelativeError);
  }
  EXPECT_EQ(h.max(), 100'000'000);
  EXPECT_EQ(h.min(), 1000);
  EXPECT_EQ(h.count(), 100'000u);
  EXPECT_DOUBLE_EQ(h.mean(), 50'000'500.0);
  EXPECT_EQ(h.value_at_percentile(100), 100'000'000);
}

TEST(BenchHistogram, PercentilesOfLogNormalDataWithinOnePercent) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> dist(std::log(2e6), 1.5);  // ~2 ms median, wide tail
  Histogram h;
  std::vector<std::int64_t> v;
  for (int i = 0; i < 200'000; ++i) {
    const auto x = std::clamp<std::int64_t>(static_cast<std::int64_t>(dist(rng)), 1000, Histogram::kMaxNs);
    v.push_back(x);
    h.record(x);
  }
  std::sort(v.begin(), v.end());
  for (double q : {50.0, 90.0, 99.0, 99.9}) {
    expect_within(h.value_at_percentile(q), exact_percentile(v, q), 0.01);
    expect_within(h.value_at_percentile(q), exact_percentile(v, q), Histogram::kRelativeError);
  }
  EXPECT_EQ(h.max(), v.back());
}

TEST(BenchHistogram, SmallExactValues) {
  Histogram h;
  for (int i = 0; i < 10; ++i) h.record(1000);  // 1 µs
  h.record(1);
  EXPECT_EQ(h.min(), 1);
  EXPECT_EQ(h.value_at_percentile(5), 1);
  expect_within(h.value_at_percentile(50), 1000, Histogram::kRelativeError);
  EXPECT_EQ(h.max(), 1000);
}

TEST(BenchHistogram, EdgeValues) {
  Histogram h;
  h.record(0);
  h.record(1000);
  h.record(Histogram::kMaxNs);
  EXPECT_EQ(h.count(), 3u);
  EXPECT_EQ(h.min(), 0);
  EXPECT_EQ(h.value_at_percentile(0), 0);
  EXPECT_EQ(h.value_at_percentile(33), 0);
  expect_within(h.value_at_percentile(66), 1000, Histogram::kRelativeError);
  EXPECT_EQ(h.value_at_percentile(100), Histogram::kMaxNs);
  expect_within(h.value_at_percentile(99), Histogram::kMaxNs, Histogram::kRelativeError);
  EXPECT_EQ(h.above_range(), 0u);
  EXPECT_EQ(h.below_range(), 0u);
}

TEST(BenchHistogram, BeyondRangeIsClampedAndCounted) {
  Histogram h;
  h.record(Histogram::kMaxNs + 1);
  h.record(10 * Histogram::kMaxNs);
  h.record(-5);
  EXPECT_EQ(h.count(), 3u);
  EXPECT_EQ(h.above_range(), 2u);
  EXPECT_EQ(h.below_range(), 1u);
  EXPECT_EQ(h.max(), Histogram::kMaxNs);
  EXPECT_EQ(h.min(), 0);
}

TEST(BenchHistogram, MergeEqualsRecordingEverythingInOne) {
  Histogram a, b, all;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::int64_t> d(1000, 5'000'000'000);
  for (int i = 0; i < 50'000; ++i) {
    const auto x = d(rng);
    (i % 3 ? a : b).record(x);
    all.record(x);
  }
  b.record(Histogram::kMaxNs * 2);
  all.record(Histogram::kMaxNs * 2);
  Histogram m;
  m.merge(a);
  m.merge(b);
  EXPECT_EQ(m.count(), all.count());
  EXPECT_EQ(m.min(), all.min());
  EXPECT_EQ(m.max(), all.max());
  EXPECT_EQ(m.above_range(), 1u);
  EXPECT_DOUBLE_EQ(m.mean(), all.mean());
  for (double q : {50.0, 90.0, 99.0, 99.9}) {
    EXPECT_EQ(m.value_at_percentile(q), all.value_at_percentile(q));
  }
  Histogram empty;
  m.merge(empty);
  EXPECT_EQ(m.count(), all.count());
}

TEST(BenchHistogram, EmptyReportsZero) {
  Histogram h;
  EXPECT_EQ(h.count(), 0u);
  EXPECT_EQ(h.value_at_percentile(99), 0);
  EXPECT_EQ(h.min(), 0);
  EXPECT_EQ(h.max(), 0);
}

}  // namespace
}  // namespace weir::bench
