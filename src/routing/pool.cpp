#include "routing/pool.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "routing/least_load.hpp"
#include "routing/p2c.hpp"
#include "routing/prefix_affinity.hpp"
#include "routing/session_affinity.hpp"

namespace weir::routing {

SharedPoolState::SharedPoolState(const core::PoolConfig& cfg)
    : loads(static_cast<std::uint32_t>(cfg.endpoints.size())),
      prefixes(cfg.balance == core::Balance::prefix_affinity
                   ? std::make_unique<PrefixIndex>(cfg.prefix_affinity.index_entries)
                   : nullptr) {}

http::TlsTarget tls_target(const core::PoolConfig& cfg, const core::EndpointConfig& e, http::TlsClient* client) {
  if (!e.tls || !client) return {};
  return {.client = client, .server_name = cfg.tls.server_name.empty() ? e.host : cfg.tls.server_name};
}

void log_tls_failure(EndpointState& e, std::string_view pool, std::string_view reason,
                     std::chrono::steady_clock::time_point now) {
  if (e.tls_failure_logged != std::chrono::steady_clock::time_point{} &&
      now - e.tls_failure_logged < std::chrono::seconds(10))
    return;
  e.tls_failure_logged = now;
  fmt::print(stderr, "weir: pool {} endpoint {}: TLS connect failed: {}\n", pool, e.cfg->display, reason);
}

WorkerPool::WorkerPool(const core::PoolConfig& cfg, const std::vector<http::tcp::endpoint>& addrs,
                       SharedPoolState* shared, std::shared_ptr<const void> keep)
    : cfg_(&cfg), shared_(shared), keep_(std::move(keep)) {
  endpoints_.reserve(cfg.endpoints.size());
  for (std::size_t i = 0; i < cfg.endpoints.size(); ++i) {
    endpoints_.push_back(EndpointState{
        .cfg = &cfg.endpoints[i],
        .addr = addrs.at(i),
        .conns = http::ConnectionPool(cfg.max_idle_per_endpoint, cfg.idle_keepalive),
        .tls = tls_target(cfg, cfg.endpoints[i], shared ? shared->tls.get() : nullptr),
    });
    seeds_.push_back(endpoint_seed(cfg.endpoints[i].host_header));
  }
  scratch_.reserve(endpoints_.size());
  candidates_.reserve(endpoints_.size());
}

std::uint32_t WorkerPool::load(std::uint32_t i, bool* scraped) {
  auto& e = endpoints_[i];
  const LoadSnapshot s = shared_ ? shared_->loads.read(i) : LoadSnapshot{};
  if (scraped) *scraped = s.seq != 0;
  if (s.seq == 0) return e.in_flight;
  if (s.seq != e.scrape_seq) {
    // A new scrape: it counts what was in flight until now.
    e.scrape_seq = s.seq;
    e.in_flight_at_scrape = e.in_flight;
  }
  return load_of(s.running + s.waiting,
                 static_cast<std::int64_t>(e.in_flight) - static_cast<std::int64_t>(e.in_flight_at_scrape));
}

std::uint32_t WorkerPool::pick_by_policy(Clock::time_point now, Rng& rng, const PickRequest& req) {
  candidates_.clear();
  for (const auto i : scratch_) {
    Candidate c{.endpoint = i, .in_flight = endpoints_[i].in_flight};
    c.load = load(i, &c.scraped);
    candidates_.push_back(c);
  }
  const std::span<const Candidate> c(candidates_);
  PrefixIndex* index = shared_ ? shared_->prefixes.get() : nullptr;
  std::array<std::uint64_t, 4096> hashes;  // PrefixAffinityConfig::max_blocks ≤ 4096
  std::uint32_t nh = 0;
  if (cfg_->balance == core::Balance::prefix_affinity && index && !req.prompt.empty())
    nh = prefix_block_hashes(req.model, req.prompt, cfg_->prefix_affinity.block_bytes,
                             std::span<std::uint64_t>(hashes.data(), cfg_->prefix_affinity.max_blocks));
  std::uint32_t k;
  if (!req.session.empty() && !cfg_->session_header.empty()) {
    k = session_pick(c, req.session, seeds_, cfg_->imbalance);
    last_rule_ = PickRule::session;
  } else if (cfg_->balance == core::Balance::prefix_affinity && index) {
    const auto p = prefix_affinity_pick(c, std::span<const std::uint64_t>(hashes.data(), nh), *index, *cfg_, rng);
    k = p.candidate;
    last_rule_ = p.rule == PrefixRule::match   ? PickRule::prefix_match
                 : p.rule == PrefixRule::guard ? PickRule::prefix_guard
                                               : PickRule::prefix_miss;
  } else {
    k = least_load_pick(c, rng);
    last_rule_ = PickRule::least_load;
  }
  const std::uint32_t chosen = c[k].endpoint;
  if (nh > 0) index->insert(std::span<const std::uint64_t>(hashes.data(), nh), chosen, now);
  return chosen;
}

std::uint32_t WorkerPool::pick_excluding(Clock::time_point now, Rng& rng, std::uint64_t excluded,
                                         const PickRequest& req) {
  const auto n = size();
  last_rule_ = PickRule::p2c;
  if (n == 1) return 0;
  auto is_excluded = [&](std::uint32_t i) { return i < 64 && ((excluded >> i) & 1u); };
  bool any_left = false;
  for (std::uint32_t i = 0; i < n && !any_left; ++i) any_left = !is_excluded(i);
  if (!any_left) excluded = 0;
  scratch_.clear();
  for (std::uint32_t i = 0; i < n; ++i)
    if (!is_excluded(i) && endpoints_[i].ejected_until <= now) scratch_.push_back(i);
  if (scratch_.empty()) {
    // Every endpoint left is ejected: try the one whose ejection ends first.
    std::uint32_t best = npos;
    for (std::uint32_t i = 0; i < n; ++i)
      if (!is_excluded(i) && (best == npos || endpoints_[i].ejected_until < endpoints_[best].ejected_until)) best = i;
    return best;
  }
  if (cfg_->balance != core::Balance::p2c || (!req.session.empty() && !cfg_->session_header.empty()))
    return pick_by_policy(now, rng, req);
  if (scratch_.size() == 1) return scratch_[0];
  return p2c_pick(scratch_, rng, [this](std::uint32_t i) { return endpoints_[i].in_flight; });
}

void WorkerPool::report_connect_failure(std::uint32_t i, Clock::time_point now) {
  auto& e = endpoints_[i];
  e.consecutive_failures = std::min<std::uint32_t>(e.consecutive_failures + 1, 5);
  e.ejected_until = now + cfg_->eject_for * (1u << (e.consecutive_failures - 1));
  e.conns.clear();
}

bool WorkerPool::report_answer(std::uint32_t i, bool failed, Clock::time_point now) {
  auto& e = endpoints_[i];
  const auto& oc = cfg_->outlier;
  if (!failed) {
    e.failed_answers = 0;
    if (e.ejected_until <= now) e.outlier_ejections = 0;
    return false;
  }
  if (oc.consecutive_failures == 0 || ++e.failed_answers < oc.consecutive_failures) return false;
  e.failed_answers = 0;
  // Never eject beyond max_ejected_percent of the pool (Envoy's cap): a
  // pool whose endpoints all fail keeps serving from them.
  std::uint32_t ejected = 0;
  for (const auto& o : endpoints_) ejected += o.ejected_until > now;
  if (e.ejected_until > now) return false;
  if (std::uint64_t{ejected + 1} * 100 > std::uint64_t{oc.max_ejected_percent} * size()) return false;
  e.outlier_ejections = std::min<std::uint32_t>(e.outlier_ejections + 1, 5);
  e.ejected_until = now + cfg_->eject_for * (1u << (e.outlier_ejections - 1));
  return true;
}

bool WorkerPool::report_probe(std::uint32_t i, bool ok, Clock::time_point now) {
  auto& e = endpoints_[i];
  const auto& hc = cfg_->health;
  if (ok) {
    e.failed_probes = 0;
    if (!e.probe_down) return false;
    e.probe_down = false;
    e.ejected_until = {};
    return true;
  }
  if (++e.failed_probes < hc.unhealthy_after) return false;
  // Ejected until the next probe can clear it (a little past it, so no pick slips in between).
  e.ejected_until = std::max(e.ejected_until, now + hc.interval + hc.timeout + hc.timeout);
  e.conns.clear();
  const bool changed = !e.probe_down;
  e.probe_down = true;
  return changed;
}

void WorkerPool::carry_from(WorkerPool& old) {
  for (auto& e : endpoints_) {
    for (auto& o : old.endpoints_) {
      if (o.cfg->url != e.cfg->url || o.addr != e.addr) continue;
      e.ejected_until = o.ejected_until;
      e.consecutive_failures = o.consecutive_failures;
      e.failed_answers = o.failed_answers;
      e.outlier_ejections = o.outlier_ejections;
      if (cfg_->health.enabled) {  // else no probe would ever clear it
        e.failed_probes = o.failed_probes;
        e.probe_down = o.probe_down;
      }
      e.tls_failure_logged = o.tls_failure_logged;
      if (!e.tls.client && !o.tls.client) e.conns.adopt(o.conns);
      break;
    }
  }
}

void WorkerPool::report_success(std::uint32_t i) {
  auto& e = endpoints_[i];
  e.consecutive_failures = 0;
  if (!e.probe_down) e.ejected_until = {};  // the health probes clear their own ejection
}

}  // namespace weir::routing
