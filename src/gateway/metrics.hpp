// The gateway's Prometheus metrics: one shard per worker, written only by
// that worker's thread (plain adds), merged on scrape.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "auth/policy.hpp"
#include "batching/batch.hpp"
#include "core/config.hpp"
#include "core/metrics.hpp"
#include "gateway/endpoints.hpp"
#include "http/upstream.hpp"
#include "routing/attempts.hpp"
#include "routing/health.hpp"
#include "routing/queue.hpp"

namespace weir::gateway {

// The identity label values of a request's series: slots into
// MetricLabels::tenants / key_ids, or kNone (the label is left out).
struct MetricIdentity {
  static constexpr std::uint16_t kNone = 0xffff;
  std::uint16_t tenant = kNone;
  std::uint16_t key = kNone;
};

// The label values /metrics uses beyond route, model and status, fixed at
// start-up from the configuration (server.metrics) and the auth policy, so
// every family's label sets are bounded by the configuration's size.
// Shared read-only by every shard.
struct MetricLabels {
  // Slots from `cfg` and `policy` (null: no auth, so no tenant or key_id label).
  static std::shared_ptr<const MetricLabels> build(const core::Config& cfg, const auth::AuthPolicy* policy);

  std::size_t models = 0;  // configured models
  // Escaped label values by slot; the last one is "other" (tenants past
  // server.metrics.max_tenants, in name order). Empty: no tenant label.
  std::vector<std::string> tenants;
  // The same for key_id: configured keys by config order past max_key_ids,
  // and keys from Redis (auth.redis_keys), are "other". Empty: no key_id label.
  std::vector<std::string> key_ids;
  std::uint32_t tenant_scopes = 0;           // the policy's tenants: admission scopes of keys start here
  std::vector<std::uint32_t> endpoint_base;  // pool p's endpoints have slots [base[p], base[p + 1])

  // The slots of `p`'s tenant and key (its admission scopes, auth/policy.hpp). O(1).
  MetricIdentity identity(const auth::Principal* p) const {
    MetricIdentity id;
    if (!p) return id;
    if (!tenants.empty()) {
      const auto other = static_cast<std::uint32_t>(tenants.size() - 1);
      id.tenant = static_cast<std::uint16_t>(p->tenant->scope < other ? p->tenant->scope : other);
    }
    if (p->key && !key_ids.empty()) {
      const auto other = static_cast<std::uint32_t>(key_ids.size() - 1);
      const std::uint32_t s = p->key->scope;
      // A Redis key has its tenant's scope (below tenant_scopes): "other".
      id.key = static_cast<std::uint16_t>(s >= tenant_scopes && s - tenant_scopes < other ? s - tenant_scopes : other);
    }
    return id;
  }
};

// Why Weir's admission answered 429 (weir_rate_limited_total{reason}).
enum class RateLimitReason : std::uint8_t {
  rate_limit_exceeded,  // a requests or tokens bucket, or a stream cap
  insufficient_quota,   // a budget
  count_,
};

class MetricsShard {
 public:
  // Model label slots: configured models, then "*" (unlisted, default pool), then "" (no model).
  explicit MetricsShard(std::shared_ptr<const MetricLabels> labels);

  const MetricLabels& labels() const { return *labels_; }
  const std::shared_ptr<const MetricLabels>& labels_ptr() const { return labels_; }
  std::uint32_t unlisted_model() const { return static_cast<std::uint32_t>(models_ - 2); }
  std::uint32_t no_model() const { return static_cast<std::uint32_t>(models_ - 1); }

