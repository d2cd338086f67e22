#include "gateway/metrics.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace weir::gateway {

namespace {
constexpr std::size_t kListed = 18;  // non-zero entries of kStatuses
constexpr std::string_view kOther = "other";
}  // namespace

std::shared_ptr<const MetricLabels> MetricLabels::build(const core::Config& cfg, const auth::AuthPolicy* policy) {
  auto l = std::make_shared<MetricLabels>();
  l->models = cfg.models.size();
  l->endpoint_base.reserve(cfg.pools.size() + 1);
  std::uint32_t n = 0;
  for (const auto& p : cfg.pools) {
    l->endpoint_base.push_back(n);
    n += static_cast<std::uint32_t>(p.endpoints.size());
  }
  l->endpoint_base.push_back(n);
  if (!policy) return l;
  const auto& mc = cfg.server.metrics;
  const auto& tenants = policy->tenants();  // name order; tenant i has admission scope i
  l->tenant_scopes = static_cast<std::uint32_t>(tenants.size());
  if (mc.tenant_label) {
    for (std::size_t i = 0; i < tenants.size() && i < mc.max_tenants; ++i)
      l->tenants.push_back(core::escape_label(tenants[i].name));
    l->tenants.emplace_back(kOther);
  }
  if (mc.key_id_label) {
    // Key scopes follow the tenants', in configuration order ("key:ID").
    const auto& scopes = policy->scopes();
    for (std::size_t s = tenants.size(); s < scopes.size() && s - tenants.size() < mc.max_key_ids; ++s)
      l->key_ids.push_back(core::escape_label(std::string_view(scopes[s].name).substr(4)));
    l->key_ids.emplace_back(kOther);
  }
  return l;
}

MetricsShard::MetricsShard(std::shared_ptr<const MetricLabels> labels)
    : labels_(std::move(labels)),
      models_(labels_->models + 2),
      ttft_(models_, core::Histogram(core::ttft_buckets_us())),
      itl_(models_, core::Histogram(core::itl_buckets_us())),
      upstream_(models_, core::Histogram(core::latency_buckets_us())),
      duration_(models_, core::Histogram(core::latency_buckets_us())),
      attempts_(labels_->endpoint_base.back(), 0),
      upstream_failures_(attempts_.size() * kFailureKinds, 0),
      ejections_(attempts_.size() * kOpenCauses, 0),
      recoveries_(attempts_.size(), 0),
      shed_((labels_->endpoint_base.size() - 1) * kShedReasons, 0),
      per_pool_(labels_->endpoint_base.size() - 1),
      added_(core::added_latency_buckets_us()) {
  if (labels_->tenants.empty() && labels_->key_ids.empty()) {
    // Without identity labels, configured models have their token counters from the start.
    for (std::uint32_t m = 0; m < labels_->models; ++m) add_tokens(m, 0, 0);
  }
}

std::uint32_t MetricsShard::status_slot(int status) {
  for (std::size_t i = 0; i < kListed; ++i)
    if (kStatuses[i] == status) return static_cast<std::uint32_t>(i);
  int cls = status / 100;
  if (cls < 1 || cls > 5) cls = 5;
  return static_cast<std::uint32_t>(kListed + static_cast<std::size_t>(cls));  // 19..23
}

std::uint64_t MetricsShard::upstream_failures(http::UpstreamFailure f) const {
  std::uint64_t n = 0;
  for (std::size_t e = 0; e < attempts_.size(); ++e) n += upstream_failures_[e * kFailureKinds + kind_of(f)];
  return n;
}

void MetricsShard::set_endpoint_health(
    std::uint32_t pool, std::uint32_t endpoint,
    const std::array<std::uint64_t, static_cast<std::size_t>(routing::OpenCause::count_)>& opened,
    std::uint64_t recovered) {
  const auto e = endpoint_slot(pool, endpoint);
  if (e >= recoveries_.size()) return;
  for (std::size_t c = 0; c < kOpenCauses; ++c) ejections_[e * kOpenCauses + c] = opened[c];
  recoveries_[e] = recovered;
}

