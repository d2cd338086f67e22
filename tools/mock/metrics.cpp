// weir-mock metrics (see metrics.hpp).
#include "metrics.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

#include <fmt/format.h>

namespace weir::mock {
namespace {

// vLLM v1 buckets (vllm/v1/metrics/loggers.py).
constexpr double kTtftBounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                  1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
constexpr double kE2eBounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// The mock's own scheduling lag: how late tokens leave versus their due time.
constexpr double kLagBounds[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0};

// prometheus_client's floatToGoString: "1.0", "0.001", "+Inf".
std::string go_float(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.1f}", v);
  return fmt::format("{}", v);
}

struct Writer {
  std::string out;
  std::string labels;  // engine="0",model_name="..." (sorted, as prometheus_client)

  void head(std::string_view name, std::string_view help, std::string_view type) {
    fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(std::string_view name, double v, std::string_view extra = {}) {
    if (extra.empty())
      fmt::format_to(std::back_inserter(out), "{}{{{}}} {}\n", name, labels, go_float(v));
    else
      fmt::format_to(std::back_inserter(out), "{}{{{}}} {}\n", name, extra, go_float(v));
  }
  void histogram(std::string_view name, std::string_view help, const std::vector<MetricsShard*>& shards,
                 Histogram MetricsShard::*member) {
    head(name, help, "histogram");
    const Histogram& first = shards.front()->*member;
    std::uint64_t cumulative = 0;
    double sum = 0;
    std::uint64_t count = 0;
    for (std::size_t i = 0; i <= first.size(); ++i) {
      for (auto* s : shards) cumulative += (s->*member).bucket(i);
      const std::string le = i < first.size() ? go_float(first.bounds()[i]) : "+Inf";
      // Sorted label order: engine, le, model_name.
      const auto comma = labels.find(',');
      const std::string lbl = labels.substr(0, comma) + ",le=\"" + le + "\"" + labels.substr(comma);
      sample(std::string(name) + "_bucket", static_cast<double>(cumulative), lbl);
    }
    for (auto* s : shards) {
      count += (s->*member).count();
      sum += (s->*member).sum();
    }
    sample(std::string(name) + "_count", static_cast<double>(count));
    sample(std::string(name) + "_sum", sum);
  }
};

}  // namespace

void Histogram::observe(double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  std::size_t i = 0;
  while (i < n_ && seconds > bounds_[i]) ++i;
  bump(counts_[i], std::uint64_t{1});
  bump(count_, std::uint64_t{1});
  bump(sum_ns_, static_cast<std::uint64_t>(std::llround(seconds * 1e9)));
}

MetricsShard::MetricsShard()
    : ttft(kTtftBounds, std::size(kTtftBounds)),
      e2e(kE2eBounds, std::size(kE2eBounds)),
      lag(kLagBounds, std::size(kLagBounds)) {}

std::string render_metrics(const std::vector<MetricsShard*>& shards, const MockConfig& cfg, const Engine& engine) {
  Writer w;
  w.out.reserve(8192);
  w.labels = "engine=\"0\",model_name=\"";
  for (char c : cfg.models.front()) {
    if (c == '\\' || c == '"') w.labels += '\\';
    if (c == '\n') {
      w.labels += "\\n";
      continue;
    }
    w.labels += c;
  }
  w.labels += '"';

  const auto sum = [&](auto member) {
    double v = 0;
    for (auto* s : shards) v += static_cast<double>((s->*member).load(std::memory_order_relaxed));
    return v;
  };

  w.head("vllm:num_requests_running", "Number of requests in model execution batches.", "gauge");
  w.sample("vllm:num_requests_running", sum(&MetricsShard::running));
  w.head("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "gauge");
  w.sample("vllm:num_requests_waiting", static_cast<double>(engine.waiting()));
  w.head("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge");
  const double capacity = engine.cache_on() ? static_cast<double>(engine.capacity_tokens()) : kKvCapacityTokens;
  w.sample("vllm:kv_cache_usage_perc", std::clamp(sum(&MetricsShard::kv_tokens) / capacity, 0.0, 1.0));
  w.head("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", "counter");
  w.sample("vllm:prefix_cache_queries_total", static_cast<double>(engine.queries()));
  w.head("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", "counter");
  w.sample("vllm:prefix_cache_hits_total", static_cast<double>(engine.hits()));
  w.head("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "counter");
  w.sample("vllm:prompt_tokens_total", sum(&MetricsShard::prompt_tokens));
  w.head("vllm:generation_tokens_total", "Number of generation tokens processed.", "counter");
  w.sample("vllm:generation_tokens_total", sum(&MetricsShard::generation_tokens));

  w.head("vllm:request_success_total", "Count of successfully processed requests.", "counter");
  static constexpr std::string_view kReasons[] = {"stop", "length", "abort"};
  for (std::size_t r = 0; r < 3; ++r) {
    double v = 0;
    for (auto* s : shards) v += static_cast<double>(s->success[r].load(std::memory_order_relaxed));
    const auto comma = w.labels.find(',');
    const std::string lbl =
        w.labels.substr(0, comma) + ",finished_reason=\"" + std::string(kReasons[r]) + "\"" + w.labels.substr(comma);
    w.sample("vllm:request_success_total", v, lbl);
  }
  w.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", shards,
              &MetricsShard::ttft);
  w.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", shards,
              &MetricsShard::e2e);

  w.head("weir_mock_injected_errors_total", "Error responses injected by x-mock-status or --error-rate.", "counter");
  w.sample("weir_mock_injected_errors_total", sum(&MetricsShard::injected_errors));
  w.head("weir_mock_injected_resets_total", "Connections reset by x-mock-reset-after or --reset-after.", "counter");
  w.sample("weir_mock_injected_resets_total", sum(&MetricsShard::injected_resets));
  w.head("weir_mock_connections_total", "Accepted TCP connections.", "counter");
  w.sample("weir_mock_connections_total", sum(&MetricsShard::connections));
  if (!cfg.tls_cert.empty()) {
    w.head("weir_mock_tls_handshakes_total", "Completed TLS handshakes (--tls-cert), by session resumption.",
           "counter");
    for (std::size_t r = 0; r < 2; ++r) {
      double v = 0;
      for (auto* s : shards) v += static_cast<double>(s->tls_handshakes[r].load(std::memory_order_relaxed));
      w.sample("weir_mock_tls_handshakes_total", v, w.labels + (r ? ",resumed=\"true\"" : ",resumed=\"false\""));
    }
    w.head("weir_mock_tls_handshake_failures_total", "TLS handshakes that failed (--tls-cert).", "counter");
    w.sample("weir_mock_tls_handshake_failures_total", sum(&MetricsShard::tls_handshake_failures));
  }
  w.histogram("weir_mock_token_lag_seconds",
              "How late each token (or non-streaming response) left versus its due time.", shards, &MetricsShard::lag);
  return std::move(w.out);
}

}  // namespace weir::mock
