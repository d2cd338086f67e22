// The gateway's Prometheus metrics: one shard per worker, written only by
// that worker's thread (plain adds), merged on scrape.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <boost/json/object.hpp>

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
// MetricLabels::tenants / key_ids, kOther ("other"), or kNone (the label is
// left out).
struct MetricIdentity {
  static constexpr std::uint16_t kNone = 0xffff;
  static constexpr std::uint16_t kOther = 0xfffe;
  std::uint16_t tenant = kNone;
  std::uint16_t key = kNone;
};

// The label values /metrics uses beyond route, model and status, fixed per
// configuration generation from the configuration (server.metrics) and the
// auth policy, so every family's label sets are bounded by the
// configurations' sizes. Shared read-only by every shard.
//
// Model, pool and endpoint slots are reused, so their number stays bounded
// by what the configurations in use name: labels built for a reload
// (`previous` given) keep every slot a name had while a configuration alive
// names it (a model, pool or endpoint the new configuration still names
// keeps its series and its count; one it removed keeps them while a request
// of an earlier configuration that names it may still count, not shown);
// a slot whose name no configuration alive has current (labels alive: those
// of the generations requests and workers hold) is freed, and a new name
// takes a free slot. Each shard zeroes a slot whose name changed (its epoch)
// when it moves to later labels (MetricsShard::relabel), and a merge leaves
// out an earlier shard's counts of such a slot. So a name removed and named
// again goes on from its count if the slot was kept, and starts from 0 once
// it was freed (docs/observability.md). Tenants and keys keep their slots
// (bounded by server.metrics.max_tenants / max_key_ids, then "other").
struct MetricLabels {
  // Model slots are below this (MetricsShard's fixed "*" and "" slots follow; a series key holds 17 bits).
  static constexpr std::uint32_t kModelSlots = 0x1fffe;
  // Slots from `cfg` and `policy` (null: no auth, so no tenant or key_id
  // label), extending `previous` when given (its label settings are kept:
  // server.metrics changes only at restart). Null when the models would
  // need more than kModelSlots slots (the new ones and those current in
  // labels alive: core::ModelConfig::kMaxModels keeps a configuration and
  // its predecessor within; a third alive may not fit).
  static std::shared_ptr<const MetricLabels> build(const core::Config& cfg, const auth::AuthPolicy* policy,
                                                   const MetricLabels* previous = nullptr);

  // Labels built later have a higher serial (the first: 1).
  std::uint64_t serial = 0;
  // Model slots: `models[s]` is the (escaped) label value of the model in
  // slot s, `model_current[s]` 1 while it is configured (rendered even at
  // 0), `model_vacant[s]` 1 when the slot has no model (its name empty).
  std::vector<std::string> models;
  std::vector<std::string> model_names;  // the same, not escaped (JSON)
  std::vector<std::uint8_t> model_current;
  std::vector<std::uint8_t> model_vacant;
  // The serial of the labels that gave slot s its model (or freed it): two labels of one lineage with the
  // same epoch for s name the same model there (MetricsShard::relabel and merge compare them).
  std::vector<std::uint64_t> model_epoch;
  std::vector<std::uint32_t> model_slot;  // Config::models index -> slot
  // Pool slots, the same way by pool name: `pools[s]` is 'pool="P"';
  // `pool_queued[s]` 1 while it is configured with a queue (pools.X.queue).
  std::vector<std::string> pools;
  std::vector<std::uint8_t> pool_current;
  std::vector<std::uint8_t> pool_vacant;
  std::vector<std::uint64_t> pool_epoch;
  std::vector<std::uint8_t> pool_queued;
  std::vector<std::uint32_t> pool_slot;  // Config::pools index -> slot
  // Endpoint slots, the same way: `endpoints[s]` is 'pool="P",endpoint="URL"'.
  std::vector<std::string> endpoints;
  std::vector<std::uint8_t> endpoint_current;
  std::vector<std::uint8_t> endpoint_vacant;
  std::vector<std::uint64_t> endpoint_epoch;
  // Config pool p's endpoint e has slot endpoint_slots[endpoint_base[p] + e].
  std::vector<std::uint32_t> endpoint_base;
  std::vector<std::uint32_t> endpoint_slots;
  // Every labels built from one first (weak: which are alive decides which slots are held).
  struct Lineage;
  std::shared_ptr<Lineage> lineage;
  // Escaped label values by slot; the last one is "other" (tenants past
  // server.metrics.max_tenants since start-up, and those of the first
  // generation past it in name order). Empty: no tenant label.
  std::vector<std::string> tenants;
  std::vector<std::string> tenant_names;  // the named slots' tenants, not escaped (JSON)
  // By index into `tenants` (key_ids): 1 while the tenant (key) is in the auth policy; "other" is always 1.
  std::vector<std::uint8_t> tenant_current;
  // The same for key_id: configured keys past max_key_ids, and runtime keys
  // (admin API, Redis), are "other". Empty: no key_id label.
  std::vector<std::string> key_ids;
  std::vector<std::uint8_t> key_current;
  // Admission scope -> slot (kOther when past the end): tenants' scopes in
  // tenant_slot, configured keys' in key_slot (auth/policy.hpp).
  std::vector<std::uint16_t> tenant_slot;
  std::vector<std::uint16_t> key_slot;
  // Server settings the labels were built with (server.metrics).
  core::MetricsConfig settings;

