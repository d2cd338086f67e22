// GET /admin/v1/pools (docs/admin-api.md): every pool and endpoint with its
// health (breaker, probes), load and attempts, sampled on each worker's own
// thread and merged on the control thread.
#include <boost/asio/post.hpp>
#include <boost/json/serialize.hpp>

#include "gateway/admin.hpp"
#include "gateway/admin_handlers.hpp"
#include "gateway/admin_server.hpp"
#include "gateway/metrics.hpp"

namespace weir::gateway {

namespace asio = boost::asio;
namespace json = boost::json;
using admin_detail::json_response;

namespace {

// One worker's view of one endpoint (WorkerPool, read on that worker's thread).
struct EndpointSample {
  std::uint32_t in_flight = 0;
  std::uint32_t idle = 0;
  bool ejected = false;         // open: skipped by pick() now (routing/health.hpp)
  bool half_open = false;       // half-open: only trial requests go there (breaker)
  std::int64_t ejected_ms = 0;  // ... open for this much longer
  bool probe_down = false;      // by the active health probes
  std::uint32_t failed_probes = 0;
  std::uint32_t consecutive_failures = 0;  // openings in a row (the doubling)
  std::uint32_t failed_answers = 0;        // failed answers in a row while closed
};
// One worker's samples, [pool][endpoint] of its configuration generation.
struct PoolSamples {
  std::uint64_t generation = 0;
  std::vector<std::vector<EndpointSample>> pools;
};

PoolSamples sample_pools(Worker& w) {
  auto& gen = *w.generation();
  PoolSamples samples;
  samples.generation = gen.shared->id;
  auto& out = samples.pools;
  out.resize(gen.config().pools.size());
  const auto now = std::chrono::steady_clock::now();
  for (std::uint32_t p = 0; p < out.size(); ++p) {
    auto& pool = gen.pool(p);
    out[p].resize(pool.size());
    for (std::uint32_t i = 0; i < pool.size(); ++i) {
      const auto& e = pool.endpoint(i);
      auto& s = out[p][i];
      s.in_flight = e.in_flight;
      s.idle = static_cast<std::uint32_t>(e.conns.idle());
      const auto state = pool.state(i, now);
      s.ejected = state == routing::HealthState::open;
      s.half_open = state == routing::HealthState::half_open;
      s.ejected_ms =
          s.ejected ? std::chrono::duration_cast<std::chrono::milliseconds>(e.health.open_until() - now).count() : 0;
      s.probe_down = e.health.probe_down();
      s.failed_probes = e.health.failed_probes();
      s.consecutive_failures = e.health.trips();
      s.failed_answers = e.health.failures();
    }
  }
  return samples;
}

std::string_view balance_name(core::Balance b) {
  switch (b) {
    case core::Balance::p2c:
      return "p2c";
    case core::Balance::least_load:
      return "least_load";
    case core::Balance::prefix_affinity:
      return "prefix_affinity";
  }
  return "p2c";
}

}  // namespace

core::Task<AdminResponse> AdminServer::pools(AdminRequest&) {
  // The control thread's generation; a worker's samples count only when it is on the same one (a reload
  // in between: a moment).
  const std::shared_ptr<const Generation> gen = shared_.generation;
  const std::shared_ptr<MetricsShard> totals = co_await collect_metrics(shared_, control_, gen->labels);
  struct Gather {
    Gather(core::Executor ex, std::size_t n) : remaining(n), timer(ex) {}
    std::vector<PoolSamples> samples;
    std::size_t remaining;
    core::Timer timer;
  };
  auto g = std::make_shared<Gather>(control_.get_executor(), shared_.workers.size());
  for (Worker* w : shared_.workers) {
    if (w->stopped()) {  // drained: its loop runs no more (its pools serve nothing now)
      --g->remaining;
      continue;
    }
    asio::post(w->io(), [w, g, this] {
      PoolSamples s = sample_pools(*w);  // on w's own thread
      asio::post(control_, [g, s = std::move(s)]() mutable {
        g->samples.push_back(std::move(s));
        if (--g->remaining == 0) g->timer.cancel();
      });
    });
  }
  if (g->remaining > 0) {
    g->timer.expires_after(std::chrono::seconds(1));
    co_await g->timer.async_wait(core::use_task);
  }
  const core::Config& cfg = *gen->config;
  json::array data;
  for (std::uint32_t p = 0; p < cfg.pools.size(); ++p) {
    const auto& pc = cfg.pools[p];
    json::object po;
    po["object"] = "pool";
    po["name"] = pc.name;
    json::array models;
    for (const auto& m : cfg.models)
      if (m.pool == p) models.emplace_back(m.name);
    po["models"] = std::move(models);
    po["balance"] = balance_name(pc.balance);
    po["health_checks"] = pc.health.enabled;
    std::size_t up = 0;
    json::array eps;
    for (std::uint32_t i = 0; i < pc.endpoints.size(); ++i) {
      EndpointSample sum;
      std::uint32_t ejected_on = 0, half_open_on = 0;
      for (const auto& w : g->samples) {
        const auto& ws = w.pools;
        if (w.generation != gen->id || p >= ws.size() || i >= ws[p].size()) continue;
        const auto& s = ws[p][i];
        sum.in_flight += s.in_flight;
        sum.idle += s.idle;
        ejected_on += s.ejected;
        half_open_on += s.half_open;
        sum.ejected_ms = std::max(sum.ejected_ms, s.ejected_ms);
        sum.probe_down = sum.probe_down || s.probe_down;
        sum.failed_probes = std::max(sum.failed_probes, s.failed_probes);
        sum.consecutive_failures = std::max(sum.consecutive_failures, s.consecutive_failures);
        sum.failed_answers = std::max(sum.failed_answers, s.failed_answers);
      }
      json::object e;
      e["url"] = pc.endpoints[i].display;  // secrets in its query redacted, as in the log and /metrics
      const char* health = sum.probe_down ? "down" : ejected_on > 0 ? "ejected" : "up";
      up += std::string_view(health) == "up";
      e["health"] = health;
      e["ejected_workers"] = ejected_on;
      e["half_open_workers"] = half_open_on;
      e["ejected_ms"] = sum.ejected_ms;
      e["in_flight"] = sum.in_flight;
      e["idle_connections"] = sum.idle;
      e["failed_probes"] = sum.failed_probes;
      e["consecutive_failures"] = sum.consecutive_failures;
      e["failed_answers"] = sum.failed_answers;
      if (p < gen->pools.size() && gen->pools[p].state && i < gen->pools[p].state->loads.size()) {
        const auto l = gen->pools[p].state->loads.read(i);
        if (l.seq != 0) {
          json::object lo;
          lo["running"] = l.running;
          lo["waiting"] = l.waiting;
          lo["kv_cache_usage"] = static_cast<double>(l.kv_permille) / 1000.0;
          e["load"] = std::move(lo);
        } else {
          e["load"] = nullptr;
        }
      } else {
        e["load"] = nullptr;
      }
      const std::size_t slot = gen->labels->endpoint_slot(p, i);
      e["attempts"] = totals->attempts_at(slot);
      json::object failures;
      for (auto f : {http::UpstreamFailure::connect_refused, http::UpstreamFailure::connect_timeout,
                     http::UpstreamFailure::timeout, http::UpstreamFailure::reset, http::UpstreamFailure::protocol,
                     http::UpstreamFailure::tls, http::UpstreamFailure::status, http::UpstreamFailure::local_resources})
        failures[http::to_string(f)] = totals->upstream_failures_at(slot, f);
      e["failures"] = std::move(failures);
      eps.emplace_back(std::move(e));
    }
    po["healthy_endpoints"] = up;
    po["endpoints"] = std::move(eps);
    data.emplace_back(std::move(po));
  }
  json::object o;
  o["object"] = "list";
  o["data"] = std::move(data);
  o["workers"] = shared_.workers.size();
  co_return json_response(200, o);
}

}  // namespace weir::gateway
