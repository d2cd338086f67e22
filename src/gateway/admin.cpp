#include "gateway/admin.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include "auth/authenticator.hpp"
#include "auth/redis_keys.hpp"
#include "core/json_text.hpp"
#include "core/process_metrics.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

namespace {
const std::int64_t kStartTime =
    std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();

void append_model(std::string& out, std::string_view id, std::string_view owned_by, std::string_view root) {
  out += R"({"id":)";
  core::append_json_string(out, id);
  fmt::format_to(std::back_inserter(out), R"(,"object":"model","created":{},"owned_by":)", kStartTime);
  core::append_json_string(out, owned_by);
  out += R"(,"root":)";
  core::append_json_string(out, root);
  out += "}";
}
// weir_budget_{limit,remaining}_usd{tenant}: every budgeted tenant with a
// tenant label of its own (MetricLabels), read from the limiter (atomics:
// safe on any thread). Remaining is the limit minus the period's settled
// spend; it goes below 0 when the last requests cost more than their
// reservations (the only way spend passes a limit: docs/admission.md).
void append_budget_metrics(std::string& out, const auth::AuthPolicy& policy, admission::Limiter& limiter,
                           const MetricLabels& labels) {
  const auto& tenants = policy.tenants();
  const std::size_t own = labels.tenants.empty() ? 0 : std::min(tenants.size(), labels.tenants.size() - 1);
  bool any = false;
  for (std::size_t i = 0; i < own; ++i) any = any || tenants[i].budget.any();
  if (!any) return;
  core::PromWriter w(out);
  w.header("weir_budget_limit_usd", "gauge", "The tenant's budget per period (tenants.X.budget), USD.");
  for (std::size_t i = 0; i < own; ++i)
    if (tenants[i].budget.any())
      w.sample("weir_budget_limit_usd", fmt::format("tenant=\"{}\"", labels.tenants[i]),
               static_cast<double>(tenants[i].budget.limit_nano_usd) / 1e9);
  w.header("weir_budget_remaining_usd", "gauge",
           "What is left of the tenant's budget in the current period (limit minus settled spend), USD.");
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < own; ++i)
    if (tenants[i].budget.any())
      w.sample("weir_budget_remaining_usd", fmt::format("tenant=\"{}\"", labels.tenants[i]),
               static_cast<double>(tenants[i].budget.limit_nano_usd - limiter.spent(tenants[i].scope, now)) / 1e9);
}

// The merged health of every endpoint (routing::HealthBoard, atomics) and
// the saturation of the pools with a queue (the scraped loads).
void append_health_metrics(std::string& out, const Shared& shared) {
  const auto& cfg = *shared.config;
  const auto now = std::chrono::steady_clock::now();
  core::PromWriter w(out);
  const std::size_t pools = std::min(cfg.pools.size(), shared.pool_states.size());
  w.header("weir_upstream_endpoint_state", "gauge",
           "Workers on which the endpoint is closed (in use), open (ejected: its circuit breaker open) or half_open "
           "(letting trial requests through).");
  for (std::size_t p = 0; p < pools; ++p) {
    const auto& st = *shared.pool_states[p];
    for (std::uint32_t e = 0; e < st.health.endpoints(); ++e) {
      std::array<std::uint32_t, static_cast<std::size_t>(routing::HealthState::count_)> n{};
      for (std::uint32_t k = 0; k < st.health.workers(); ++k)
        ++n[static_cast<std::size_t>(st.health.state(e, k, now, st.policy))];
      for (auto s : {routing::HealthState::closed, routing::HealthState::open, routing::HealthState::half_open}) {
        if (s == routing::HealthState::half_open && !st.policy.breaker()) continue;
        w.sample("weir_upstream_endpoint_state",
                 fmt::format("pool=\"{}\",endpoint=\"{}\",state=\"{}\"", core::escape_label(cfg.pools[p].name),
                             core::escape_label(cfg.pools[p].endpoints[e].display), routing::health_state_label(s)),
                 static_cast<double>(n[static_cast<std::size_t>(s)]));
      }
    }
  }
  w.header("weir_upstream_available_endpoints", "gauge",
           "Endpoints of the pool that some worker may send a request to now (closed or half-open there).");
  for (std::size_t p = 0; p < pools; ++p) {
    const auto& st = *shared.pool_states[p];
    w.sample("weir_upstream_available_endpoints", fmt::format("pool=\"{}\"", core::escape_label(cfg.pools[p].name)),
             static_cast<double>(st.health.available_endpoints(now, st.policy)));
  }
  bool any_saturation = false;
  for (std::size_t p = 0; p < pools; ++p) any_saturation |= cfg.pools[p].queue.enabled && cfg.pools[p].queue.saturation;
  if (!any_saturation) return;
  w.header("weir_pool_saturated", "gauge",
           "1 while every endpoint of the pool with a fresh /metrics scrape is saturated (queue.saturation: "
           "vllm:num_requests_waiting or vllm:kv_cache_usage_perc at its threshold).");
  for (std::size_t p = 0; p < pools; ++p) {
    const auto& qc = cfg.pools[p].queue;
    if (!qc.enabled || !qc.saturation) continue;
    const auto& st = *shared.pool_states[p];
    bool saturated = false;
    for (std::uint32_t e = 0; e < st.loads.size(); ++e) {
      if (!st.health.available(e, now, st.policy)) continue;
      const auto l = st.loads.read(e);
      if (l.seq == 0 || !routing::endpoint_saturated(l, qc)) {
        saturated = false;
        break;
      }
      saturated = true;
    }
    w.sample("weir_pool_saturated", fmt::format("pool=\"{}\"", core::escape_label(cfg.pools[p].name)),
             saturated ? 1.0 : 0.0);
  }
}
}  // namespace

