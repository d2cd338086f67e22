// A worker's view of one pool: its endpoints, their load and health, and
// their idle upstream connections. Owned by one worker thread; no locks.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "http/io.hpp"
#include "http/upstream.hpp"
#include "routing/balance.hpp"
#include "routing/load.hpp"
#include "routing/prefix_index.hpp"
#include "routing/rng.hpp"

namespace weir::routing {

struct EndpointState {
  const core::EndpointConfig* cfg = nullptr;
  http::tcp::endpoint addr;
  http::ConnectionPool conns;
  http::TlsTarget tls;          // https:// endpoints: the pool's TLS context and the server name; else no client
  std::uint32_t in_flight = 0;  // requests of this worker currently on this endpoint
  std::chrono::steady_clock::time_point ejected_until{};  // skipped by pick() until then
  std::uint32_t consecutive_failures = 0;                 // connect failures in a row
  std::uint32_t failed_answers = 0;                       // outlier detection: failed answers in a row
  std::uint32_t outlier_ejections = 0;                    // outlier ejections in a row (the doubling)
  std::uint32_t failed_probes = 0;                        // active health probes failed in a row
  bool probe_down = false;                                // ejected by the health probes until one succeeds
  std::uint32_t scrape_seq = 0;           // the last /metrics scrape this worker saw (LoadSnapshot::seq)
  std::uint32_t in_flight_at_scrape = 0;  // in_flight when it saw it
  std::chrono::steady_clock::time_point tls_failure_logged{};  // log_tls_failure's rate limit
};

// Logs (stderr) why a TLS handshake with endpoint `e` of pool `pool` failed
// (http::UpstreamConnection::tls_error: the verification result or the
// handshake error), at most once per 10 s per endpoint and worker, so a
// pool with a bad certificate does not flood the log.
void log_tls_failure(EndpointState& e, std::string_view pool, std::string_view reason,
                     std::chrono::steady_clock::time_point now);

// What the workers of one process share about one pool: the endpoints'
// scraped load (written by the LoadScraper on the control thread) and, for
// balance: prefix_affinity, the prefix index. Built before the workers, kept
// until they are gone; read and written without locks (load.hpp, prefix_index.hpp).
struct SharedPoolState {
  explicit SharedPoolState(const core::PoolConfig& cfg);
  LoadBoard loads;
  std::unique_ptr<PrefixIndex> prefixes;  // null unless balance is prefix_affinity
  // The TLS client context of the pool's https:// endpoints (set by the
  // server at start-up, http::TlsClient::make); null when none is https://.
  std::shared_ptr<http::TlsClient> tls;
};

// The TLS target of endpoint `e` of pool `cfg` with context `client`: the
// pool's tls.server_name, else the endpoint's host. No client for http://.
http::TlsTarget tls_target(const core::PoolConfig& cfg, const core::EndpointConfig& e, http::TlsClient* client);

class WorkerPool {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::uint32_t npos = 0xffffffffu;

  // `addrs[i]` is the resolved address of cfg.endpoints[i]. `shared` (may be
  // null: then every endpoint's load is its in-flight count, and
  // prefix_affinity has no index and balances on load alone, and https://
  // endpoints have no TLS context: tests only) outlives the pool. `keep`
  // holds what `cfg` and `shared` live in (a configuration generation's
  // pool) for as long as the pool exists; empty: they outlive it.
  WorkerPool(const core::PoolConfig& cfg, const std::vector<http::tcp::endpoint>& addrs,
             SharedPoolState* shared = nullptr, std::shared_ptr<const void> keep = {});

  const core::PoolConfig& config() const { return *cfg_; }
  std::uint32_t size() const { return static_cast<std::uint32_t>(endpoints_.size()); }
  EndpointState& endpoint(std::uint32_t i) { return endpoints_[i]; }

