#include "routing/pool.hpp"

#include <algorithm>

namespace weir::routing {

WorkerPool::WorkerPool(const core::PoolConfig& cfg, const std::vector<http::tcp::endpoint>& addrs) : cfg_(&cfg) {
  endpoints_.reserve(cfg.endpoints.size());
  for (std::size_t i = 0; i < cfg.endpoints.size(); ++i) {
    endpoints_.push_back(EndpointState{
        .cfg = &cfg.endpoints[i],
        .addr = addrs.at(i),
        .conns = http::ConnectionPool(cfg.max_idle_per_endpoint, cfg.idle_keepalive),
    });
  }
  scratch_.reserve(endpoints_.size());
}

std::uint32_t WorkerPool::pick_excluding(Clock::time_point now, Rng& rng, std::uint64_t excluded) {
  const auto n = size();
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
  if (scratch_.size() == 1) return scratch_[0];
  const auto m = static_cast<std::uint32_t>(scratch_.size());
  const std::uint32_t a = rng.below(m);
  std::uint32_t b = rng.below(m - 1);
  if (b >= a) ++b;
  const auto ia = scratch_[a], ib = scratch_[b];
  return endpoints_[ib].in_flight < endpoints_[ia].in_flight ? ib : ia;
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

void WorkerPool::report_success(std::uint32_t i) {
  auto& e = endpoints_[i];
  e.consecutive_failures = 0;
  if (!e.probe_down) e.ejected_until = {};  // the health probes clear their own ejection
}

}  // namespace weir::routing
