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
