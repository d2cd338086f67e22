#include "bench/lib/histogram.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

namespace weir::bench {

static_assert(Histogram::kMaxNs < (std::int64_t{1} << 36));

Histogram::Histogram() { counts_.fill(0); }

std::size_t Histogram::index_of(std::int64_t ns) {
  const auto v = static_cast<std::uint64_t>(ns);
  // Octave k such that v < 256·2^k; values below 256 land in octave 0.
  const int msb = 63 - std::countl_zero(v | static_cast<std::uint64_t>(kSubMask));
  const int k = msb - kSubBits;                        // 0 for v < 256
  const auto sub = static_cast<std::int64_t>(v >> k);  // in [0, 256) for k == 0, else [128, 256)
  return static_cast<std::size_t>((static_cast<std::int64_t>(k) << kSubBits) + sub);
}

std::int64_t Histogram::bucket_low(std::size_t index) {
  const auto i = static_cast<std::int64_t>(index);
  if (i < 2 * kSubHalf) return i;
  const std::int64_t k = (i >> kSubBits) - 1;  // octave
  const std::int64_t sub = (i & (kSubHalf - 1)) + kSubHalf;
  return sub << k;
}

std::int64_t Histogram::bucket_high(std::size_t index) {
  const auto i = static_cast<std::int64_t>(index);
  if (i < 2 * kSubHalf) return i;
  const std::int64_t k = (i >> kSubBits) - 1;
  return bucket_low(index) + (std::int64_t{1} << k) - 1;
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

void Histogram::reset() { *this = Histogram(); }

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
