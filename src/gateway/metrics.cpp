#include "gateway/metrics.hpp"

#include <algorithm>

#include <map>

#include <fmt/format.h>
#include <boost/json/array.hpp>

#include "core/buffer_budget.hpp"

namespace weir::gateway {

namespace json = boost::json;

namespace {
constexpr std::size_t kListed = 20;  // non-zero entries of kStatuses
}  // namespace

MetricsShard::MetricsShard(std::shared_ptr<const MetricLabels> labels)
    : labels_(std::move(labels)), added_(core::added_latency_buckets_us()) {
  ttft_.bounds = core::ttft_buckets_us();
  itl_.bounds = core::itl_buckets_us();
  upstream_.bounds = core::latency_buckets_us();
  duration_.bounds = core::latency_buckets_us();
  for (PerModel* h : {&ttft_, &itl_, &upstream_, &duration_})
    for (auto& f : h->fixed) f = core::Histogram(h->bounds);
  auto l = std::move(labels_);
  relabel(std::move(l));
}

namespace {
// By slot of `to`'s family: 1 where `from` gave the slot to another name (or freed it) than `to` has there.
std::vector<std::uint8_t> renamed(const std::vector<std::uint64_t>& from, const std::vector<std::uint64_t>& to) {
  std::vector<std::uint8_t> r(to.size(), 0);
  for (std::size_t s = 0; s < to.size() && s < from.size(); ++s) r[s] = from[s] != to[s];
  return r;
}
bool any(const std::vector<std::uint8_t>& v) { return std::find(v.begin(), v.end(), 1) != v.end(); }
std::size_t model_of_key(std::uint64_t key) { return static_cast<std::size_t>((key >> 32) & 0x1ffff); }
}  // namespace

void MetricsShard::clear_renamed(const MetricLabels& from, const MetricLabels& to) {
  if (const auto models = renamed(from.model_epoch, to.model_epoch); any(models)) {
    for (std::size_t s = 0; s < models.size(); ++s)
      if (models[s])
        for (PerModel* h : {&ttft_, &itl_, &upstream_, &duration_})
          if (s < h->models.size()) h->models[s] = core::Histogram(h->bounds);
    counters_.erase_if([&](std::uint64_t key) {
      const auto m = model_of_key(key);
      return m < models.size() && models[m];
    });
  }
  const auto pools = renamed(from.pool_epoch, to.pool_epoch);
  for (std::size_t s = 0; s < pools.size() && s < per_pool_.size(); ++s)
    if (pools[s]) {
      per_pool_[s] = {};
      std::fill_n(shed_.begin() + static_cast<std::ptrdiff_t>(s * kShedReasons), kShedReasons, 0);
    }
  const auto endpoints = renamed(from.endpoint_epoch, to.endpoint_epoch);
  for (std::size_t s = 0; s < endpoints.size() && s < attempts_.size(); ++s)
    if (endpoints[s]) {
      attempts_[s] = recoveries_[s] = 0;
      std::fill_n(upstream_failures_.begin() + static_cast<std::ptrdiff_t>(s * kFailureKinds), kFailureKinds, 0);
      std::fill_n(ejections_.begin() + static_cast<std::ptrdiff_t>(s * kOpenCauses), kOpenCauses, 0);
    }
}

void MetricsShard::relabel(std::shared_ptr<const MetricLabels> labels) {
  if (labels_ && labels->serial < labels_->serial) return;  // older than ours
  if (labels_ && labels_ != labels) clear_renamed(*labels_, *labels);
  labels_ = std::move(labels);
  for (PerModel* h : {&ttft_, &itl_, &upstream_, &duration_}) grow(*h, labels_->models.size());
  attempts_.resize(std::max(attempts_.size(), labels_->endpoints.size()), 0);
  upstream_failures_.resize(attempts_.size() * kFailureKinds, 0);
  ejections_.resize(attempts_.size() * kOpenCauses, 0);
  recoveries_.resize(attempts_.size(), 0);
  per_pool_.resize(std::max(per_pool_.size(), labels_->pools.size()));
  shed_.resize(per_pool_.size() * kShedReasons, 0);
  if (labels_->tenants.empty() && labels_->key_ids.empty()) {
    // Without identity labels, configured models have their token counters from the start.
    for (std::uint32_t m = 0; m < labels_->models.size(); ++m)
      if (labels_->model_current[m]) {
        add_tokens(m, 0, 0);
        add_estimated_tokens(m, 0, 0);
      }
  }
}

std::uint32_t MetricsShard::status_slot(int status) {
  for (std::size_t i = 0; i < kListed; ++i)
    if (kStatuses[i] == status) return static_cast<std::uint32_t>(i);
  int cls = status / 100;
  if (cls < 1 || cls > 5) cls = 5;
  return static_cast<std::uint32_t>(kListed + static_cast<std::size_t>(cls));  // 21..25
}

std::uint64_t MetricsShard::upstream_failures(http::UpstreamFailure f) const {
  std::uint64_t n = 0;
  for (std::size_t e = 0; e < attempts_.size(); ++e) n += upstream_failures_[e * kFailureKinds + kind_of(f)];
  return n;
}

void MetricsShard::merge(PerModel& into, const PerModel& from, const std::vector<std::uint8_t>& skip) {
  for (std::size_t i = 0; i < into.models.size() && i < from.models.size(); ++i)
    if (i >= skip.size() || !skip[i]) into.models[i].merge(from.models[i]);
  for (std::size_t i = 0; i < into.fixed.size(); ++i) into.fixed[i].merge(from.fixed[i]);
}

void MetricsShard::merge(const MetricsShard& o) {
  // A worker already on a later generation.
  if (o.labels_->serial > labels_->serial) relabel(o.labels_);
  // One on an earlier one may hold counts of a slot these labels gave to another name (or freed): left out.
  std::vector<std::uint8_t> models, pools, endpoints;
  if (o.labels_ != labels_) {
    models = renamed(o.labels_->model_epoch, labels_->model_epoch);
    pools = renamed(o.labels_->pool_epoch, labels_->pool_epoch);
    endpoints = renamed(o.labels_->endpoint_epoch, labels_->endpoint_epoch);
  }
  if (any(models))
    counters_.merge_if(o.counters_, [&](std::uint64_t key) {
      const auto m = model_of_key(key);
      return m >= models.size() || !models[m];
    });
  else
    counters_.merge(o.counters_);
  merge(ttft_, o.ttft_, models);
  merge(itl_, o.itl_, models);
  merge(upstream_, o.upstream_, models);
  merge(duration_, o.duration_, models);
  added_.merge(o.added_);
  active_streams += o.active_streams;
  active_connections += o.active_connections;
  upstream_connects += o.upstream_connects;
  for (std::size_t i = 0; i < retries_.size(); ++i) retries_[i] += o.retries_[i];
  for (std::size_t i = 0; i < picks_.size(); ++i) picks_[i] += o.picks_[i];
  upstream_fallbacks += o.upstream_fallbacks;
  upstream_resumes += o.upstream_resumes;
  retry_budget_exhausted += o.retry_budget_exhausted;
  outlier_ejections += o.outlier_ejections;
  health_transitions += o.health_transitions;
  first_token_timeouts += o.first_token_timeouts;
  deadline_exceeded += o.deadline_exceeded;
  const auto kept = [](const std::vector<std::uint8_t>& skip, std::size_t slot) {
    return slot >= skip.size() || !skip[slot];
  };
  for (std::size_t i = 0; i < ejections_.size() && i < o.ejections_.size(); ++i)
    if (kept(endpoints, i / kOpenCauses)) ejections_[i] += o.ejections_[i];
  for (std::size_t i = 0; i < recoveries_.size() && i < o.recoveries_.size(); ++i)
    if (kept(endpoints, i)) recoveries_[i] += o.recoveries_[i];
  for (std::size_t i = 0; i < shed_.size() && i < o.shed_.size(); ++i)
    if (kept(pools, i / kShedReasons)) shed_[i] += o.shed_[i];
  for (std::size_t i = 0; i < per_pool_.size() && i < o.per_pool_.size(); ++i) {
    if (!kept(pools, i)) continue;
    per_pool_[i].queued += o.per_pool_[i].queued;
    per_pool_[i].unavailable += o.per_pool_[i].unavailable;
    per_pool_[i].waiting += o.per_pool_[i].waiting;
  }
  batch.batches += o.batch.batches;
  batch.members += o.batch.members;
  batch.aborted += o.batch.aborted;
  batch.coalesced += o.batch.coalesced;
  batch.split += o.batch.split;
  for (std::size_t i = 0; i < attempts_.size() && i < o.attempts_.size(); ++i)
    if (kept(endpoints, i)) attempts_[i] += o.attempts_[i];
  for (std::size_t i = 0; i < upstream_failures_.size() && i < o.upstream_failures_.size(); ++i)
    if (kept(endpoints, i / kFailureKinds)) upstream_failures_[i] += o.upstream_failures_[i];
  client_disconnects += o.client_disconnects;
  slow_client_cutoffs += o.slow_client_cutoffs;
  bytes_in += o.bytes_in;
  bytes_out += o.bytes_out;
  sse_events += o.sse_events;
}

void MetricsShard::render(std::string& out, std::uint64_t log_errors, std::uint64_t log_lines_lost,
                          std::uint64_t log_reopen_failures, bool log_reopen_pending) const {
  core::PromWriter w(out);
  const MetricLabels& L = *labels_;
  auto model_label = [&](std::size_t i) -> std::string_view {
    if (i < L.models.size()) return L.models[i];
    return i == kUnlistedModel ? "*" : "";
  };
  auto status_label = [](std::size_t slot) -> std::string {
    if (slot < kListed) return std::to_string(kStatuses[slot]);
    return fmt::format("{}xx", slot - kListed);
  };
  // ",tenant=\"T\",key_id=\"K\"" for the identity slots of a series key (empty for kNone).
  auto identity_labels = [&](std::uint64_t key) {
    std::string s;
    const auto tenant = static_cast<std::uint16_t>(key >> 16), k = static_cast<std::uint16_t>(key);
    if (tenant != MetricIdentity::kNone && !L.tenants.empty())
      if (const auto i = MetricLabels::index_of(tenant, L.tenants); i < L.tenants.size())
        fmt::format_to(std::back_inserter(s), ",tenant=\"{}\"", L.tenants[i]);
    if (k != MetricIdentity::kNone && !L.key_ids.empty())
      if (const auto i = MetricLabels::index_of(k, L.key_ids); i < L.key_ids.size())
        fmt::format_to(std::back_inserter(s), ",key_id=\"{}\"", L.key_ids[i]);
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
  // A series of a model, tenant or key the configuration no longer names is left out (MetricLabels::current).
  auto current = [&](std::uint64_t key) {
    return L.current(model_of(key), static_cast<std::uint16_t>(key >> 16), static_cast<std::uint16_t>(key));
  };

  w.header("weir_requests_total", "counter", "Requests answered, by route, model, HTTP status (and tenant, key).");
  for (const auto& [key, v] : family(Family::requests))
    if (current(key))
      w.sample(
          "weir_requests_total",
          fmt::format("route=\"{}\",model=\"{}\",status=\"{}\"{}", route_label(static_cast<RouteKind>(route_of(key))),
                      model_label(model_of(key)), status_label(status_of(key)), identity_labels(key)),
          v);

  auto hist = [&](const char* name, const char* help, const PerModel& hs) {
    w.header(name, "histogram", help);
    // Configured models even at 0; "*" and "" once used (not models no longer configured). "" holds
    // the requests without a model (answered before one was known: a refused credential, an
    // unknown path, a body that is not JSON; or a route without one, GET /version), under the
    // same label weir_requests_total counts them: every request it counts has a duration.
    for (std::size_t m = 0; m < hs.models.size() && m < L.models.size(); ++m) {
      if (!L.model_current[m]) continue;
      w.histogram(name, fmt::format("model=\"{}\"", L.models[m]), hs.models[m]);
    }
    if (hs.fixed[0].count() != 0) w.histogram(name, "model=\"*\"", hs.fixed[0]);
    if (hs.fixed[1].count() != 0) w.histogram(name, "model=\"\"", hs.fixed[1]);
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
      if (!current(key)) continue;
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
  per_model("weir_estimated_prompt_tokens_total", "counter",
            "Prompt tokens charged by estimate to requests whose upstream reported no usage (not in "
            "weir_prompt_tokens_total).",
            Family::estimated_prompt_tokens, 1.0);
  per_model("weir_estimated_completion_tokens_total", "counter",
            "Completion tokens charged by estimate to requests whose upstream reported no usage (not in "
            "weir_completion_tokens_total).",
            Family::estimated_completion_tokens, 1.0);
  per_model("weir_spend_usd_total", "counter",
            "Spend in USD at the configured prices (pricing:), from the usage upstreams reported.", Family::spend,
            1e-9);
  per_model("weir_upstream_invalid_utf8_total", "counter",
            "Upstream SSE events and answer bodies in which ill-formed UTF-8 was replaced by U+FFFD before the "
            "client got them (a broken upstream, or one that is not vLLM).",
            Family::invalid_utf8, 1.0);
  per_model("weir_upstream_invalid_usage_total", "counter",
            "Requests whose upstream reported a usage count that cannot be billed as sent (negative, fractional, "
            "not a number, or over 16777216 tokens): charged as a request without usage is.",
            Family::invalid_usage, 1.0);
  {
    // Sum and count only (a summary without quantiles): mean TTFT per tenant
    // is rate(_sum) / rate(_count); the per-model histogram has the buckets.
    const char* name = "weir_tenant_time_to_first_token_seconds";
    w.header(name, "summary",
             "Time to first token by model and tenant (and key): sum and count only; the buckets are in "
             "weir_time_to_first_token_seconds by model.");
    const auto sums = family(Family::ttft_sum_us);
    const auto counts = family(Family::ttft_count);
    // Both families hold the same series (added together), in the same order.
    for (std::size_t i = 0; i < sums.size() && i < counts.size(); ++i) {
      if (!current(sums[i].first)) continue;
      const auto labels =
          fmt::format("model=\"{}\"{}", model_label(model_of(sums[i].first)), identity_labels(sums[i].first));
      w.sample(fmt::format("{}_sum", name), labels, static_cast<double>(sums[i].second) / 1e6);
      w.sample(fmt::format("{}_count", name), labels, counts[i].second);
    }
  }
  w.header("weir_rate_limited_total", "counter",
           "Requests Weir's admission refused with 429, by reason (rate_limit_exceeded: a requests or tokens "
           "bucket or a stream cap; insufficient_quota: a budget).");
  for (const auto& [key, v] : family(Family::rate_limited))
    if (current(key))
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
  w.header(
      "weir_upstream_connects_total", "counter",
      "Connections opened to upstream endpoints (TCP connect and, for https, the TLS handshake succeeded; a failed "
      "connect counts in weir_upstream_failures_total).");
  w.sample("weir_upstream_connects_total", "", upstream_connects);
  // Pools and endpoints as configured (the endpoint as its URL is shown in
  // the access log: secrets in a query redacted); not one no longer configured.
  auto endpoint_shown = [&](std::size_t slot) {
    return slot < L.endpoints.size() && slot < attempts_.size() && L.endpoint_current[slot];
  };
  w.header("weir_upstream_attempts_total", "counter",
           "Requests sent (or connections tried) to each upstream endpoint, retries and fallbacks included.");
  for (std::size_t slot = 0; slot < L.endpoints.size(); ++slot)
    if (endpoint_shown(slot)) w.sample("weir_upstream_attempts_total", L.endpoints[slot], attempts_[slot]);
  w.header("weir_upstream_retries_total", "counter",
           "Upstream attempts repeated before any byte reached the client, by why the previous one failed.");
  for (auto r : {routing::RetryReason::connect, routing::RetryReason::stale, routing::RetryReason::reset,
                 routing::RetryReason::timeout, routing::RetryReason::status, routing::RetryReason::protocol})
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
  w.header("weir_upstream_resumes_total", "counter",
           "Streams that broke after content reached the client and were continued on another endpoint "
           "(pools.X.resume).");
  w.sample("weir_upstream_resumes_total", "", upstream_resumes);
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
  constexpr std::array kCauses = {routing::OpenCause::connect, routing::OpenCause::failures, routing::OpenCause::ttft,
                                  routing::OpenCause::probe, routing::OpenCause::trial};
  auto health_shown = endpoint_shown;  // (as configured)
  for (std::size_t slot = 0; slot < L.endpoints.size(); ++slot)
    if (health_shown(slot))
      for (auto c : kCauses)
        w.sample("weir_upstream_ejections_total",
                 fmt::format("{},cause=\"{}\"", L.endpoints[slot], routing::open_cause_label(c)),
                 ejections_at(slot, c));
  w.header("weir_upstream_recoveries_total", "counter",
           "Times an ejected endpoint was found healthy again on a worker (a half-open trial answered, a health "
           "probe succeeded, or its first good answer after an ejection without a breaker).");
  for (std::size_t slot = 0; slot < L.endpoints.size(); ++slot)
    if (health_shown(slot)) w.sample("weir_upstream_recoveries_total", L.endpoints[slot], recoveries_at(slot));
  // Pools as configured.
  const std::size_t pools = std::min(L.pools.size(), per_pool_.size());
  w.header("weir_upstream_pool_unavailable_total", "counter",
           "Requests that found every endpoint of the pool ejected with a breaker (pools.X.breaker): sent to a "
           "fallback or answered 503.");
  for (std::size_t p = 0; p < pools; ++p)
    if (L.pool_current[p]) w.sample("weir_upstream_pool_unavailable_total", L.pools[p], per_pool_[p].unavailable);
  w.header("weir_upstream_first_token_timeouts_total", "counter",
           "Streams whose first token did not come within the pool's timeouts.first_token.");
  w.sample("weir_upstream_first_token_timeouts_total", "", first_token_timeouts);
  w.header("weir_deadline_exceeded_total", "counter",
           "Requests whose own deadline (x-weir-timeout-ms) passed before their response ended.");
  w.sample("weir_deadline_exceeded_total", "", deadline_exceeded);
  // The pools configured with a queue, and those configured that had one while they have a count (the
  // pool remains: its series stay, never reset).
  auto queued_pools = [&](auto&& each) {
    for (std::size_t p = 0; p < pools; ++p) {
      if (!L.pool_current[p]) continue;
      bool counted = per_pool_[p].queued != 0 || per_pool_[p].waiting != 0;
      for (std::size_t r = 0; r < kShedReasons; ++r) counted = counted || shed_[p * kShedReasons + r] != 0;
      if (L.pool_queued[p] || counted) each(p, L.pools[p]);
    }
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
  for (std::size_t slot = 0; slot < L.endpoints.size(); ++slot) {
    if (!endpoint_shown(slot)) continue;
    for (auto f : {http::UpstreamFailure::connect_refused, http::UpstreamFailure::connect_timeout,
                   http::UpstreamFailure::timeout, http::UpstreamFailure::reset, http::UpstreamFailure::protocol,
                   http::UpstreamFailure::tls, http::UpstreamFailure::status, http::UpstreamFailure::local_resources})
      w.sample("weir_upstream_failures_total", fmt::format("{},kind=\"{}\"", L.endpoints[slot], http::to_string(f)),
               upstream_failures_[slot * kFailureKinds + kind_of(f)]);
  }
  w.header("weir_client_disconnects_total", "counter", "Clients that left before their response ended.");
  w.sample("weir_client_disconnects_total", "", client_disconnects);
  w.header("weir_slow_client_cutoffs_total", "counter",
           "Streams cut off because the client stopped reading (backlog bound or write timeout).");
  w.sample("weir_slow_client_cutoffs_total", "", slow_client_cutoffs);
  // (The process's, not a worker's: one budget for all, core/buffer_budget.hpp.)
  w.header("weir_buffered_bytes", "gauge",
           "Bytes of request bodies and whole upstream answers Weir holds now, against server.max_buffered.");
  w.sample("weir_buffered_bytes", "", static_cast<double>(core::process_buffers.used()));
  w.header("weir_buffer_refusals_total", "counter",
           "Requests answered 503 gateway_overloaded because their body (request_body) or their upstream's "
           "whole answer (response) would have taken the buffered bytes over server.max_buffered.");
  w.sample("weir_buffer_refusals_total", "reason=\"request_body\"",
           core::process_buffers.refused(core::BufferBudget::Use::request_body));
  w.sample("weir_buffer_refusals_total", "reason=\"response\"",
           core::process_buffers.refused(core::BufferBudget::Use::response));
  w.header("weir_request_bytes_total", "counter",
           "Request bytes received (head and body), as the access log's bytes_in.");
  w.sample("weir_request_bytes_total", "", bytes_in);
  w.header("weir_response_bytes_total", "counter", "Response bytes written to clients.");
  w.sample("weir_response_bytes_total", "", bytes_out);
  w.header("weir_sse_events_total", "counter", "SSE events relayed to clients.");
  w.sample("weir_sse_events_total", "", sse_events);
  w.header("weir_access_log_write_errors_total", "counter", "Access log writes that failed.");
  w.sample("weir_access_log_write_errors_total", "", log_errors);
  w.header("weir_access_log_lines_lost_total", "counter",
           "Access log lines a failed write dropped (a full pipe whose reader stopped reading included).");
  w.sample("weir_access_log_lines_lost_total", "", log_lines_lost);
  w.header("weir_access_log_reopen_failures_total", "counter",
           "Access log reopens (SIGHUP, SIGUSR1) whose file could not be opened.");
  w.sample("weir_access_log_reopen_failures_total", "", log_reopen_failures);
  w.header("weir_access_log_reopen_pending", "gauge",
           "1 while a failed reopen leaves the access log writing to the old file (retried every second).");
  w.sample("weir_access_log_reopen_pending", "", static_cast<std::uint64_t>(log_reopen_pending));
}

json::object MetricsShard::stats_json() const {
  struct Traffic {
    std::map<std::string, std::uint64_t> status;  // "200", "429", "5xx" (statuses without a slot of their own)
    std::uint64_t requests = 0, errors_4xx = 0, errors_5xx = 0;
    std::uint64_t prompt_tokens = 0, completion_tokens = 0, spend_nano_usd = 0, rate_limited = 0;
    std::uint64_t ttft_sum_us = 0, ttft_count = 0;
  };
  const MetricLabels& L = *labels_;
  // By model slot, then "*" and "" (no model); by tenant slot, "other" last.
  const std::size_t named = L.models.size();
  std::vector<Traffic> models(named + 2), tenants(L.tenants.size());
  auto model_index = [&](std::size_t slot) {
    return slot < named ? slot : slot >= kUnlistedModel ? named + (slot - kUnlistedModel) : models.size();
  };
  for (const auto& [key, v] : counters_.sorted()) {
    const auto f = static_cast<Family>(key >> 60);
    const auto model = model_index(static_cast<std::size_t>((key >> 32) & 0x1ffff));
    const auto tenant_slot = static_cast<std::uint16_t>((key >> 16) & 0xffff);
    const auto tenant = tenant_slot == MetricIdentity::kNone || tenants.empty()
                            ? tenants.size()
                            : MetricLabels::index_of(tenant_slot, L.tenants);
    const auto slot = static_cast<std::size_t>((key >> 49) & 0x1f);
    Traffic* byt = tenant < tenants.size() ? &tenants[tenant] : nullptr;
    for (Traffic* t : {model < models.size() ? &models[model] : nullptr, byt}) {
      if (!t || (f == Family::rate_limited && t != byt)) continue;  // rate_limited has no model
      switch (f) {
        case Family::requests: {
          const auto route = static_cast<RouteKind>((key >> 54) & 0x3f);
          if (route == RouteKind::health || route == RouteKind::ready || route == RouteKind::metrics) break;
          const int code = slot < kListed ? kStatuses[slot] : static_cast<int>(slot - kListed) * 100;
          t->status[slot < kListed ? std::to_string(code) : fmt::format("{}xx", code / 100)] += v;
          t->requests += v;
          if (code >= 400 && code < 500) t->errors_4xx += v;
          if (code >= 500) t->errors_5xx += v;
          break;
        }
        case Family::prompt_tokens:
          t->prompt_tokens += v;
          break;
        case Family::completion_tokens:
          t->completion_tokens += v;
          break;
        case Family::spend:
          t->spend_nano_usd += v;
          break;
        case Family::rate_limited:
          t->rate_limited += v;
          break;
        case Family::ttft_sum_us:
          t->ttft_sum_us += v;
          break;
        case Family::ttft_count:
          t->ttft_count += v;
          break;
        case Family::estimated_prompt_tokens:
        case Family::estimated_completion_tokens:
        case Family::invalid_utf8:
        case Family::invalid_usage:
          break;  // (the stats' token counts are the reported ones, as weir_*_tokens_total)
      }
    }
  }
  auto traffic_json = [](const Traffic& t, json::object& o) {
    o["requests"] = t.requests;
    json::object st;
    for (const auto& [k, n] : t.status) st[k] = n;
    o["status"] = std::move(st);
    o["errors_4xx"] = t.errors_4xx;
    o["errors_5xx"] = t.errors_5xx;
    o["prompt_tokens"] = t.prompt_tokens;
    o["completion_tokens"] = t.completion_tokens;
    o["spend_usd"] = static_cast<double>(t.spend_nano_usd) / 1e9;
  };
  json::object out;
  out["object"] = "stats";
  json::array le;
  for (const auto b : core::ttft_buckets_us()) le.emplace_back(static_cast<double>(b) / 1e6);
  out["ttft_buckets_s"] = std::move(le);
  json::array ms;
  for (std::size_t m = 0; m < models.size(); ++m) {
    const Traffic& t = models[m];
    const core::Histogram& h = m < named ? ttft_.models[m] : ttft_.fixed[m - named];  // "*", then "" (no model)
    if (m < named && L.model_vacant[m]) continue;  // (counts an earlier worker's shard held for its former name)
    const bool configured = m < named && L.model_current[m];
    if (t.requests == 0 && h.count() == 0 && !configured) continue;
    json::object o;
    if (m < named)
      o["model"] = L.model_names[m];
    else if (m == named)
      o["model"] = "*";  // a model the configuration does not list, sent to the default pool
    else
      o["model"] = nullptr;  // requests without one (refused before, or routes without a model)
    traffic_json(t, o);
    json::object ttft;
    ttft["count"] = h.count();
    ttft["sum_s"] = static_cast<double>(h.sum_us()) / 1e6;
    json::array cum;  // cumulative, one per bound, then +Inf (= count)
    std::uint64_t run = 0;
    for (const auto c : h.counts()) cum.emplace_back(run += c);
    ttft["buckets"] = std::move(cum);
    o["ttft"] = std::move(ttft);
    ms.emplace_back(std::move(o));
  }
  out["models"] = std::move(ms);
  json::array ts;
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    const Traffic& t = tenants[i];
    json::object o;
    const bool overflow = i + 1 == tenants.size();  // the "other" bucket past server.metrics.max_tenants
    if (!overflow && i < L.tenant_names.size())
      o["tenant"] = L.tenant_names[i];
    else if (overflow)
      o["tenant"] = nullptr;
    else
      continue;
    o["overflow"] = overflow;
    if (overflow && t.requests == 0) continue;
    traffic_json(t, o);
    o["rate_limited"] = t.rate_limited;
    json::object ttft;
    ttft["count"] = t.ttft_count;
    ttft["sum_s"] = static_cast<double>(t.ttft_sum_us) / 1e6;
    o["ttft"] = std::move(ttft);
    ts.emplace_back(std::move(o));
  }
  out["tenants"] = std::move(ts);
  out["active_streams"] = active_streams;
  out["active_connections"] = active_connections;
  return out;
}

}  // namespace weir::gateway
