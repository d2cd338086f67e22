#include "routing/pool.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>

#include "core/note.hpp"
#include "routing/least_load.hpp"
#include "routing/p2c.hpp"
#include "routing/prefix_affinity.hpp"
#include "routing/session_affinity.hpp"

namespace weir::routing {

SharedPoolState::SharedPoolState(const core::PoolConfig& cfg, std::uint32_t workers)
    : loads(static_cast<std::uint32_t>(cfg.endpoints.size())),
      policy(HealthPolicy::of(cfg)),
      health(static_cast<std::uint32_t>(cfg.endpoints.size()), workers),
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
  weir::core::note("weir: pool {} endpoint {}: TLS connect failed: {}\n", pool, e.cfg->display, reason);
}

WorkerPool::WorkerPool(const core::PoolConfig& cfg, const std::vector<http::tcp::endpoint>& addrs,
                       SharedPoolState* shared, std::uint32_t worker, std::shared_ptr<const void> keep)
    : cfg_(&cfg),
      policy_(HealthPolicy::of(cfg)),
      worker_(worker),
      ttft_(cfg.outlier.ttft_factor > 0
                ? std::make_unique<TtftOutliers>(static_cast<std::uint32_t>(cfg.endpoints.size()),
                                                 cfg.outlier.ttft_factor, cfg.outlier.ttft_min_samples)
                : nullptr),
      queue_(cfg.queue.enabled ? std::make_unique<PoolQueue>(cfg.queue) : nullptr),
      shared_(shared),
      keep_(std::move(keep)) {
  endpoints_.reserve(cfg.endpoints.size());
  for (std::size_t i = 0; i < cfg.endpoints.size(); ++i) {
    endpoints_.push_back(EndpointState{
        .cfg = &cfg.endpoints[i],
        .addr = addrs.at(i),
        .addresses = shared && i < shared->addresses.size() ? std::span<const http::tcp::endpoint>(shared->addresses[i])
                                                            : std::span<const http::tcp::endpoint>(),
        .conns = http::ConnectionPool(cfg.max_idle_per_endpoint, cfg.idle_keepalive),
        .tls = tls_target(cfg, cfg.endpoints[i], shared ? shared->tls.get() : nullptr),
    });
    seeds_.push_back(endpoint_seed(cfg.endpoints[i]));
  }
  scratch_.reserve(endpoints_.size());
  candidates_.reserve(endpoints_.size());
}

std::uint32_t WorkerPool::load(std::uint32_t i, bool* scraped) {
  auto& e = endpoints_[i];
  const LoadSnapshot s = shared_ ? shared_->loads.read(i) : LoadSnapshot{};
  if (scraped) *scraped = s.seq != 0;
  if (s.seq == 0) return e.in_flight;
  see_scrape(i, s);
  return load_of(s.running + s.waiting,
                 static_cast<std::int64_t>(e.in_flight) - static_cast<std::int64_t>(e.in_flight_at_scrape));
}

