// Latency histogram for weir-bench: buckets over nanoseconds, mergeable
// across threads, fine enough that the differences the benchmark compares
// (tens of µs of added latency on a 20 ms first token) are resolved.
//
// Why our own and not Boost.Histogram: recording happens once per SSE token
// (hundreds of thousands per second per core), and the index here is one
// count-leading-zeros, a min, two shifts and one well-predicted branch, with
// no loop and no floating point; Boost.Histogram's regular/log axes need a
// log() per value and a variable axis needs a binary search. Percentile
// queries, merging and the error bounds are a few lines each on this layout.
//
// Layout (unit 1 ns), three regions, contiguous (bucket_high(i) + 1 ==
// bucket_low(i + 1)), so every value in [0, kMaxNs] is in exactly one bucket:
//   [0, 256) ns            : one bucket per ns (exact);
//   [256 ns, 2^21 ns)      : log-linear as HdrHistogram with 2 significant
//                            digits: [128·2^k, 256·2^k) in 128 sub-buckets of
//                            2^k ns, k = 1..13 (widths 2 ns .. 8192 ns);
//   [2^21 ns, 2^28 ns)     : linear, 8192-ns buckets (2.1 ms .. 268 ms);
//   [2^28 ns, 2^36 ns)     : log-linear again, 128 sub-buckets per octave
//                            (up to kMaxNs = 60 s).
// A query returns the bucket's midpoint, so the reported value is
//   - within kAbsoluteErrorNs = 4096 ns (≤ 5 µs) of the recorded value it
//     stands for, for every value below kLinearEndNs = 2^28 ns ≈ 268 ms
//     (bucket width ≤ 8192 ns there). Why: a 20 ms TTFT in a log-linear
//     layout lands in the [16.8 ms, 33.6 ms) octave, in 131 µs buckets: as
//     wide as the added latencies the suites compare. Every first token
//     (20–90 ms mocks), inter-token gap and non-streamed e2e the suites
//     compare is below 268 ms; a whole stream's e2e (seconds) keeps the
//     relative bound;
//   - within kRelativeError = 1/256 (0.39 %) of it everywhere from 256 ns to
//     60 s (bucket width ≤ 1/128 of its lower edge), exact below 256 ns.
// min, max, count and mean are kept exactly. 35,456 counters (277 KiB) per
// histogram, on the heap (a Stats holds five; weir-bench has one Stats per
// thread plus the merged one).
#pragma once

#include <cstdint>
#include <vector>

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

  // Absolute error bound of value_at_percentile() against the recorded value
  // of the same rank, for values below kLinearEndNs (half the widest bucket
  // there, 8192 ns).
  static constexpr std::int64_t kAbsoluteErrorNs = 4096;

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
  // The linear region: buckets of 2^kLinearShift ns from 2^(kLinearShift + 8)
  // (where the log-linear width reaches 8192 ns) to 2^kLinearEndBits ns.
  static constexpr int kLinearShift = 13;                                                           // 8192-ns buckets
  static constexpr int kLinearEndBits = 28;                                                         // up to 2^28 ns
  static constexpr std::int64_t kLinearStartNs = std::int64_t{1} << (kLinearShift + kSubBits + 1);  // 2^21
  static constexpr std::int64_t kLinearEndNs = std::int64_t{1} << kLinearEndBits;                   // 2^28
  // Below kLinearEndNs the index is (k << 7) + (v >> k) with k = min(msb - 7, 13),
  // the last one (13 << 7) + 2^15 - 1. Above, the octaves k = 21..28 continue
  // from there: index = kUpperOffset + (k << 7) + (v >> k).
  static constexpr std::size_t kLinearEndIndex =
      (std::size_t{kLinearShift} << kSubBits) + (std::size_t{1} << (kLinearEndBits - kLinearShift));  // 34,432
  static constexpr std::int64_t kUpperOffset =
      static_cast<std::int64_t>(kLinearEndIndex) - ((std::int64_t{kLinearEndBits - kSubBits} << kSubBits) + kSubHalf);
  // kMaxNs < 2^36: top octave k = 36 - 8 = 28.
  static constexpr std::size_t kBuckets = static_cast<std::size_t>(kUpperOffset + (28 << kSubBits) + 2 * kSubHalf);

 private:
  std::vector<std::uint64_t> counts_;  // kBuckets counters
  std::uint64_t count_ = 0;
  std::uint64_t sum_ = 0;  // ns; 2^64 ns is 584 years of summed latency
  std::int64_t min_ = kMaxNs;
  std::int64_t max_ = 0;
  std::uint64_t above_ = 0;
  std::uint64_t below_ = 0;
};

}  // namespace weir::bench