  // The slot of endpoint `endpoint` of config pool `pool`; endpoints.size() when there is none.
  std::size_t endpoint_slot(std::uint32_t pool, std::uint32_t endpoint) const {
    if (pool + 1 >= endpoint_base.size() || endpoint_base[pool] + endpoint >= endpoint_base[pool + 1])
      return endpoints.size();
    return endpoint_slots[endpoint_base[pool] + endpoint];
  }
  // The slot of config pool `pool`; pools.size() when there is none.
  std::size_t pool_slot_of(std::uint32_t pool) const {
    return pool < pool_slot.size() ? pool_slot[pool] : pools.size();
  }
  // The series label of `slot` in `tenants` / `key_ids` (kOther: "other").
  static std::size_t index_of(std::uint16_t slot, const std::vector<std::string>& names) {
    return slot == MetricIdentity::kOther ? names.size() - 1 : slot;
  }
  // Whether a series of model slot `model` (MetricsShard's fixed "*" and "" slots included) and identity
  // slots `tenant` / `key` (kNone: no such label) is shown: none of them names what the configuration removed.
  bool current(std::size_t model, std::uint16_t tenant, std::uint16_t key) const {
    if (model < models.size() && !model_current[model]) return false;
    const auto named_current = [](std::uint16_t slot, const std::vector<std::string>& names,
                                  const std::vector<std::uint8_t>& flags) {
      if (slot == MetricIdentity::kNone || names.empty()) return true;
      const std::size_t i = index_of(slot, names);
      return i >= flags.size() || flags[i] != 0;
    };
    return named_current(tenant, tenants, tenant_current) && named_current(key, key_ids, key_current);
  }