void MetricsShard::merge(const MetricsShard& o) {
  counters_.merge(o.counters_);
  for (std::size_t i = 0; i < models_ && i < o.models_; ++i) {
    ttft_[i].merge(o.ttft_[i]);
    itl_[i].merge(o.itl_[i]);
    upstream_[i].merge(o.upstream_[i]);
    duration_[i].merge(o.duration_[i]);
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
  first_token_timeouts += o.first_token_timeouts;
  deadline_exceeded += o.deadline_exceeded;
  for (std::size_t i = 0; i < ejections_.size() && i < o.ejections_.size(); ++i) ejections_[i] += o.ejections_[i];
  for (std::size_t i = 0; i < recoveries_.size() && i < o.recoveries_.size(); ++i) recoveries_[i] += o.recoveries_[i];
  for (std::size_t i = 0; i < shed_.size() && i < o.shed_.size(); ++i) shed_[i] += o.shed_[i];
  for (std::size_t i = 0; i < per_pool_.size() && i < o.per_pool_.size(); ++i) {
    per_pool_[i].queued += o.per_pool_[i].queued;
    per_pool_[i].unavailable += o.per_pool_[i].unavailable;
    per_pool_[i].waiting += o.per_pool_[i].waiting;
  }
  batch.batches += o.batch.batches;
  batch.members += o.batch.members;
  batch.aborted += o.batch.aborted;
  batch.coalesced += o.batch.coalesced;
  batch.split += o.batch.split;
  for (std::size_t i = 0; i < attempts_.size() && i < o.attempts_.size(); ++i) attempts_[i] += o.attempts_[i];
  for (std::size_t i = 0; i < upstream_failures_.size() && i < o.upstream_failures_.size(); ++i)
    upstream_failures_[i] += o.upstream_failures_[i];
  client_disconnects += o.client_disconnects;
  slow_client_cutoffs += o.slow_client_cutoffs;
  bytes_in += o.bytes_in;
  bytes_out += o.bytes_out;
  sse_events += o.sse_events;
}

void MetricsShard::render(std::string& out, const core::Config& cfg, std::uint64_t log_errors) const {
  core::PromWriter w(out);
  const MetricLabels& L = *labels_;
  auto model_label = [&](std::size_t i) -> std::string {
    if (i < cfg.models.size()) return core::escape_label(cfg.models[i].name);
    return i == models_ - 2 ? "*" : "";
  };
  auto status_label = [](std::size_t slot) -> std::string {
    if (slot < kListed) return std::to_string(kStatuses[slot]);
    return fmt::format("{}xx", slot - kListed);
  };
  // ",tenant=\"T\",key_id=\"K\"" for the identity slots of a series key (empty for kNone).
  auto identity_labels = [&](std::uint64_t key) {
    std::string s;
    const auto tenant = static_cast<std::uint16_t>(key >> 16), k = static_cast<std::uint16_t>(key);
    if (tenant != MetricIdentity::kNone && tenant < L.tenants.size())
      fmt::format_to(std::back_inserter(s), ",tenant=\"{}\"", L.tenants[tenant]);
    if (k != MetricIdentity::kNone && k < L.key_ids.size())
      fmt::format_to(std::back_inserter(s), ",key_id=\"{}\"", L.key_ids[k]);
    return s;
  };
  const auto series_list = counters_.sorted();  // grouped by family: it is the top bits
  auto family = [&](Family f) {
    const std::uint64_t lo = std::uint64_t{static_cast<std::uint8_t>(f)} << 60;
    const std::uint64_t hi = lo + (std::uint64_t{1} << 60);
    const auto b = std::lower_bound(series_list.begin(), series_list.end(), std::make_pair(lo, std::uint64_t{0}));
    auto e = b;
    while (e != series_list.end() && e->first < hi) ++e;
    return std::span(b, e);
  };
  auto route_of = [](std::uint64_t key) { return static_cast<std::size_t>((key >> 54) & 0x3f); };
  auto status_of = [](std::uint64_t key) { return static_cast<std::size_t>((key >> 49) & 0x1f); };
  auto model_of = [](std::uint64_t key) { return static_cast<std::size_t>((key >> 32) & 0x1ffff); };

  w.header("weir_requests_total", "counter", "Requests answered, by route, model, HTTP status (and tenant, key).");
  for (const auto& [key, v] : family(Family::requests))
    w.sample(
        "weir_requests_total",
        fmt::format("route=\"{}\",model=\"{}\",status=\"{}\"{}", route_label(static_cast<RouteKind>(route_of(key))),
                    model_label(model_of(key)), status_label(status_of(key)), identity_labels(key)),
        v);

  auto hist = [&](const char* name, const char* help, const std::vector<core::Histogram>& hs) {
    w.header(name, "histogram", help);
    for (std::size_t m = 0; m + 1 < models_; ++m) {
      if (hs[m].count() == 0 && m >= cfg.models.size()) continue;
      w.histogram(name, fmt::format("model=\"{}\"", model_label(m)), hs[m]);
    }
  };
  hist("weir_time_to_first_token_seconds",
       "Time from the request's arrival to the first SSE event with data sent to the client.", ttft_);
  hist("weir_inter_token_latency_seconds",
       "Time between two SSE data events of one stream as Weir relayed them (one per event after the first).", itl_);
  hist("weir_upstream_seconds", "Time from the request written upstream to the upstream response's end.", upstream_);
  hist("weir_request_duration_seconds", "Time from the request's arrival to the end of its response.", duration_);
  w.header("weir_gateway_added_seconds", "histogram",
           "Time spent inside Weir per request, excluding waits on the upstream and the client "
           "(request parse to upstream write, first upstream bytes to their client write).");
  w.histogram("weir_gateway_added_seconds", "", added_);

  auto per_model = [&](const char* name, const char* type, const char* help, Family f, double scale) {
    w.header(name, type, help);
    for (const auto& [key, v] : family(f)) {
      const auto labels = fmt::format("model=\"{}\"{}", model_label(model_of(key)), identity_labels(key));
      if (scale == 1.0)
        w.sample(name, labels, v);
      else
        w.sample(name, labels, static_cast<double>(v) * scale);
    }
  };
  per_model("weir_prompt_tokens_total", "counter", "Prompt tokens reported by upstream usage.", Family::prompt_tokens,
            1.0);
  per_model("weir_completion_tokens_total", "counter", "Completion tokens reported by upstream usage.",
            Family::completion_tokens, 1.0);
  per_model("weir_spend_usd_total", "counter",
            "Spend in USD at the configured prices (pricing:), from the usage upstreams reported.", Family::spend,
            1e-9);
  w.header("weir_rate_limited_total", "counter",
           "Requests Weir's admission refused with 429, by reason (rate_limit_exceeded: a requests or tokens "
           "bucket or a stream cap; insufficient_quota: a budget).");
  for (const auto& [key, v] : family(Family::rate_limited))
    w.sample("weir_rate_limited_total",
             fmt::format("reason=\"{}\"{}",
                         status_of(key) == static_cast<std::size_t>(RateLimitReason::insufficient_quota)
                             ? "insufficient_quota"
                             : "rate_limit_exceeded",
                         identity_labels(key)),
             v);

  w.header("weir_active_streams", "gauge", "SSE responses being relayed now.");
  w.sample("weir_active_streams", "", static_cast<double>(active_streams));
  w.header("weir_active_connections", "gauge", "Open downstream connections.");
  w.sample("weir_active_connections", "", static_cast<double>(active_connections));
  w.header("weir_upstream_connects_total", "counter", "New TCP connections opened to upstream endpoints.");
  w.sample("weir_upstream_connects_total", "", upstream_connects);
  // Pools and endpoints as configured (the endpoint as its URL is shown in
  // the access log: secrets in a query redacted).
  auto endpoint_labels = [&](std::size_t p, std::size_t e) {
    return fmt::format("pool=\"{}\",endpoint=\"{}\"", core::escape_label(cfg.pools[p].name),
                       core::escape_label(cfg.pools[p].endpoints[e].display));
  };
  const std::size_t pools = std::min(cfg.pools.size(), L.endpoint_base.size() - 1);
  w.header("weir_upstream_attempts_total", "counter",
           "Requests sent (or connections tried) to each upstream endpoint, retries and fallbacks included.");
  for (std::size_t p = 0; p < pools; ++p)
    for (std::size_t e = 0; e < cfg.pools[p].endpoints.size() && L.endpoint_base[p] + e < L.endpoint_base[p + 1]; ++e)
      w.sample("weir_upstream_attempts_total", endpoint_labels(p, e), attempts_[L.endpoint_base[p] + e]);
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
  w.header("weir_upstream_ejections_total", "counter",
           "Times an endpoint was ejected (its circuit breaker opened) on a worker, by cause: connect, failures, "
           "ttft, probe, half_open_failure.");
  for (std::size_t p = 0; p < pools; ++p)
    for (std::size_t e = 0; e < cfg.pools[p].endpoints.size() && L.endpoint_base[p] + e < L.endpoint_base[p + 1]; ++e)
      for (auto c : {routing::OpenCause::connect, routing::OpenCause::failures, routing::OpenCause::ttft,
                     routing::OpenCause::probe, routing::OpenCause::trial})
        w.sample("weir_upstream_ejections_total",
                 fmt::format("{},cause=\"{}\"", endpoint_labels(p, e), routing::open_cause_label(c)),
                 ejections_[(L.endpoint_base[p] + e) * kOpenCauses + static_cast<std::size_t>(c)]);
  w.header("weir_upstream_recoveries_total", "counter",
           "Times an ejected endpoint was found healthy again on a worker (a half-open trial answered, or a health "
           "probe succeeded).");
  for (std::size_t p = 0; p < pools; ++p)
    for (std::size_t e = 0; e < cfg.pools[p].endpoints.size() && L.endpoint_base[p] + e < L.endpoint_base[p + 1]; ++e)
      w.sample("weir_upstream_recoveries_total", endpoint_labels(p, e), recoveries_[L.endpoint_base[p] + e]);
  w.header("weir_upstream_pool_unavailable_total", "counter",
           "Requests that found every endpoint of the pool ejected with a breaker (pools.X.breaker): sent to a "
           "fallback or answered 503.");
  for (std::size_t p = 0; p < pools && p < per_pool_.size(); ++p)
    w.sample("weir_upstream_pool_unavailable_total", fmt::format("pool=\"{}\"", core::escape_label(cfg.pools[p].name)),
             per_pool_[p].unavailable);
  w.header("weir_upstream_first_token_timeouts_total", "counter",
           "Streams whose first token did not come within the pool's timeouts.first_token.");
  w.sample("weir_upstream_first_token_timeouts_total", "", first_token_timeouts);
  w.header("weir_deadline_exceeded_total", "counter",
           "Requests whose own deadline (x-weir-timeout-ms) passed before their response ended.");
  w.sample("weir_deadline_exceeded_total", "", deadline_exceeded);
  auto queued_pools = [&](auto&& each) {
    for (std::size_t p = 0; p < pools && p < per_pool_.size(); ++p)
      if (cfg.pools[p].queue.enabled) each(p, fmt::format("pool=\"{}\"", core::escape_label(cfg.pools[p].name)));
  };
  w.header("weir_requests_shed_total", "counter",
           "Requests a pool's admission queue (pools.X.queue) refused, by reason: queue_full, saturated, "
           "queue_timeout.");
  queued_pools([&](std::size_t p, const std::string& pl) {
    for (auto r : {routing::ShedReason::queue_full, routing::ShedReason::saturated, routing::ShedReason::queue_timeout})
      w.sample("weir_requests_shed_total", fmt::format("{},reason=\"{}\"", pl, routing::shed_reason_label(r)),
               shed_[p * kShedReasons + static_cast<std::size_t>(r)]);
  });
  w.header("weir_queued_requests_total", "counter", "Requests that waited in a pool's admission queue.");
  queued_pools(
      [&](std::size_t p, const std::string& pl) { w.sample("weir_queued_requests_total", pl, per_pool_[p].queued); });
  w.header("weir_queue_waiting", "gauge", "Requests waiting in a pool's admission queue now (every worker).");
  queued_pools([&](std::size_t p, const std::string& pl) {
    w.sample("weir_queue_waiting", pl, static_cast<double>(per_pool_[p].waiting));
  });
  w.header("weir_batches_total", "counter", "Micro-batches sent upstream as one request (pools.X.batch).");
  w.sample("weir_batches_total", "", batch.batches);
  w.header("weir_batched_requests_total", "counter", "Requests sent upstream as members of a micro-batch.");
  w.sample("weir_batched_requests_total", "", batch.members);
  w.header("weir_batches_aborted_total", "counter",
           "Micro-batches whose upstream request was aborted because every member had left.");
  w.sample("weir_batches_aborted_total", "", batch.aborted);
  w.header("weir_batches_split_total", "counter",
           "Micro-batches the upstream refused whole (400/413/422) whose members were then sent one by one.");
  w.sample("weir_batches_split_total", "", batch.split);
  w.header("weir_coalesced_requests_total", "counter",
           "Requests served by a generation an identical request started (pools.X.coalesce).");
  w.sample("weir_coalesced_requests_total", "", batch.coalesced);
  w.header("weir_upstream_failures_total", "counter", "Upstream failures by pool, endpoint and kind.");
  for (std::size_t p = 0; p < pools; ++p)
    for (std::size_t e = 0; e < cfg.pools[p].endpoints.size() && L.endpoint_base[p] + e < L.endpoint_base[p + 1]; ++e) {
      const auto labels = endpoint_labels(p, e);
      const std::size_t slot = L.endpoint_base[p] + e;
      for (auto f : {http::UpstreamFailure::connect_refused, http::UpstreamFailure::connect_timeout,
                     http::UpstreamFailure::timeout, http::UpstreamFailure::reset, http::UpstreamFailure::protocol,
                     http::UpstreamFailure::tls})
        w.sample("weir_upstream_failures_total", fmt::format("{},kind=\"{}\"", labels, http::to_string(f)),
                 upstream_failures_[slot * kFailureKinds + kind_of(f)]);
    }
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