  // The endpoint for a request, among those that are not ejected (all of
  // them if every one is ejected: the one whose ejection ends first), never
  // `exclude` when another exists, chosen by the pool's policy (balance.hpp):
  // p2c on in-flight requests, least_load, or prefix_affinity on `req`'s
  // prompt; a `req.session` with session_header set goes by session
  // affinity first. prefix_affinity records the choice in the prefix index.
  // O(n) in the endpoints (p2c: O(1) for ≤ 2), plus for prefix_affinity
  // O(prompt bytes) hashing (at most max_blocks * block_bytes).
  std::uint32_t pick(Clock::time_point now, Rng& rng, std::uint32_t exclude = npos, const PickRequest& req = {}) {
    return pick_excluding(now, rng, exclude < 64 ? (std::uint64_t{1} << exclude) : 0, req);
  }
  // The same over the endpoints whose bit is clear in `excluded` (bit i =
  // endpoint i; endpoints from 64 on are never excluded); when every one is
  // excluded, as pick(now, rng).
  std::uint32_t pick_excluding(Clock::time_point now, Rng& rng, std::uint64_t excluded, const PickRequest& req = {});

  // Endpoint `i`'s load as the load-aware policies see it (balance.hpp's
  // load_of): from the latest scrape plus this worker's in-flight change
  // since, else in-flight. `scraped` tells which.
  std::uint32_t load(std::uint32_t i, bool* scraped = nullptr);
  // The rule of the last pick (PickRule::p2c also when every endpoint was ejected or the pool has one).
  PickRule last_rule() const { return last_rule_; }
  // The shared state (null when none was given).
  SharedPoolState* shared() { return shared_; }

  // Connect refused or timed out: eject for cfg.eject_for, doubling per
  // consecutive failure up to 16×.
  void report_connect_failure(std::uint32_t i, Clock::time_point now);
  void report_success(std::uint32_t i);
  // An answer from endpoint `i` (outlier detection, cfg.outlier): `failed`
  // for a 5xx status or a reset/timeout before the head. Returns true when
  // this ejected the endpoint. A good answer clears the count.
  bool report_answer(std::uint32_t i, bool failed, Clock::time_point now);
  // An active health probe of endpoint `i` (cfg.health) ended. After
  // cfg.health.unhealthy_after failures in a row the endpoint is ejected
  // until a probe succeeds (re-ejected at each failed probe); returns true
  // when this probe changed it between up and down.
  bool report_probe(std::uint32_t i, bool ok, Clock::time_point now);

  // A configuration reload replaced `old` (a pool of the same name) by this
  // one: each endpoint of this pool that `old` has too (same URL and
  // address) takes its health and ejection state and, over plain HTTP, its
  // idle connections (a TLS connection was made with the old pool's
  // context, which may trust other CAs, and is left to close). In-flight
  // counts stay with `old`: its requests end there.
  void carry_from(WorkerPool& old);

  // A request starts / ends on endpoint `i`: the in-flight count pick() balances on.
  void on_start(std::uint32_t i) {
    ++endpoints_[i].in_flight;
    ++in_flight_;
  }
  void on_finish(std::uint32_t i) {
    --endpoints_[i].in_flight;
    --in_flight_;
  }
  // Requests of this worker in flight on the pool's endpoints.
  std::uint32_t in_flight() const { return in_flight_; }

  // The retry budget (routing::Attempts): requests of this worker that are
  // retrying on this pool now.
  std::uint32_t retries_in_flight() const { return retrying_; }
  void retry_begin() { ++retrying_; }
  void retry_end() { --retrying_; }

 private:
  const core::PoolConfig* cfg_;
  std::vector<EndpointState> endpoints_;
  // The non-p2c policies (and sessions) over the healthy endpoints in scratch_.
  std::uint32_t pick_by_policy(Clock::time_point now, Rng& rng, const PickRequest& req);

  SharedPoolState* shared_;
  PickRule last_rule_ = PickRule::p2c;
  std::vector<std::uint32_t> scratch_;  // healthy candidates, reused
  std::vector<Candidate> candidates_;   // the same with their loads (non-p2c policies), reused
  std::vector<std::uint64_t> seeds_;    // session rendezvous seed per endpoint: endpoint_seed(host:port)
  std::uint32_t in_flight_ = 0;
  std::uint32_t retrying_ = 0;
  std::shared_ptr<const void> keep_;
};

}  // namespace weir::routing
