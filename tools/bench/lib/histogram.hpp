// Latency histogram for weir-bench: HDR-style log-linear buckets over
// nanoseconds, mergeable across threads.
//
// Why our own and not Boost.Histogram: recording happens once per SSE token
// (hundreds of thousands per second per core), and the log-linear index here
// is one count-leading-zeros and two shifts, with a fixed 30 KB array and no
// floating point; Boost.Histogram's regular/log axes need a log() per value
// and a variable axis needs a binary search. Percentile queries, merging and
// the error bound are a few lines each on this layout.
//
// Layout (as in HdrHistogram with 2 significant digits, unit 1 ns):
//   values in [0, 256) ns        : one bucket per ns (exact);
//   values in [128·2^k, 256·2^k) : 128 linear sub-buckets of width 2^k ns.
// A bucket's width is at most 1/128 of its lower edge, and a query returns
// the bucket's midpoint, so any reported value is within 1/256 (0.39 %) of
// the recorded value it stands for: well inside the 1 % required over
// [1 µs, 60 s]. min, max, count and mean are kept exactly.
#pragma once

#include <array>
#include <cstdint>

namespace weir::bench {

class Histogram {
 public:
  // Highest trackable value: 60 s in ns. Larger values are recorded as this
  // value and counted in above_range(); negative values are recorded as 0
  // and counted in below_range().
  static constexpr std::int64_t kMaxNs = 60'000'000'000;

  // Relative error bound of value_at_percentile() against the recorded value
  // of the same rank, for values >= 256 ns (below that it is exact).
  static constexpr double kRelativeError = 1.0 / 256.0;

  Histogram();

  // Records one value in nanoseconds (clamped to [0, kMaxNs] and counted as
  // out of range when clamped).
  void record(std::int64_t ns) { record_n(ns, 1); }
  void record_n(std::int64_t ns, std::uint64_t n);

  // Adds all of `other`'s counts (the histograms of all threads merge into one).
  void merge(const Histogram& other);

  // Forgets everything.
  void reset();

  // Value in ns at percentile `q` in [0, 100], nearest-rank definition: the
  // smallest recorded value v such that at least q % of values are <= v,
  // reported as its bucket's midpoint clamped to [min, max]. q >= 100 returns
  // max() exactly; an empty histogram returns 0.
  std::int64_t value_at_percentile(double q) const;

  std::uint64_t count() const { return count_; }
  std::int64_t min() const { return count_ ? min_ : 0; }  // ns, exact (after clamping)
  std::int64_t max() const { return max_; }               // ns, exact (after clamping)
  double mean() const;                                    // ns, exact (after clamping)
  std::uint64_t above_range() const { return above_; }    // values > kMaxNs seen
  std::uint64_t below_range() const { return below_; }    // values < 0 seen

  // Bucket geometry (exposed for tests): index of a value and the [low, high]
  // range of values that share a bucket.
  static std::size_t index_of(std::int64_t ns);
  static std::int64_t bucket_low(std::size_t index);
  static std::int64_t bucket_high(std::size_t index);

  static constexpr int kSubBits = 7;                             // 128 sub-buckets per octave
  static constexpr std::int64_t kSubHalf = 1 << kSubBits;        // 128
  static constexpr std::int64_t kSubMask = (kSubHalf << 1) - 1;  // 255
  // kMaxNs < 2^36: top bucket exponent 36 - 8 = 28, indices < (28 + 2) · 128.
  static constexpr std::size_t kBuckets = (28 + 2) * kSubHalf;

 private:
  std::array<std::uint64_t, kBuckets> counts_;
  std::uint64_t count_ = 0;
  std::uint64_t sum_ = 0;  // ns; 2^64 ns is 584 years of summed latency
  std::int64_t min_ = kMaxNs;
  std::int64_t max_ = 0;
  std::uint64_t above_ = 0;
  std::uint64_t below_ = 0;
};

}  // namespace weir::bench
