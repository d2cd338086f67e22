// A worker's view of one pool: its endpoints, their load and health, and
// their idle upstream connections. Owned by one worker thread; no locks.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "http/io.hpp"
#include "http/upstream.hpp"

namespace weir::routing {

// Small fast PRNG (xorshift64*) per worker, for balancing choices.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed ? seed : 0x9e3779b97f4a7c15ull) {}
  std::uint64_t next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545F4914F6CDD1Dull;
  }
  // Uniform in [0, n), n > 0.
  std::uint32_t below(std::uint32_t n) { return static_cast<std::uint32_t>((next() >> 32) * n >> 32); }

 private:
  std::uint64_t s_;
};

struct EndpointState {
  const core::EndpointConfig* cfg = nullptr;
  http::tcp::endpoint addr;
  http::ConnectionPool conns;
  std::uint32_t in_flight = 0;                            // requests of this worker currently on this endpoint
  std::chrono::steady_clock::time_point ejected_until{};  // skipped by pick() until then
  std::uint32_t consecutive_failures = 0;                 // connect failures in a row
  std::uint32_t failed_answers = 0;                       // outlier detection: failed answers in a row
  std::uint32_t outlier_ejections = 0;                    // outlier ejections in a row (the doubling)
  std::uint32_t failed_probes = 0;                        // active health probes failed in a row
  bool probe_down = false;                                // ejected by the health probes until one succeeds
};

class WorkerPool {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::uint32_t npos = 0xffffffffu;

  // `addrs[i]` is the resolved address of cfg.endpoints[i].
  WorkerPool(const core::PoolConfig& cfg, const std::vector<http::tcp::endpoint>& addrs);

  const core::PoolConfig& config() const { return *cfg_; }
  std::uint32_t size() const { return static_cast<std::uint32_t>(endpoints_.size()); }
  EndpointState& endpoint(std::uint32_t i) { return endpoints_[i]; }

  // Power of two choices on in-flight requests among endpoints that are not
  // ejected (all of them if every one is ejected), never `exclude` when
  // another exists. O(1) for ≤ 2 healthy endpoints, O(n) scan otherwise.
  std::uint32_t pick(Clock::time_point now, Rng& rng, std::uint32_t exclude = npos) {
    return pick_excluding(now, rng, exclude < 64 ? (std::uint64_t{1} << exclude) : 0);
  }
  // The same over the endpoints whose bit is clear in `excluded` (bit i =
  // endpoint i; endpoints from 64 on are never excluded); when every one is
  // excluded, as pick(now, rng).
  std::uint32_t pick_excluding(Clock::time_point now, Rng& rng, std::uint64_t excluded);

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
  std::vector<std::uint32_t> scratch_;  // healthy candidates, reused
  std::uint32_t in_flight_ = 0;
  std::uint32_t retrying_ = 0;
};

}  // namespace weir::routing
