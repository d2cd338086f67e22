// weir-mock metrics with vLLM's Prometheus names (vllm/v1/metrics/loggers.py, v0.10.x):
// labels model_name (the first --model) and engine ("0").
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "config.hpp"
#include "engine.hpp"

namespace weir::mock {

// Adds to a counter owned by one writer thread: a relaxed load and store, no
// locked instruction. Readers on other threads see a recent value.
template <class T>
inline void bump(std::atomic<T>& a, T v) {
  a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
}

// A Prometheus histogram with fixed upper bounds (seconds), single writer.
class Histogram {
 public:
  static constexpr std::size_t kMaxBuckets = 24;
  Histogram(const double* bounds, std::size_t n) : bounds_(bounds), n_(n) {}
  void observe(double seconds);
  const double* bounds() const { return bounds_; }
  std::size_t size() const { return n_; }
  // Observations <= bounds()[i]: not cumulative per bucket (render sums them).
  std::uint64_t bucket(std::size_t i) const { return counts_[i].load(std::memory_order_relaxed); }
  std::uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9; }

 private:
  const double* bounds_;
  std::size_t n_;
  std::array<std::atomic<std::uint64_t>, kMaxBuckets + 1> counts_{};  // last: above every bound
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_ns_{0};
};

// The finish reasons vLLM counts in vllm:request_success_total.
enum class Finish : std::uint8_t { stop = 0, length = 1, abort = 2 };

// One worker thread's metrics; written only by that thread, read by any
// thread that renders /metrics.
struct MetricsShard {
  MetricsShard();
  std::atomic<std::int64_t> running{0};                        // generations in progress
  std::atomic<std::int64_t> kv_tokens{0};                      // prompt + generated tokens of running requests
  std::atomic<std::uint64_t> prompt_tokens{0};                 // vllm:prompt_tokens_total
  std::atomic<std::uint64_t> generation_tokens{0};             // vllm:generation_tokens_total
  std::array<std::atomic<std::uint64_t>, 3> success{};         // vllm:request_success_total by Finish
  std::atomic<std::uint64_t> injected_errors{0};               // x-mock-status / --error-rate answers
  std::atomic<std::uint64_t> injected_resets{0};               // x-mock-reset-after / --reset-after RSTs
  std::atomic<std::uint64_t> connections{0};                   // accepted connections
  std::array<std::atomic<std::uint64_t>, 2> tls_handshakes{};  // --tls-cert: completed handshakes, [1] resumed
  std::atomic<std::uint64_t> tls_handshake_failures{0};        // --tls-cert: handshakes that failed
  Histogram ttft;                                              // vllm:time_to_first_token_seconds
  Histogram e2e;                                               // vllm:e2e_request_latency_seconds
  Histogram lag;  // weir_mock_token_lag_seconds: token sent minus token due
};

// KV-cache capacity the mock pretends to have, tokens (vllm:kv_cache_usage_perc).
inline constexpr double kKvCapacityTokens = 1 << 20;

// Renders every shard, summed, in the Prometheus text format 0.0.4 as
// prometheus_client writes it (sorted labels, float values).
// `engine` gives vllm:num_requests_waiting, the prefix cache counters and,
// with --prefix-cache-tokens, the KV capacity.
std::string render_metrics(const std::vector<MetricsShard*>& shards, const MockConfig& cfg, const Engine& engine);

}  // namespace weir::mock