std::string ready_problem(const Shared& shared) {
  if (shared.draining.load()) return "Weir is draining.";
  const auto& cfg = *shared.config;
  if (cfg.server.ready_pools == core::ServerConfig::ReadyPools::off) return {};
  // The pools that serve a model first (a pool only a fallback names is a spare), and the default pool.
  std::vector<bool> used(cfg.pools.size(), false);
  for (const auto& m : cfg.models) used[m.pool] = true;
  if (cfg.default_pool) used[*cfg.default_pool] = true;
  const auto now = std::chrono::steady_clock::now();
  std::string down;
  std::size_t used_n = 0, down_n = 0;
  for (std::size_t p = 0; p < cfg.pools.size() && p < shared.pool_states.size(); ++p) {
    if (!used[p]) continue;
    ++used_n;
    const auto& st = *shared.pool_states[p];
    if (st.health.available_endpoints(now, st.policy) > 0) continue;
    ++down_n;
    fmt::format_to(std::back_inserter(down), "{}`{}`", down.empty() ? "" : ", ", cfg.pools[p].name);
  }
  if (down_n == 0) return {};
  if (cfg.server.ready_pools == core::ServerConfig::ReadyPools::any && down_n < used_n) return {};
  return fmt::format("No endpoint of pool{} {} is available (all ejected).", down_n > 1 ? "s" : "", down);
}

tl::expected<std::string, core::Error> models_response(const core::Config& cfg, std::string_view path,
                                                       const auth::Principal* principal) {
  auto visible = [&](const core::ModelConfig& m) {
    return !principal || auth::Authenticator::check_model(*principal, m.name).has_value();
  };
  std::string out;
  constexpr std::string_view prefix = "/v1/models/";
  if (path.starts_with(prefix)) {
    const std::string_view id = path.substr(prefix.size());
    for (const auto& m : cfg.models) {
      if (!visible(m)) continue;
      if (m.name == id) {
        append_model(out, m.name, m.owned_by, m.name);
        return out;
      }
      for (const auto& a : m.aliases)
        if (a == id) {
          append_model(out, a, m.owned_by, m.name);
          return out;
        }
    }
    return tl::unexpected(core::model_not_found(id));
  }
  out += R"({"object":"list","data":[)";
  bool first = true;
  for (const auto& m : cfg.models) {
    if (!visible(m)) continue;
    if (!first) out += ",";
    first = false;
    append_model(out, m.name, m.owned_by, m.name);
    for (const auto& a : m.aliases) {
      out += ",";
      append_model(out, a, m.owned_by, m.name);
    }
  }
  out += "]}";
  return out;
}

http::Task<void> collect_metrics_text(Worker& self, std::string& out) {
  co_await collect_metrics_text(self.shared(), self.io(), out);
}

