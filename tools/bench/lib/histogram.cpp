#include "bench/lib/histogram.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

namespace weir::bench {

static_assert(Histogram::kMaxNs < (std::int64_t{1} << 36));
static_assert(Histogram::kLinearStartNs == (std::int64_t{1} << 21));
static_assert(Histogram::kLinearEndIndex == 34'432);
static_assert(Histogram::kBuckets == 35'456);

namespace {

// Bucket `index` is [low, low + 2^shift - 1].
struct Geometry {
  std::int64_t low;
  int shift;
};

Geometry geometry(std::size_t index) {
  const auto i = static_cast<std::int64_t>(index);
  constexpr auto kSubHalf = Histogram::kSubHalf;
  constexpr int kSubBits = Histogram::kSubBits;
  if (i < 2 * kSubHalf) return {i, 0};
  if (index < Histogram::kLinearEndIndex) {
    // index = (k << 7) + (v >> k): k from the index, capped at the linear shift.
    const int k = static_cast<int>(std::min<std::int64_t>((i >> kSubBits) - 1, Histogram::kLinearShift));
    return {(i - (std::int64_t{k} << kSubBits)) << k, k};
  }
  const std::int64_t j = i - Histogram::kUpperOffset;  // (k << 7) + sub, sub in [128, 256)
  const int k = static_cast<int>((j >> kSubBits) - 1);
  return {(j - (std::int64_t{k} << kSubBits)) << k, k};
}

}  // namespace

Histogram::Histogram() : counts_(kBuckets, 0) {}

std::size_t Histogram::index_of(std::int64_t ns) {
  const auto v = static_cast<std::uint64_t>(ns);
  // Most significant bit; values below 256 count as bit 7 (octave 0, 1-ns buckets).
  const int msb = 63 - std::countl_zero(v | static_cast<std::uint64_t>(kSubMask));
  if (msb < kLinearEndBits) {
    // Log-linear octaves k = msb - 7 up to k = 13 (8192-ns buckets), then the
    // same 8192-ns width on to 2^28: one formula with k capped.
    const int k = std::min(msb - kSubBits, kLinearShift);
    return (static_cast<std::size_t>(k) << kSubBits) + static_cast<std::size_t>(v >> k);
  }
  const int k = msb - kSubBits;  // 21..28
  return static_cast<std::size_t>(kUpperOffset + (std::int64_t{k} << kSubBits) + static_cast<std::int64_t>(v >> k));
}

std::int64_t Histogram::bucket_low(std::size_t index) { return geometry(index).low; }

std::int64_t Histogram::bucket_high(std::size_t index) {
  const Geometry g = geometry(index);
  return g.low + (std::int64_t{1} << g.shift) - 1;
}

void Histogram::record_n(std::int64_t ns, std::uint64_t n) {
  if (ns > kMaxNs) {
    ns = kMaxNs;
    above_ += n;
  } else if (ns < 0) {
    ns = 0;
    below_ += n;
  }
  counts_[index_of(ns)] += n;
  count_ += n;
  sum_ += static_cast<std::uint64_t>(ns) * n;
  min_ = std::min(min_, ns);
  max_ = std::max(max_, ns);
}

void Histogram::merge(const Histogram& other) {
  if (other.count_ == 0) return;
  for (std::size_t i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  above_ += other.above_;
  below_ += other.below_;
}

void Histogram::reset() {
  std::fill(counts_.begin(), counts_.end(), 0);
  count_ = 0;
  sum_ = 0;
  min_ = kMaxNs;
  max_ = 0;
  above_ = 0;
  below_ = 0;
}

double Histogram::mean() const { return count_ ? static_cast<double>(sum_) / static_cast<double>(count_) : 0.0; }

std::int64_t Histogram::value_at_percentile(double q) const {
  if (count_ == 0) return 0;
  if (q >= 100.0) return max_;
  if (q <= 0.0) return min_;
  // Nearest rank: the ceil(q/100 · N)-th smallest value (1-based).
  auto rank = static_cast<std::uint64_t>(std::ceil(q / 100.0 * static_cast<double>(count_)));
  rank = std::clamp<std::uint64_t>(rank, 1, count_);
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < kBuckets; ++i) {
    seen += counts_[i];
    if (seen >= rank) {
      const std::int64_t lo = bucket_low(i);
      const std::int64_t hi = bucket_high(i);
      return std::clamp(lo + (hi - lo) / 2, min_, max_);
    }
  }
  return max_;
}

}  // namespace weir::bench
