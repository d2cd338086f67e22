#include "gateway/metrics.hpp"

#include <fmt/format.h>

namespace weir::gateway {

namespace {
constexpr std::size_t kListed = 18;  // non-zero entries of kStatuses
}

MetricsShard::MetricsShard(std::size_t configured_models)
    : models_(configured_models + 2),
      requests_(static_cast<std::size_t>(RouteKind::count_) * models_ * kStatusSlots, 0),
      ttft_(models_, core::Histogram(core::latency_buckets_us())),
      upstream_(models_, core::Histogram(core::latency_buckets_us())),
      duration_(models_, core::Histogram(core::latency_buckets_us())),
      prompt_tokens_(models_, 0),
      completion_tokens_(models_, 0),
      added_(core::added_latency_buckets_us()) {}

std::size_t MetricsShard::status_slot(int status) {
  for (std::size_t i = 0; i < kListed; ++i)
    if (kStatuses[i] == status) return i;
  int cls = status / 100;
  if (cls < 1 || cls > 5) cls = 5;
  return kListed + static_cast<std::size_t>(cls);  // 19..23
}

void MetricsShard::merge(const MetricsShard& o) {
  for (std::size_t i = 0; i < requests_.size() && i < o.requests_.size(); ++i) requests_[i] += o.requests_[i];
  for (std::size_t i = 0; i < models_ && i < o.models_; ++i) {
    ttft_[i].merge(o.ttft_[i]);
    upstream_[i].merge(o.upstream_[i]);
    duration_[i].merge(o.duration_[i]);
    prompt_tokens_[i] += o.prompt_tokens_[i];
    completion_tokens_[i] += o.completion_tokens_[i];
  }
  added_.merge(o.added_);
  active_streams += o.active_streams;
  active_connections += o.active_connections;
  upstream_connects += o.upstream_connects;
  for (std::size_t i = 0; i < retries_.size(); ++i) retries_[i] += o.retries_[i];
  for (std::size_t i = 0; i < picks_.size(); ++i) picks_[i] += o.picks_[i];
  upstream_fallbacks += o.upstream_fallbacks;
  retry_budget_exhausted += o.retry_budget_exhausted;
  outlier_ejections += o.outlier_ejections;
  health_transitions += o.health_transitions;
  for (std::size_t i = 0; i < upstream_failures_.size(); ++i) upstream_failures_[i] += o.upstream_failures_[i];
  client_disconnects += o.client_disconnects;
  slow_client_cutoffs += o.slow_client_cutoffs;
  bytes_in += o.bytes_in;
  bytes_out += o.bytes_out;
  sse_events += o.sse_events;
}

void MetricsShard::render(std::string& out, const core::Config& cfg, std::uint64_t log_errors) const {
  core::PromWriter w(out);
  auto model_label = [&](std::size_t i) -> std::string {
    if (i < cfg.models.size()) return core::escape_label(cfg.models[i].name);
    return i == models_ - 2 ? "*" : "";
  };
  auto status_label = [](std::size_t slot) -> std::string {
    if (slot < kListed) return std::to_string(kStatuses[slot]);
    return fmt::format("{}xx", slot - kListed);
  };

  w.header("weir_requests_total", "counter", "Requests answered, by route, model and HTTP status.");
  for (std::size_t r = 0; r < static_cast<std::size_t>(RouteKind::count_); ++r)
    for (std::size_t m = 0; m < models_; ++m)
      for (std::size_t s = 0; s < kStatusSlots; ++s) {
        const auto v = requests_[(r * models_ + m) * kStatusSlots + s];
        if (v == 0) continue;
        w.sample("weir_requests_total",
                 fmt::format("route=\"{}\",model=\"{}\",status=\"{}\"", route_label(static_cast<RouteKind>(r)),
                             model_label(m), status_label(s)),
                 v);
      }

  auto hist = [&](const char* name, const char* help, const std::vector<core::Histogram>& hs) {
    w.header(name, "histogram", help);
    for (std::size_t m = 0; m + 1 < models_; ++m) {
      if (hs[m].count() == 0 && m >= cfg.models.size()) continue;
      w.histogram(name, fmt::format("model=\"{}\"", model_label(m)), hs[m]);
    }
  };
  hist("weir_time_to_first_token_seconds",
       "Time from the request's arrival to the first SSE event with data sent to the client.", ttft_);
  hist("weir_upstream_seconds", "Time from the request written upstream to the upstream response's end.", upstream_);
  hist("weir_request_duration_seconds", "Time from the request's arrival to the end of its response.", duration_);
  w.header("weir_gateway_added_seconds", "histogram",
           "Time spent inside Weir per request, excluding waits on the upstream and the client "
           "(request parse to upstream write, first upstream bytes to their client write).");
  w.histogram("weir_gateway_added_seconds", "", added_);

  w.header("weir_prompt_tokens_total", "counter", "Prompt tokens reported by upstream usage.");
  for (std::size_t m = 0; m + 1 < models_; ++m)
    if (prompt_tokens_[m] || m < cfg.models.size())
      w.sample("weir_prompt_tokens_total", fmt::format("model=\"{}\"", model_label(m)), prompt_tokens_[m]);
  w.header("weir_completion_tokens_total", "counter", "Completion tokens reported by upstream usage.");
  for (std::size_t m = 0; m + 1 < models_; ++m)
    if (completion_tokens_[m] || m < cfg.models.size())
      w.sample("weir_completion_tokens_total", fmt::format("model=\"{}\"", model_label(m)), completion_tokens_[m]);

  w.header("weir_active_streams", "gauge", "SSE responses being relayed now.");
  w.sample("weir_active_streams", "", static_cast<double>(active_streams));
  w.header("weir_active_connections", "gauge", "Open downstream connections.");
  w.sample("weir_active_connections", "", static_cast<double>(active_connections));
  w.header("weir_upstream_connects_total", "counter", "New TCP connections opened to upstream endpoints.");
  w.sample("weir_upstream_connects_total", "", upstream_connects);
  w.header("weir_upstream_retries_total", "counter",
           "Upstream attempts repeated before any byte reached the client, by why the previous one failed.");
  for (auto r : {routing::RetryReason::connect, routing::RetryReason::stale, routing::RetryReason::reset,
                 routing::RetryReason::timeout, routing::RetryReason::status})
    w.sample("weir_upstream_retries_total", fmt::format("reason=\"{}\"", routing::retry_reason_label(r)), retries(r));
  w.header("weir_routing_picks_total", "counter",
           "Endpoint picks (a request's first on a pool) by the rule that made them: p2c, least_load, "
           "prefix_match / prefix_miss / prefix_guard (balance: prefix_affinity), session (session_header).");
  for (auto r : {routing::PickRule::p2c, routing::PickRule::least_load, routing::PickRule::prefix_match,
                 routing::PickRule::prefix_miss, routing::PickRule::prefix_guard, routing::PickRule::session})
    w.sample("weir_routing_picks_total", fmt::format("rule=\"{}\"", routing::pick_rule_label(r)), picks(r));
  w.header("weir_upstream_fallbacks_total", "counter",
           "Requests sent on to the next target of their model's fallback chain.");
  w.sample("weir_upstream_fallbacks_total", "", upstream_fallbacks);
  w.header("weir_upstream_retry_budget_exhausted_total", "counter",
           "Retries not made because the pool's retry budget (retry.budget) was spent.");
  w.sample("weir_upstream_retry_budget_exhausted_total", "", retry_budget_exhausted);
  w.header("weir_upstream_outlier_ejections_total", "counter",
           "Endpoints ejected for failing answers in a row (pools.X.outlier), per worker.");
  w.sample("weir_upstream_outlier_ejections_total", "", outlier_ejections);
  w.header("weir_upstream_health_transitions_total", "counter",
           "Endpoints the active health probes (pools.X.health) marked unhealthy or healthy again, per worker.");
  w.sample("weir_upstream_health_transitions_total", "", health_transitions);
  w.header("weir_upstream_failures_total", "counter", "Upstream failures by kind.");
  for (auto f : {http::UpstreamFailure::connect_refused, http::UpstreamFailure::connect_timeout,
                 http::UpstreamFailure::timeout, http::UpstreamFailure::reset, http::UpstreamFailure::protocol})
    w.sample("weir_upstream_failures_total", fmt::format("kind=\"{}\"", http::to_string(f)), upstream_failures(f));
  w.header("weir_client_disconnects_total", "counter", "Clients that left before their response ended.");
  w.sample("weir_client_disconnects_total", "", client_disconnects);
  w.header("weir_slow_client_cutoffs_total", "counter",
           "Streams cut off because the client stopped reading (backlog bound or write timeout).");
  w.sample("weir_slow_client_cutoffs_total", "", slow_client_cutoffs);
  w.header("weir_request_bytes_total", "counter", "Request body bytes received.");
  w.sample("weir_request_bytes_total", "", bytes_in);
  w.header("weir_response_bytes_total", "counter", "Response bytes written to clients.");
  w.sample("weir_response_bytes_total", "", bytes_out);
  w.header("weir_sse_events_total", "counter", "SSE events relayed to clients.");
  w.sample("weir_sse_events_total", "", sse_events);
  w.header("weir_access_log_write_errors_total", "counter", "Access log writes that failed.");
  w.sample("weir_access_log_write_errors_total", "", log_errors);
}

}  // namespace weir::gateway