  // weir_requests_total{route,model,status[,tenant][,key_id]}.
  void count_request(RouteKind r, std::uint32_t model, int status, MetricIdentity id = {}) {
    counters_.add(series(Family::requests, static_cast<std::uint32_t>(r), status_slot(status), model, id), 1);
  }
  core::Histogram& ttft(std::uint32_t model) { return ttft_[model]; }
  // weir_inter_token_latency_seconds{model}: one observation per SSE data event after a stream's first.
  core::Histogram& itl(std::uint32_t model) { return itl_[model]; }
  core::Histogram& upstream_time(std::uint32_t model) { return upstream_[model]; }
  core::Histogram& duration(std::uint32_t model) { return duration_[model]; }
  core::Histogram& added() { return added_; }
  // weir_{prompt,completion}_tokens_total{model[,tenant][,key_id]}.
  void add_tokens(std::uint32_t model, std::uint64_t prompt, std::uint64_t completion, MetricIdentity id = {}) {
    counters_.add(series(Family::prompt_tokens, 0, 0, model, id), prompt);
    counters_.add(series(Family::completion_tokens, 0, 0, model, id), completion);
  }
  // weir_spend_usd_total{model[,tenant][,key_id]}, in nano-USD (admission/pricing.hpp).
  void add_spend(std::uint32_t model, std::int64_t nano_usd, MetricIdentity id) {
    if (nano_usd > 0) counters_.add(series(Family::spend, 0, 0, model, id), static_cast<std::uint64_t>(nano_usd));
  }
  // weir_rate_limited_total{reason[,tenant][,key_id]}.
  void count_rate_limited(RateLimitReason r, MetricIdentity id) {
    counters_.add(series(Family::rate_limited, 0, static_cast<std::uint32_t>(r), 0, id), 1);
  }
  // The value of one series of weir_requests_total (tests).
  std::uint64_t requests(RouteKind r, std::uint32_t model, int status, MetricIdentity id = {}) const {
    return counters_.get(series(Family::requests, static_cast<std::uint32_t>(r), status_slot(status), model, id));
  }

  std::int64_t active_streams = 0;      // gauge
  std::int64_t active_connections = 0;  // gauge (downstream)
  std::uint64_t upstream_connects = 0;  // new upstream TCP connections
  // weir_upstream_retries_total{reason}: attempts repeated before any byte reached the client.
  void count_retry(routing::RetryReason r) { ++retries_[static_cast<std::size_t>(r)]; }
  // A request's first endpoint pick on a pool, by the rule that made it (WorkerPool::last_rule).
  void count_pick(routing::PickRule r) { ++picks_[static_cast<std::size_t>(r)]; }
  std::uint64_t picks(routing::PickRule r) const { return picks_[static_cast<std::size_t>(r)]; }
  std::uint64_t retries(routing::RetryReason r) const { return retries_[static_cast<std::size_t>(r)]; }
  std::uint64_t upstream_fallbacks = 0;      // requests that moved on to a model's fallback target
  std::uint64_t retry_budget_exhausted = 0;  // retries refused by a pool's retry budget
  std::uint64_t outlier_ejections = 0;       // endpoints ejected for failing answers in a row or a slow TTFT
  std::uint64_t health_transitions = 0;      // endpoints the health probes marked down or up again
  std::uint64_t first_token_timeouts = 0;    // streams whose first token did not come in timeouts.first_token
  std::uint64_t deadline_exceeded = 0;       // requests whose x-weir-timeout-ms passed
  // weir_requests_shed_total{pool,reason}: requests a pool's queue shed.
  void count_shed(std::uint32_t pool, routing::ShedReason r) {
    if (pool < pools()) ++shed_[pool * kShedReasons + static_cast<std::size_t>(r)];
  }
  std::uint64_t shed(std::uint32_t pool, routing::ShedReason r) const {
    return pool < pools() ? shed_[pool * kShedReasons + static_cast<std::size_t>(r)] : 0;
  }
  // weir_queued_requests_total{pool}: requests that waited in a pool's queue.
  std::uint64_t& queued(std::uint32_t pool) { return pool < pools() ? per_pool_[pool].queued : spare_; }
  // weir_upstream_pool_unavailable_total{pool}: requests that found every endpoint's breaker open.
  std::uint64_t& pool_unavailable(std::uint32_t pool) { return pool < pools() ? per_pool_[pool].unavailable : spare_; }
  // Set from the worker's pools when a snapshot is taken (Worker::metrics_snapshot):
  // endpoint `endpoint` of pool `pool` opened `opened[cause]` times and recovered `recovered` times;
  // the pool's queue holds `waiting` requests now.
  void set_endpoint_health(
      std::uint32_t pool, std::uint32_t endpoint,
      const std::array<std::uint64_t, static_cast<std::size_t>(routing::OpenCause::count_)>& opened,
      std::uint64_t recovered);
  void set_queue_waiting(std::uint32_t pool, std::uint64_t waiting) {
    if (pool < pools()) per_pool_[pool].waiting = waiting;
  }
  batching::Stats batch;  // micro-batches and coalescing (pools.X.batch, pools.X.coalesce)
  // weir_upstream_attempts_total{pool,endpoint}: requests sent (or connects
  // tried) to endpoint `endpoint` of config pool `pool`, retries included.
  void count_attempt(std::uint32_t pool, std::uint32_t endpoint) {
    if (const auto e = endpoint_slot(pool, endpoint); e < attempts_.size()) ++attempts_[e];
  }
  // weir_upstream_failures_total{pool,endpoint,kind}: failures the upstream
  // caused (not Weir's own cancels).
  void count_upstream_failure(std::uint32_t pool, std::uint32_t endpoint, http::UpstreamFailure f) {
    const auto e = endpoint_slot(pool, endpoint);
    if (http::is_upstream_fault(f) && e < attempts_.size()) ++upstream_failures_[e * kFailureKinds + kind_of(f)];
  }
  // Failures of kind `f` over every endpoint.
  std::uint64_t upstream_failures(http::UpstreamFailure f) const;
  std::uint64_t client_disconnects = 0;   // client left before the response ended
  std::uint64_t slow_client_cutoffs = 0;  // stream backlog or write timeout exceeded
  std::uint64_t bytes_in = 0;             // request bodies, bytes
  std::uint64_t bytes_out = 0;            // response bytes written downstream
  std::uint64_t sse_events = 0;           // events relayed downstream