std::uint32_t WorkerPool::pick_by_policy(Clock::time_point now, Rng& rng, const PickRequest& req) {
  candidates_.clear();
  bool all_scraped = true;
  for (const auto i : scratch_) {
    Candidate c{.endpoint = i, .in_flight = endpoints_[i].in_flight};
    c.load = load(i, &c.scraped);
    all_scraped &= c.scraped;
    candidates_.push_back(c);
  }
  if (!all_scraped) compare_in_flight(candidates_);
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

std::uint32_t WorkerPool::pick_excluding(Clock::time_point now, Rng& rng, const EndpointSet& excluded,
                                         const PickRequest& req, const EndpointSet& never) {
  const auto n = size();
  last_rule_ = PickRule::p2c;
  if (n == 1) return !policy_.breaker() || endpoints_[0].health.available(now, policy_) ? 0 : npos;
  bool any_left = false;
  for (std::uint32_t i = 0; i < n && !any_left; ++i) any_left = !excluded.contains(i);
  // Every one excluded: as if none were.
  auto is_excluded = [&](std::uint32_t i) { return any_left && excluded.contains(i); };
  scratch_.clear();
  for (std::uint32_t i = 0; i < n; ++i)
    if (!is_excluded(i) && endpoints_[i].health.available(now, policy_)) scratch_.push_back(i);
  if (scratch_.empty() && policy_.breaker()) {
    // A breaker never sends to an open endpoint: one this request tried
    // already, if available, else none (the pool is unavailable).
    for (std::uint32_t i = 0; i < n; ++i)
      if (endpoints_[i].health.available(now, policy_)) scratch_.push_back(i);
    if (scratch_.empty()) return npos;
  }
  if (scratch_.empty()) {
    // Every endpoint not tried yet is ejected: one this request tried already that is available (a 503 is
    // worth another try after the backoff; a dead endpoint is not) before any ejected one.
    for (std::uint32_t i = 0; i < n; ++i)
      if (!never.contains(i) && endpoints_[i].health.available(now, policy_)) scratch_.push_back(i);
  }
  if (scratch_.empty()) {
    // Every endpoint is ejected: try the one whose ejection ends first.
    std::uint32_t best = npos;
    for (std::uint32_t i = 0; i < n; ++i)
      if (!is_excluded(i) && (best == npos || endpoints_[i].health.open_until() < endpoints_[best].health.open_until()))
        best = i;
    return best;
  }
  if (cfg_->balance != core::Balance::p2c || (!req.session.empty() && !cfg_->session_header.empty()))
    return pick_by_policy(now, rng, req);
  if (scratch_.size() == 1) return scratch_[0];
  return p2c_pick(scratch_, rng, [this](std::uint32_t i) { return endpoints_[i].in_flight; });
}

void WorkerPool::after(std::uint32_t i, Transition t, bool drop_conns) {
  auto& e = endpoints_[i];
  if (t == Transition::opened) {
    ++e.opened[static_cast<std::size_t>(e.health.cause())];
    if (ttft_) ttft_->clear(i);  // judged afresh when it is back
    if (drop_conns) e.conns.clear();
  } else if (t == Transition::closed) {
    ++e.recovered;
  }
  if (t != Transition::none && on_transition_) on_transition_(i, t, e.health.cause());
  if (!shared_) return;
  // Only a change is written: the cells of one endpoint's workers share a
  // cache line, and a write per request would bounce it between them.
  const std::uint64_t v = HealthBoard::pack(e.health);
  if (v == e.published) return;
  e.published = v;
  shared_->health.publish(i, worker_, e.health);
}

std::uint32_t WorkerPool::open_count(Clock::time_point now) const {
  std::uint32_t n = 0;
  for (const auto& e : endpoints_) n += e.health.state(now, policy_) == HealthState::open ? 1u : 0u;
  return n;
}

bool WorkerPool::may_eject(std::uint32_t i, Clock::time_point now) const {
  // Never beyond max_ejected_percent of the pool (Envoy's cap): a pool whose
  // endpoints all fail keeps serving from them.
  if (endpoints_[i].health.state(now, policy_) == HealthState::open) return false;
  const std::uint64_t ejected = open_count(now) + 1;
  return ejected * 100 <= std::uint64_t{cfg_->outlier.max_ejected_percent} * size();
}

void WorkerPool::report_connect_failure(std::uint32_t i, Clock::time_point now, bool trial) {
  auto& h = endpoints_[i].health;
  if (trial) h.end_trial();
  after(i, h.on_connect_failure(now, policy_), /*drop_conns=*/true);
  // Its idle connections go whether it was open already or not (the server is gone).
  endpoints_[i].conns.clear();
}

void WorkerPool::report_success(std::uint32_t i) { after(i, endpoints_[i].health.on_connected(policy_)); }

bool WorkerPool::report_answer(std::uint32_t i, bool failed, Clock::time_point now, bool trial, Clock::time_point sent,
                               bool capped) {
  auto& h = endpoints_[i].health;
  // With a breaker a failing endpoint opens whatever the share of the pool
  // (a pool that all fails is unavailable); without, within the cap; a
  // capped failure (a 429) within the cap either way.
  const bool may_open = failed && ((policy_.breaker() && !capped) || may_eject(i, now));
  const Transition t = h.on_answer(failed, trial, now, policy_, may_open, sent);
  after(i, t);
  return t == Transition::opened;
}

bool WorkerPool::report_ttft(std::uint32_t i, std::uint32_t ttft_us, Clock::time_point now) {
  if (!ttft_) return false;
  // Judged once every endpoint in use has its samples (the pool's norm is all of them).
  const std::uint32_t in_use = size() - open_count(now);
  if (!ttft_->add(i, ttft_us, in_use) || !may_eject(i, now)) return false;
  const Transition t = endpoints_[i].health.open(now, policy_, OpenCause::ttft);
  after(i, t);
  return t == Transition::opened;
}

bool WorkerPool::report_probe(std::uint32_t i, bool ok, Clock::time_point now) {
  const auto& hc = cfg_->health;
  // Held past the next probe, so no pick slips in between.
  const bool was_down = endpoints_[i].health.probe_down();
  const Transition t = endpoints_[i].health.on_probe(ok, now, now + hc.interval + hc.timeout + hc.timeout, policy_);
  after(i, t, /*drop_conns=*/true);
  // The probes' verdict, whatever the breaker makes of it (with a breaker, a
  // recovered probe half-opens it: its trial's close is the recovery).
  return endpoints_[i].health.probe_down() != was_down;
}

bool WorkerPool::any_available(Clock::time_point now) const {
  for (const auto& e : endpoints_)
    if (e.health.available(now, policy_)) return true;
  return false;
}

WorkerPool::Clock::duration WorkerPool::unavailable_for(Clock::time_point now) const {
  auto best = Clock::duration::max();
  for (const auto& e : endpoints_) {
    if (e.health.available(now, policy_)) return Clock::duration::zero();
    // Half-open with every trial slot taken: a trial answers soon.
    const auto until = e.health.open_until() > now ? e.health.open_until() - now : Clock::duration::zero();
    best = std::min(best, until);
  }
  return best == Clock::duration::max() ? Clock::duration::zero() : best;
}

bool endpoint_saturated(const LoadSnapshot& s, const core::QueueConfig& qc) {
  const auto kv_limit = static_cast<std::uint32_t>(std::lround(qc.saturation_kv_cache * 1000));
  return s.waiting >= qc.saturation_waiting || s.kv_permille >= kv_limit;
}

void WorkerPool::see_scrape(std::uint32_t i, const LoadSnapshot& s) {
  auto& e = endpoints_[i];
  if (s.seq == e.scrape_seq) return;
  // A new scrape: it counts what was in flight until now.
  e.scrape_seq = s.seq;
  e.in_flight_at_scrape = e.in_flight;
  // The batch capacity follows the server: while requests wait, what runs
  // is all it takes now (it can shrink, e.g. under KV-cache pressure); once
  // nothing waits, more running than that means it grew (a restart with a
  // larger max_num_seqs, freed KV cache), by how much is unknown: the gate
  // let only `waiting` more through, so it probes at twice what runs (as
  // TCP's slow start does), and the next scrape with requests waiting sets
  // it back to what runs. Never only a maximum: a capacity learned once and
  // never lowered or raised sheds for as long as it is off.
  if (s.waiting > 0)
    e.capacity_seen = s.running;
  else if (e.capacity_seen > 0 && s.running > e.capacity_seen)
    e.capacity_seen = std::min<std::uint32_t>(2 * s.running, 0xfffff);
}

void WorkerPool::observe_scrapes() {
  if (!shared_ || !cfg_->queue.saturation) return;
  for (std::uint32_t i = 0; i < size(); ++i) {
    const LoadSnapshot s = shared_->loads.read(i);
    if (s.seq != 0) see_scrape(i, s);
  }
}

std::uint32_t WorkerPool::estimated_waiting(std::uint32_t i, const LoadSnapshot& s) {
  see_scrape(i, s);
  const auto& e = endpoints_[i];
  const std::int64_t delta = static_cast<std::int64_t>(e.in_flight) - static_cast<std::int64_t>(e.in_flight_at_scrape);
  if (e.capacity_seen > 0) {
    const std::uint32_t load = load_of(s.running + s.waiting, delta);
    return load > e.capacity_seen ? load - e.capacity_seen : 0;
  }
  return s.waiting > 0 ? load_of(s.waiting, delta) : 0;
}

std::uint32_t WorkerPool::room(Clock::time_point now) {
  if (!shared_ || !cfg_->queue.saturation) return kUnlimited;
  const auto kv_limit = static_cast<std::uint32_t>(std::lround(cfg_->queue.saturation_kv_cache * 1000));
  const std::uint32_t full = cfg_->queue.saturation_waiting;
  std::uint64_t room = 0;
  bool any = false;
  for (std::uint32_t i = 0; i < size(); ++i) {
    if (!endpoints_[i].health.available(now, policy_)) continue;
    const LoadSnapshot s = shared_->loads.read(i);
    // No scrape (never, or the last one failed): counts as free (fail open).
    if (s.seq == 0) return kUnlimited;
    any = true;
    const std::uint32_t waiting = estimated_waiting(i, s);
    if (s.kv_permille < kv_limit && waiting < full) room += full - waiting;
  }
  if (!any) return kUnlimited;
  // Those let out and not started yet will take their places.
  room = room > let_out_ ? room - let_out_ : 0;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(room, kUnlimited - 1));
}