http::Task<void> collect_metrics_text(Shared& shared, boost::asio::io_context& home, std::string& out) {
  struct Gather {
    Gather(http::Executor ex, std::shared_ptr<const MetricLabels> labels, std::size_t n)
        : total(std::move(labels)), remaining(n), timer(ex) {}
    MetricsShard total;
    std::size_t remaining;
    http::Timer timer;
  };
  // Label slots never change after start: reading worker 0's pointer from here is safe.
  auto labels = shared.metric_labels ? shared.metric_labels : shared.workers.front()->metrics().labels_ptr();
  auto g = std::make_shared<Gather>(home.get_executor(), std::move(labels), shared.workers.size());
  for (Worker* w : shared.workers) {
    boost::asio::post(w->io(), [w, g, &home] {
      MetricsShard copy = w->metrics_snapshot();  // on w's own thread
      boost::asio::post(home, [g, copy = std::move(copy)]() mutable {
        g->total.merge(copy);
        if (--g->remaining == 0) g->timer.cancel();
      });
    });
  }
  g->timer.expires_after(std::chrono::seconds(1));
  co_await g->timer.async_wait(http::use_task);
  g->total.render(out, *shared.config, shared.log_sink ? shared.log_sink->write_errors() : 0);
  append_health_metrics(out, shared);
  if (shared.limiter && shared.auth_policy)
    append_budget_metrics(out, *shared.auth_policy, *shared.limiter, g->total.labels());
  if (shared.request_log) {
    // The request-log store's writer (atomics, safe to read here).
    const auto s = shared.request_log->stats();
    core::PromWriter w(out);
    w.header("weir_request_log_written_total", "counter", "Request records stored (request_log:).");
    w.sample("weir_request_log_written_total", "", s.written);
    w.header("weir_request_log_dropped_total", "counter",
             "Request records not stored: queue_full (the writer is behind or the store is down), write_error (their "
             "transaction failed), shutdown (the drain ran out of time).");
    w.sample("weir_request_log_dropped_total", "reason=\"queue_full\"", s.dropped_queue_full);
    w.sample("weir_request_log_dropped_total", "reason=\"write_error\"", s.dropped_write_error);
    w.sample("weir_request_log_dropped_total", "reason=\"shutdown\"", s.dropped_shutdown);
    w.header("weir_request_log_errors_total", "counter",
             "Request-log store errors: failed opens, statements and commits.");
    w.sample("weir_request_log_errors_total", "", s.errors);
    w.header("weir_request_log_deleted_total", "counter", "Rows deleted by retention (max_age, max_rows).");
    w.sample("weir_request_log_deleted_total", "", s.deleted);
    w.header("weir_request_log_queued", "gauge", "Request records waiting in the workers' queues.");
    w.sample("weir_request_log_queued", "", static_cast<double>(s.queued));
    w.header("weir_request_log_open", "gauge", "1 while the request-log store is open for writing.");
    w.sample("weir_request_log_open", "", static_cast<double>(s.open));
  }
  if (shared.redis_limiter) {
    // Shared limits: the state of the Redis leases (atomics, safe to read here).
    const auto s = shared.redis_limiter->stats();
    core::PromWriter w(out);
    w.header("weir_redis_degraded", "gauge", "1 while Redis is unreachable and limits follow redis.fail_open.");
    w.sample("weir_redis_degraded", "", static_cast<double>(s.degraded));
    w.header("weir_redis_outages_total", "counter", "Times Redis became unreachable.");
    w.sample("weir_redis_outages_total", "", s.outages);
    w.header("weir_redis_syncs_total", "counter", "Lease sync round trips to Redis that succeeded.");
    w.sample("weir_redis_syncs_total", "", s.syncs);
    w.header("weir_redis_sync_failures_total", "counter", "Lease sync round trips that failed.");
    w.sample("weir_redis_sync_failures_total", "", s.sync_failures);
    w.header("weir_redis_refills_total", "counter", "Requests that waited once for a lease refill.");
    w.sample("weir_redis_refills_total", "", s.refills);
    w.header("weir_redis_fallback_takes_total", "counter",
             "Admission decisions made by the local fallback during an outage.");
    w.sample("weir_redis_fallback_takes_total", "", s.fallback_takes);
  }
  if (shared.redis_keys) {
    // Virtual keys in Redis: lookups of keys no worker had cached (atomics).
    const auto s = shared.redis_keys->stats();
    core::PromWriter w(out);
    w.header("weir_redis_key_lookups_total", "counter",
             "API key lookups in Redis by answer (found; refused = unknown, revoked or invalid; unavailable).");
    w.sample("weir_redis_key_lookups_total", "result=\"found\"", s.found);
    w.sample("weir_redis_key_lookups_total", "result=\"refused\"", s.not_found);
    w.sample("weir_redis_key_lookups_total", "result=\"unavailable\"", s.failures);
    w.header("weir_redis_key_commands_total", "counter", "HMGETs sent (lookups of one key in flight share one).");
    w.sample("weir_redis_key_commands_total", "", s.commands);
  }
  core::append_build_info(out);
  core::append_process_metrics(out, core::read_process_stats());
}

}  // namespace weir::gateway