  void merge(const MetricsShard& o);

  // Renders the merged shard in Prometheus text format.
  void render(std::string& out, const core::Config& cfg, std::uint64_t access_log_write_errors) const;

 private:
  static constexpr std::array<int, 20> kStatuses = {200, 400, 401, 403, 404, 405, 408, 413, 415, 422,
                                                    429, 431, 499, 500, 501, 502, 503, 504, 0,   0};
  static constexpr std::size_t kStatusSlots = 24;  // the list above, then other 1xx/2xx/3xx/4xx/5xx
  static std::uint32_t status_slot(int status);
  static constexpr std::size_t kFailureKinds = static_cast<std::size_t>(http::UpstreamFailure::count_);
  static constexpr std::size_t kShedReasons = static_cast<std::size_t>(routing::ShedReason::count_);
  static constexpr std::size_t kOpenCauses = static_cast<std::size_t>(routing::OpenCause::count_);
  std::uint32_t pools() const { return static_cast<std::uint32_t>(per_pool_.size()); }
  static std::size_t kind_of(http::UpstreamFailure f) { return static_cast<std::size_t>(f); }

  // The counters with identity labels live in one sparse map, keyed by
  // family (4 bits) | route (6) | status slot or reason (5) | model slot (17) | tenant (16) | key (16).
  enum class Family : std::uint8_t { requests, prompt_tokens, completion_tokens, spend, rate_limited };
  static std::uint64_t series(Family f, std::uint32_t route, std::uint32_t status, std::uint32_t model,
                              MetricIdentity id) {
    return std::uint64_t{static_cast<std::uint8_t>(f)} << 60 | std::uint64_t{route & 0x3f} << 54 |
           std::uint64_t{status & 0x1f} << 49 | std::uint64_t{model & 0x1ffff} << 32 | std::uint64_t{id.tenant} << 16 |
           id.key;
  }
  std::size_t endpoint_slot(std::uint32_t pool, std::uint32_t endpoint) const {
    const auto& base = labels_->endpoint_base;
    if (pool + 1 >= base.size() || base[pool] + endpoint >= base[pool + 1]) return attempts_.size();
    return base[pool] + endpoint;
  }

  std::shared_ptr<const MetricLabels> labels_;
  std::size_t models_;
  core::CounterMap counters_;
  std::vector<core::Histogram> ttft_, itl_, upstream_, duration_;
  std::vector<std::uint64_t> attempts_;           // by endpoint slot
  std::vector<std::uint64_t> upstream_failures_;  // by endpoint slot x failure kind
  std::vector<std::uint64_t> ejections_;          // by endpoint slot x open cause (from the pools)
  std::vector<std::uint64_t> recoveries_;         // by endpoint slot (from the pools)
  std::vector<std::uint64_t> shed_;               // by pool x shed reason
  struct PerPool {
    std::uint64_t queued = 0;       // requests that waited in the queue
    std::uint64_t unavailable = 0;  // requests that found every breaker open
    std::uint64_t waiting = 0;      // gauge: requests waiting now (from the pool)
  };
  std::vector<PerPool> per_pool_;
  std::uint64_t spare_ = 0;  // written for a pool index out of range (never read)
  std::array<std::uint64_t, static_cast<std::size_t>(routing::RetryReason::count_)> retries_{};
  std::array<std::uint64_t, static_cast<std::size_t>(routing::PickRule::count_)> picks_{};
  core::Histogram added_;
};

}  // namespace weir::gateway