std::uint32_t WorkerPool::dispatch_queue(Clock::time_point now) {
  if (!queue_) return 0;
  // Every scrape is seen, not only those a request's arrival looks at: a
  // burst let through between two scrapes (nothing then arrives) still
  // teaches the gate the capacity the next scrape shows.
  observe_scrapes();
  if (queue_->waiting() == 0) return 0;
  // At most the room there is: the requests let out start on an endpoint
  // only when they resume, so the estimate does not see them yet.
  std::uint32_t left = room(now);
  std::uint32_t n = 0;
  while (auto* w = queue_->admit_next(left == 0)) {
    ++n;
    if (left != kUnlimited) {
      --left;
      ++let_out_;
      w->holds_room = true;
    }
  }
  return n;
}

void WorkerPool::carry_from(WorkerPool& old) {
  for (std::uint32_t i = 0; i < size(); ++i) {
    auto& e = endpoints_[i];
    for (std::uint32_t j = 0; j < old.size(); ++j) {
      auto& o = old.endpoints_[j];
      // (The same server: the same URL at the same address, or at another of the host's addresses the old
      // pool moved to, connect_endpoint.)
      const bool same_addr =
          o.addr == e.addr || std::find(e.addresses.begin(), e.addresses.end(), o.addr) != e.addresses.end();
      if (o.cfg->url != e.cfg->url || !same_addr) continue;
      e.addr = o.addr;
      // Its machine goes on under this pool's rules (an open period keeps its
      // end); trial slots stay with `old`, whose requests give them back there.
      // Without probes now, a probe's verdict is forgotten (no probe would
      // clear it); an opening it caused ends by time.
      e.health.carry(o.health, cfg_->health.enabled);
      e.opened = o.opened;
      e.recovered = o.recovered;
      if (ttft_ && old.ttft_) ttft_->adopt(i, *old.ttft_, j);
      e.tls_failure_logged = o.tls_failure_logged;
      if (!e.tls.client && !o.tls.client) e.conns.adopt(o.conns);
      after(i, Transition::none);  // publishes it on this pool's board
      break;
    }
  }
}

}  // namespace weir::routing
