#include "bench/lib/histogram.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
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

// The midpoint a query reports for a value's bucket.
std::int64_t midpoint_of(std::int64_t v) {
  const auto i = Histogram::index_of(v);
  return Histogram::bucket_low(i) + (Histogram::bucket_high(i) - Histogram::bucket_low(i)) / 2;
}

TEST(BenchHistogram, BucketsCoverRangeWithBoundedWidth) {
  // Buckets below 256 ns are 1 ns wide; from 256 ns to 60 s every bucket is at
  // most 1/128 of its lower edge wide (midpoint within 1/256 of any value in
  // it); below 2^28 ns (268 ms) every bucket is at most 8192 ns wide
  // (midpoint within 4096 ns).
  for (std::size_t i = 0; i < Histogram::kBuckets; ++i) {
    const auto lo = Histogram::bucket_low(i);
    const auto width = Histogram::bucket_high(i) - lo + 1;
    ASSERT_GE(width, 1) << i;
    if (lo < 256) {
      ASSERT_EQ(width, 1) << i;
    } else {
      ASSERT_LE(width * 128, lo) << i;
    }
    if (lo < Histogram::kLinearEndNs) {
      ASSERT_LE(width, 8192) << i;
      ASSERT_LE(width / 2, Histogram::kAbsoluteErrorNs) << i;
    }
  }
  for (std::int64_t v : {0LL, 1LL, 255LL, 256LL, 1000LL, 999'999LL, 1'000'000LL, 60'000'000'000LL}) {
    const auto i = Histogram::index_of(v);
    ASSERT_LT(i, Histogram::kBuckets) << v;
    EXPECT_LE(Histogram::bucket_low(i), v);
    EXPECT_GE(Histogram::bucket_high(i), v);
  }
  EXPECT_EQ(Histogram::bucket_high(Histogram::index_of(Histogram::kLinearStartNs - 1)) + 1 -
                Histogram::bucket_low(Histogram::index_of(Histogram::kLinearStartNs - 1)),
            8192);  // the log-linear width reaches 8192 ns exactly where the linear region starts
}

TEST(BenchHistogram, EveryValueIsInExactlyOneBucketAcrossRegionEdges) {
  // Consecutive buckets tile [0, 2^36) with no gap and no overlap, starting at 0.
  EXPECT_EQ(Histogram::bucket_low(0), 0);
  for (std::size_t i = 0; i + 1 < Histogram::kBuckets; ++i) {
    ASSERT_EQ(Histogram::bucket_high(i) + 1, Histogram::bucket_low(i + 1)) << i;
    ASSERT_EQ(Histogram::index_of(Histogram::bucket_low(i)), i) << i;
    ASSERT_EQ(Histogram::index_of(Histogram::bucket_high(i)), i) << i;
  }
  EXPECT_GE(Histogram::bucket_high(Histogram::kBuckets - 1), Histogram::kMaxNs);
  EXPECT_LT(Histogram::index_of(Histogram::kMaxNs), Histogram::kBuckets);
  // Each value maps into the bucket that contains it, and index_of never goes
  // back: every ns below 2^23 (exact, log-linear and the start of the linear
  // region), and windows around the region edges.
  auto check = [](std::int64_t from, std::int64_t to) {
    std::size_t prev = Histogram::index_of(from);
    for (std::int64_t v = from; v < to; ++v) {
      const auto i = Histogram::index_of(v);
      ASSERT_LE(Histogram::bucket_low(i), v);
      ASSERT_GE(Histogram::bucket_high(i), v);
      ASSERT_TRUE(i == prev || i == prev + 1) << v;
      prev = i;
    }
  };
  check(0, std::int64_t{1} << 23);
  check(Histogram::kLinearEndNs - (1 << 20), Histogram::kLinearEndNs + (1 << 23));
  check(Histogram::kMaxNs - (1 << 23), Histogram::kMaxNs + 1);
  // Region edges: the first value of a region opens a new bucket.
  for (std::int64_t edge : {std::int64_t{256}, Histogram::kLinearStartNs, Histogram::kLinearEndNs}) {
    EXPECT_EQ(Histogram::index_of(edge), Histogram::index_of(edge - 1) + 1) << edge;
    EXPECT_EQ(Histogram::bucket_low(Histogram::index_of(edge)), edge) << edge;
  }
}

