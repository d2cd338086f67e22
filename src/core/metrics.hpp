// Metric primitives for per-worker shards (one writer: the worker's thread)
// and the Prometheus text exposition format 0.0.4.
//
// A shard is never read by another thread: /metrics posts a collection job to
// every worker, each copies its shard, and the copies are merged. So the hot
// path is a plain add, with no atomics and no locks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weir::core {

// Cumulative histogram over fixed upper bounds in µs (Prometheus "le" in seconds).
class Histogram {
 public:
  Histogram() = default;
  explicit Histogram(std::span<const std::int64_t> bounds_us);

  // Records one observation of `us` microseconds. O(log buckets), no allocation.
  void observe_us(std::int64_t us);
  // Adds another histogram with the same bounds.
  void merge(const Histogram& o);

  std::span<const std::int64_t> bounds_us() const { return bounds_; }
  // Per-bucket (non-cumulative) counts; the last entry is the +Inf bucket.
  const std::vector<std::uint64_t>& counts() const { return counts_; }
  std::uint64_t count() const { return count_; }
  std::uint64_t sum_us() const { return sum_us_; }

 private:
  std::span<const std::int64_t> bounds_;
  std::vector<std::uint64_t> counts_;
  std::uint64_t count_ = 0;
  std::uint64_t sum_us_ = 0;
};

// Bucket sets (µs). Latency: 25 µs .. 60 s; fine: 5 µs .. 100 ms for gateway-added time.
std::span<const std::int64_t> latency_buckets_us();
std::span<const std::int64_t> added_latency_buckets_us();
// Time to first token: 1 ms, 2.5 ms, then 5 ms steps to 200 ms (a 50 ms TTFT
// and a 90 ms one land 8 buckets apart), then coarser to 60 s.
std::span<const std::int64_t> ttft_buckets_us();
// Inter-token latency (between two SSE data events of a stream): 250 µs,
// 500 µs, 1 ms steps to 10 ms, 2 ms steps to 20 ms, then coarser to 60 s.
std::span<const std::int64_t> itl_buckets_us();

// Counters keyed by a packed label tuple (64 bits; ~0 is reserved), for
// families whose label sets are sparse (tenant x key x model x status):
// only the series that occur take memory. Open addressing with linear
// probing, grown at half load, so a new series allocates at most once per
// doubling and a known one never does: add() is one hash and a probe.
// One writer (a worker's thread), like the rest of a shard.
class CounterMap {
 public:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  // Starts with room for `capacity` series (rounded up to a power of two, at least 16).
  explicit CounterMap(std::size_t capacity = 64);

  // Adds `n` to the series `key` (creating it at 0 first). `key` != kEmpty.
  void add(std::uint64_t key, std::uint64_t n);
  // The value of `key`, 0 when it never occurred.
  std::uint64_t get(std::uint64_t key) const;
  // Adds every series of `o`.
  void merge(const CounterMap& o);
  // Removes every series whose key `drop(key)` is true for (a rebuild, O(capacity): not for a hot path).
  template <class Pred>
  void erase_if(Pred drop) {
    std::vector<std::uint64_t> keys(keys_.size(), kEmpty), values(keys_.size(), 0);
    keys.swap(keys_);
    values.swap(values_);
    size_ = 0;
    for (std::size_t j = 0; j < keys.size(); ++j)
      if (keys[j] != kEmpty && !drop(keys[j])) add(keys[j], values[j]);
  }
  // Adds the series of `o` whose key `keep(key)` is true for.
  template <class Pred>
  void merge_if(const CounterMap& o, Pred keep) {
    for (std::size_t j = 0; j < o.keys_.size(); ++j)
      if (o.keys_[j] != kEmpty && keep(o.keys_[j])) add(o.keys_[j], o.values_[j]);
  }
  // Every series as (key, value), sorted by key.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sorted() const;
  std::size_t size() const { return size_; }

 private:
  std::size_t slot_of(std::uint64_t key) const;
  void grow();

  std::vector<std::uint64_t> keys_;    // kEmpty = free slot; size is a power of two
  std::vector<std::uint64_t> values_;  // parallel to keys_
  std::size_t size_ = 0;
  unsigned shift_ = 0;  // 64 - log2(keys_.size()), for the multiplicative hash
};

// Writes Prometheus text exposition format (version 0.0.4) into a string.
// `labels` is pre-rendered without braces, e.g. `model="a",status="200"`.
class PromWriter {
 public:
  explicit PromWriter(std::string& out) : out_(out) {}
  void header(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, std::string_view labels, double value);
  void sample(std::string_view name, std::string_view labels, std::uint64_t value);
  void histogram(std::string_view name, std::string_view labels, const Histogram& h);

 private:
  std::string& out_;
};

// Escapes a label value per the exposition format (backslash, quote, newline).
std::string escape_label(std::string_view v);

}  // namespace weir::core