  // The slots of `p`'s tenant and key (its admission scopes, auth/policy.hpp). O(1).
  MetricIdentity identity(const auth::Principal* p) const {
    MetricIdentity id;
    if (!p) return id;
    if (!tenants.empty()) {
      const std::uint32_t s = p->tenant->scope;
      id.tenant = s < tenant_slot.size() ? tenant_slot[s] : MetricIdentity::kOther;
    }
    if (p->key && !key_ids.empty()) {
      // A Redis key has its tenant's scope, a runtime key one past the table: "other".
      const std::uint32_t s = p->key->scope;
      id.key = s < key_slot.size() ? key_slot[s] : MetricIdentity::kOther;
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
  // Model label slots: MetricLabels::models, then the fixed slots "*"
  // (unlisted, default pool) and "" (no model).
  static constexpr std::uint32_t kUnlistedModel = MetricLabels::kModelSlots;
  static constexpr std::uint32_t kNoModel = kUnlistedModel + 1;
  static_assert(kNoModel == 0x1ffff, "series() keeps 17 bits of model slot");
  explicit MetricsShard(std::shared_ptr<const MetricLabels> labels);

  const MetricLabels& labels() const { return *labels_; }
  const std::shared_ptr<const MetricLabels>& labels_ptr() const { return labels_; }
  // Moves the shard to `labels`, a later generation's (built from the
  // current ones: MetricLabels::build with previous): a slot that keeps its
  // name keeps its series; one whose name changed (freed, or taken by a new
  // name) is zeroed; new ones start at zero. Histograms never move, so a
  // reference taken before stays valid. Older labels (lower serial) are ignored.
  void relabel(std::shared_ptr<const MetricLabels> labels);
  static constexpr std::uint32_t unlisted_model() { return kUnlistedModel; }
  static constexpr std::uint32_t no_model() { return kNoModel; }

  // weir_requests_total{route,model,status[,tenant][,key_id]}.
  void count_request(RouteKind r, std::uint32_t model, int status, MetricIdentity id = {}) {
    counters_.add(series(Family::requests, static_cast<std::uint32_t>(r), status_slot(status), model, id), 1);
  }
  core::Histogram& ttft(std::uint32_t model) { return hist(ttft_, model); }
  // One first token `us` µs after arrival: weir_time_to_first_token_seconds{model}
  // and, for a request with identity labels, the sum and count of
  // weir_tenant_time_to_first_token_seconds{model,tenant[,key_id]} (two
  // counter-map adds; no histogram per tenant, so the series stay few).
  void observe_ttft(std::uint32_t model, std::int64_t us, MetricIdentity id) {
    hist(ttft_, model).observe_us(us);
    if (id.tenant == MetricIdentity::kNone && id.key == MetricIdentity::kNone) return;
    counters_.add(series(Family::ttft_sum_us, 0, 0, model, id), static_cast<std::uint64_t>(us < 0 ? 0 : us));
    counters_.add(series(Family::ttft_count, 0, 0, model, id), 1);
  }
  // weir_inter_token_latency_seconds{model}: one observation per SSE data event after a stream's first.
  core::Histogram& itl(std::uint32_t model) { return hist(itl_, model); }
  core::Histogram& upstream_time(std::uint32_t model) { return hist(upstream_, model); }
  core::Histogram& duration(std::uint32_t model) { return hist(duration_, model); }
  core::Histogram& added() { return added_; }
  // weir_{prompt,completion}_tokens_total{model[,tenant][,key_id]}.
  void add_tokens(std::uint32_t model, std::uint64_t prompt, std::uint64_t completion, MetricIdentity id = {}) {
    counters_.add(series(Family::prompt_tokens, 0, 0, model, id), prompt);
    counters_.add(series(Family::completion_tokens, 0, 0, model, id), completion);
  }
  // weir_estimated_{prompt,completion}_tokens_total{model[,tenant][,key_id]}: what a request that reported no
  // usage was charged (settle(): the access log's charged_tokens), kept out of weir_*_tokens_total.
  void add_estimated_tokens(std::uint32_t model, std::uint64_t prompt, std::uint64_t completion,
                            MetricIdentity id = {}) {
    counters_.add(series(Family::estimated_prompt_tokens, 0, 0, model, id), prompt);
    counters_.add(series(Family::estimated_completion_tokens, 0, 0, model, id), completion);
  }
  // weir_spend_usd_total{model[,tenant][,key_id]}, in nano-USD (admission/pricing.hpp).
  void add_spend(std::uint32_t model, std::int64_t nano_usd, MetricIdentity id) {
    if (nano_usd > 0) counters_.add(series(Family::spend, 0, 0, model, id), static_cast<std::uint64_t>(nano_usd));
  }
  // weir_upstream_invalid_utf8_total{model}: an upstream's SSE event or answer body in which ill-formed UTF-8
  // was replaced by U+FFFD before its client got it (http::replace_invalid_utf8): a broken upstream, or one
  // that is not vLLM.
  void count_invalid_utf8(std::uint32_t model) { counters_.add(series(Family::invalid_utf8, 0, 0, model, {}), 1); }
  std::uint64_t invalid_utf8(std::uint32_t model) const {
    return counters_.get(series(Family::invalid_utf8, 0, 0, model, {}));
  }
  // weir_upstream_invalid_usage_total{model}: a request whose upstream sent a usage it cannot be billed by
  // (api::extract_usage's invalid: a count negative, fractional, not a number or over api::kMaxUsageTokens, or
  // a generation's prompt or completion count left out), charged as one without usage instead, the part a
  // usage with a count left out said as said (GatewayPhases::settle).
  void count_invalid_usage(std::uint32_t model) { counters_.add(series(Family::invalid_usage, 0, 0, model, {}), 1); }
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
  std::uint64_t upstream_resumes = 0;        // broken streams continued on another endpoint (pools.X.resume)
  std::uint64_t retry_budget_exhausted = 0;  // retries refused by a pool's retry budget
  std::uint64_t outlier_ejections = 0;       // endpoints ejected for failing answers in a row or a slow TTFT
  std::uint64_t health_transitions = 0;      // endpoints the health probes marked down or up again
  std::uint64_t first_token_timeouts = 0;    // streams whose first token did not come in timeouts.first_token
  std::uint64_t deadline_exceeded = 0;       // requests whose x-weir-timeout-ms passed
  // The per-pool series below take the pool's slot (MetricLabels::pool_slot_of
  // of the request's generation: a pool keeps its slot, by name, across reloads).
  // weir_requests_shed_total{pool,reason}: requests a pool's queue shed.
  void count_shed(std::size_t pool_slot, routing::ShedReason r) {
    if (pool_slot < per_pool_.size()) ++shed_[pool_slot * kShedReasons + static_cast<std::size_t>(r)];
  }
  std::uint64_t shed(std::size_t pool_slot, routing::ShedReason r) const {
    return pool_slot < per_pool_.size() ? shed_[pool_slot * kShedReasons + static_cast<std::size_t>(r)] : 0;
  }
  // weir_queued_requests_total{pool}: requests that waited in a pool's queue.
  std::uint64_t& queued(std::size_t pool_slot) {
    return pool_slot < per_pool_.size() ? per_pool_[pool_slot].queued : spare_;
  }
  // weir_upstream_pool_unavailable_total{pool}: requests that found every endpoint's breaker open.
  std::uint64_t& pool_unavailable(std::size_t pool_slot) {
    return pool_slot < per_pool_.size() ? per_pool_[pool_slot].unavailable : spare_;
  }
  // weir_queue_waiting{pool}: added from the worker's pools when a snapshot
  // is taken (Worker::metrics_snapshot): `waiting` requests in a queue of the pool now.
  void add_queue_waiting(std::size_t pool_slot, std::uint64_t waiting) {
    if (pool_slot < per_pool_.size()) per_pool_[pool_slot].waiting += waiting;
  }
  // weir_upstream_ejections_total{pool,endpoint,cause} and
  // weir_upstream_recoveries_total{pool,endpoint}: the endpoint in slot
  // `slot` (MetricLabels::endpoint_slot) opened for `cause` / was found
  // healthy again (routing::WorkerPool::on_transition).
  void count_ejection_at(std::size_t slot, routing::OpenCause cause) {
    if (slot < recoveries_.size()) ++ejections_[slot * kOpenCauses + static_cast<std::size_t>(cause)];
  }
  void count_recovery_at(std::size_t slot) {
    if (slot < recoveries_.size()) ++recoveries_[slot];
  }
  std::uint64_t ejections_at(std::size_t slot, routing::OpenCause cause) const {
    return slot < recoveries_.size() ? ejections_[slot * kOpenCauses + static_cast<std::size_t>(cause)] : 0;
  }
  std::uint64_t recoveries_at(std::size_t slot) const { return slot < recoveries_.size() ? recoveries_[slot] : 0; }
  batching::Stats batch;  // micro-batches and coalescing (pools.X.batch, pools.X.coalesce)
  // weir_upstream_attempts_total{pool,endpoint}: requests sent (or connects
  // tried) to the endpoint in slot `slot` (MetricLabels::endpoint_slot of
  // the request's generation), retries included.
  void count_attempt_at(std::size_t slot) {
    if (slot < attempts_.size()) ++attempts_[slot];
  }
  // weir_upstream_failures_total{pool,endpoint,kind}: failures the upstream
  // caused (not Weir's own cancels), of the endpoint in slot `slot`.
  void count_upstream_failure_at(std::size_t slot, http::UpstreamFailure f) {
    if ((http::is_upstream_fault(f) || f == http::UpstreamFailure::local_resources) && slot < attempts_.size())
      ++upstream_failures_[slot * kFailureKinds + kind_of(f)];
  }
  // The same by config pool and endpoint index, through this shard's labels
  // (for a request of an older generation use the *_at forms with its slots).
  void count_attempt(std::uint32_t pool, std::uint32_t endpoint) {
    count_attempt_at(labels_->endpoint_slot(pool, endpoint));
  }
  void count_upstream_failure(std::uint32_t pool, std::uint32_t endpoint, http::UpstreamFailure f) {
    count_upstream_failure_at(labels_->endpoint_slot(pool, endpoint), f);
  }
  // Failures of kind `f` over every endpoint.
  std::uint64_t upstream_failures(http::UpstreamFailure f) const;
  // weir_upstream_attempts_total and weir_upstream_failures_total (kind `f`)
  // of the endpoint in slot `slot` (MetricLabels::endpoint_slot); 0 for a slot that does not exist.
  std::uint64_t attempts_at(std::size_t slot) const { return slot < attempts_.size() ? attempts_[slot] : 0; }
  std::uint64_t upstream_failures_at(std::size_t slot, http::UpstreamFailure f) const {
    return slot < attempts_.size() ? upstream_failures_[slot * kFailureKinds + kind_of(f)] : 0;
  }
  std::uint64_t client_disconnects = 0;   // client left before the response ended
  std::uint64_t slow_client_cutoffs = 0;  // stream backlog or write timeout exceeded
  std::uint64_t bytes_in = 0;             // requests taken from the connection (head and body), bytes
  std::uint64_t bytes_out = 0;            // response bytes written downstream
  std::uint64_t sse_events = 0;           // events relayed downstream

  // Adds `o` (a shard of labels as late as this one's or earlier; later ones are adopted first).
  void merge(const MetricsShard& o);

  // Renders the merged shard in Prometheus text format.
  // The access log's counters come from its sink (core::AccessLogSink), which the workers share.
  void render(std::string& out, std::uint64_t access_log_write_errors, std::uint64_t access_log_lines_lost = 0,
              std::uint64_t access_log_reopen_failures = 0, bool access_log_reopen_pending = false) const;

  // The merged shard's traffic by model and by tenant, cumulative since
  // start, for GET /admin/v1/stats (docs/admin-api.md: the shape): requests
  // by status, TTFT (a histogram per model; sum and count per tenant),
  // tokens, spend (USD) and Weir's own 429s. Weir's own probe routes
  // (/health, /ready, /metrics) are left out. Models and tenants are the
  // labels' (every one since start-up: configured ones always, others
  // while they have a count).
  boost::json::object stats_json() const;

 private:
  static constexpr std::array<int, 20> kStatuses = {200, 204, 400, 401, 403, 404, 405, 408, 413, 414,
                                                    415, 422, 429, 431, 499, 500, 501, 502, 503, 504};
  static constexpr std::size_t kStatusSlots = 26;  // the list above, then other 1xx/2xx/3xx/4xx/5xx
  static std::uint32_t status_slot(int status);
  static constexpr std::size_t kFailureKinds = static_cast<std::size_t>(http::UpstreamFailure::count_);
  static constexpr std::size_t kShedReasons = static_cast<std::size_t>(routing::ShedReason::count_);
  static constexpr std::size_t kOpenCauses = static_cast<std::size_t>(routing::OpenCause::count_);
  static std::size_t kind_of(http::UpstreamFailure f) { return static_cast<std::size_t>(f); }

  // One histogram per configured model slot (a deque: growing it on
  // relabel never moves one), and the "*" and "" slots.
  struct PerModel {
    std::deque<core::Histogram> models;
    std::array<core::Histogram, 2> fixed;  // kUnlistedModel, kNoModel
    std::span<const std::int64_t> bounds;
  };
  static core::Histogram& hist(PerModel& h, std::uint32_t model) {
    return model >= kUnlistedModel ? h.fixed[model - kUnlistedModel] : h.models[model];
  }
  static void grow(PerModel& h, std::size_t models) {
    while (h.models.size() < models) h.models.emplace_back(h.bounds);
  }
  // (`skip`: by model slot, 1 for one whose counts in `from` are another name's.)
  static void merge(PerModel& into, const PerModel& from, const std::vector<std::uint8_t>& skip);
  // Zeroes the series of the slots `to` names otherwise than `from` (relabel).
  void clear_renamed(const MetricLabels& from, const MetricLabels& to);

  // The counters with identity labels live in one sparse map, keyed by
  // family (4 bits) | route (6) | status slot or reason (5) | model slot (17) | tenant (16) | key (16).
  enum class Family : std::uint8_t {
    requests,
    prompt_tokens,
    completion_tokens,
    spend,
    rate_limited,
    ttft_sum_us,  // weir_tenant_time_to_first_token_seconds_sum, in µs
    ttft_count,   // weir_tenant_time_to_first_token_seconds_count
    estimated_prompt_tokens,
    estimated_completion_tokens,
    invalid_utf8,   // weir_upstream_invalid_utf8_total{model}: no identity labels
    invalid_usage,  // weir_upstream_invalid_usage_total{model}: no identity labels
  };
  static std::uint64_t series(Family f, std::uint32_t route, std::uint32_t status, std::uint32_t model,
                              MetricIdentity id) {
    return std::uint64_t{static_cast<std::uint8_t>(f)} << 60 | std::uint64_t{route & 0x3f} << 54 |
           std::uint64_t{status & 0x1f} << 49 | std::uint64_t{model & 0x1ffff} << 32 | std::uint64_t{id.tenant} << 16 |
           id.key;
  }

  std::shared_ptr<const MetricLabels> labels_;
  core::CounterMap counters_;
  PerModel ttft_, itl_, upstream_, duration_;
  std::vector<std::uint64_t> attempts_;           // by endpoint slot
  std::vector<std::uint64_t> upstream_failures_;  // by endpoint slot x failure kind
  std::vector<std::uint64_t> ejections_;          // by endpoint slot x open cause
  std::vector<std::uint64_t> recoveries_;         // by endpoint slot
  std::vector<std::uint64_t> shed_;               // by pool slot x shed reason
  struct PerPool {
    std::uint64_t queued = 0;       // requests that waited in the queue
    std::uint64_t unavailable = 0;  // requests that found every breaker open
    std::uint64_t waiting = 0;      // gauge: requests waiting now (from the pool)
  };
  std::vector<PerPool> per_pool_;  // by pool slot
  std::uint64_t spare_ = 0;        // written for a pool slot out of range (never read)
  std::array<std::uint64_t, static_cast<std::size_t>(routing::RetryReason::count_)> retries_{};
  std::array<std::uint64_t, static_cast<std::size_t>(routing::PickRule::count_)> picks_{};
  core::Histogram added_;
};

}  // namespace weir::gateway