TEST(BenchHistogram, AbsoluteBoundUpTo268ms) {
  // A 20 ms first token is resolved to 5 µs, not to the 131 µs of a
  // log-linear octave; so are 100 ms and 250 ms values, and everything in between.
  for (std::int64_t v : {20'000'000LL, 20'000'001LL, 20'004'321LL, 100'000'000LL, 100'008'191LL, 250'000'000LL,
                         250'000'777LL, 2'097'151LL, 2'097'152LL, 268'435'455LL}) {
    EXPECT_LE(std::abs(midpoint_of(v) - v), Histogram::kAbsoluteErrorNs) << v;
    EXPECT_LE(std::abs(midpoint_of(v) - v), 5000) << v;
  }
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<std::int64_t> d(0, Histogram::kLinearEndNs - 1);
  for (int i = 0; i < 1'000'000; ++i) {
    const auto v = d(rng);
    ASSERT_LE(std::abs(midpoint_of(v) - v), Histogram::kAbsoluteErrorNs) << v;
  }
  // Above 2^28 ns only the relative bound holds (a bucket is 2 ms wide at 268 ms).
  EXPECT_GT(Histogram::bucket_high(Histogram::index_of(Histogram::kLinearEndNs)) -
                Histogram::bucket_low(Histogram::index_of(Histogram::kLinearEndNs)),
            8192);
}

TEST(BenchHistogram, RelativeBoundEverywhere) {
  std::mt19937_64 rng(5);
  // Log-uniform over [256 ns, 60 s]: every region gets values.
  std::uniform_real_distribution<double> e(std::log(256.0), std::log(static_cast<double>(Histogram::kMaxNs)));
  for (int i = 0; i < 1'000'000; ++i) {
    const auto v = static_cast<std::int64_t>(std::exp(e(rng)));
    ASSERT_LE(std::abs(static_cast<double>(midpoint_of(v) - v)), Histogram::kRelativeError * static_cast<double>(v))
        << v;
  }
  for (std::int64_t v = 0; v < 256; ++v) ASSERT_EQ(midpoint_of(v), v);
}

TEST(BenchHistogram, PercentilesResolveMicrosecondsAt20ms) {
  // Two populations 20 µs apart around a 20 ms first token (the size of an
  // added TTFT): the percentiles tell them apart, each within 5 µs.
  Histogram h;
  std::vector<std::int64_t> v;
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<std::int64_t> jitter(0, 3000);
  for (int i = 0; i < 10'000; ++i) {
    const std::int64_t x = (i < 5'000 ? 20'000'000 : 20'020'000) + jitter(rng);
    v.push_back(x);
    h.record(x);
  }
  h.record(250'000'000);  // a tail value near the end of the linear region
  v.push_back(250'000'000);
  std::sort(v.begin(), v.end());
  for (double q : {1.0, 25.0, 49.0, 51.0, 75.0, 90.0, 99.0, 99.9, 99.99}) {
    const auto got = h.value_at_percentile(q);
    const auto want = exact_percentile(v, q);
    EXPECT_LE(std::abs(got - want), Histogram::kAbsoluteErrorNs) << q;
  }
  EXPECT_GE(h.value_at_percentile(75) - h.value_at_percentile(25), 15'000);
  EXPECT_EQ(h.value_at_percentile(100), 250'000'000);
}

TEST(BenchHistogram, PercentilesOfUniformDataWithinAbsoluteBound) {
  // 1 µs steps from 1 ms to 250 ms: every percentile within 4096 ns.
  Histogram h;
  std::vector<std::int64_t> v;
  for (std::int64_t x = 1'000'000; x <= 250'000'000; x += 1000) {
    v.push_back(x);
    h.record(x);
  }
  for (double q = 0.5; q < 100.0; q += 0.5) {
    EXPECT_LE(std::abs(h.value_at_percentile(q) - exact_percentile(v, q)), Histogram::kAbsoluteErrorNs) << q;
  }
  EXPECT_EQ(h.min(), 1'000'000);
  EXPECT_EQ(h.max(), 250'000'000);
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

TEST(BenchHistogram, ResetForgetsEverything) {
  Histogram h;
  h.record(20'000'000);
  h.record(Histogram::kMaxNs * 2);
  h.record(-1);
  h.reset();
  EXPECT_EQ(h.count(), 0u);
  EXPECT_EQ(h.above_range(), 0u);
  EXPECT_EQ(h.below_range(), 0u);
  EXPECT_EQ(h.value_at_percentile(50), 0);
  h.record(1000);
  EXPECT_EQ(h.min(), 1000);
  EXPECT_EQ(h.max(), 1000);
  EXPECT_EQ(h.value_at_percentile(50), 1000);
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
