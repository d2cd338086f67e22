// One endpoint's health as one worker sees it: a circuit breaker whose open
// state is every kind of ejection (docs/reliability.md).
//
// One state machine, not two: an endpoint that refused a connection, failed
// answers in a row, answered far slower than its pool (TTFT), or failed its
// health probes is "open" — skipped by picks — for a period that doubles
// with every opening in a row. What differs between the pool without and
// with a `breaker:` section is only what follows the period:
//   - without (HealthPolicy::half_open_trials == 0, Envoy's outlier
//     detection): the endpoint is back in full at once; the doubling is
//     forgotten at its next good answer;
//   - with: it is half-open, and only `half_open_trials` requests at a time
//     go there; the first good answer closes it, a failed one reopens it
//     for twice as long (up to max_open_for).
// Keeping one machine means one place decides "may a request go there now",
// one doubling, one state to merge for /metrics and /ready, and no way for
// an outlier ejection and a breaker to disagree about the same endpoint.
//
// Owned by one worker thread (routing::WorkerPool); no locks, no allocation.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/config.hpp"

namespace weir::routing {

// Why an endpoint was last opened (the label of weir_upstream_ejections_total).
enum class OpenCause : std::uint8_t {
  none,
  connect,   // a connection refused, timed out or failed its TLS handshake
  failures,  // outlier.consecutive_failures failed answers in a row
  ttft,      // a median TTFT far above the pool's (outlier.ttft_factor)
  probe,     // health.unhealthy_after failed probes in a row
  trial,     // a failed answer while half-open (breaker)
  count_,
};
std::string_view open_cause_label(OpenCause c);

// The state a request sees. Half-open exists only with a breaker.
enum class HealthState : std::uint8_t { closed, open, half_open, count_ };
std::string_view health_state_label(HealthState s);

// What an event did to the machine.
enum class Transition : std::uint8_t {
  none,
  opened,  // it became open (it was closed or half-open)
  closed,  // a recovery: an ejected endpoint's first good answer since (half-open with a breaker, its
           // period over without), or a probe found a probe-ejected one healthy (no breaker)
};

// A pool's rules, from its configuration (fixed).
struct HealthPolicy {
  using Clock = std::chrono::steady_clock;
  Clock::duration open_for{std::chrono::seconds(2)};       // the first open period (pools.X.eject_for)
  Clock::duration max_open_for{std::chrono::seconds(32)};  // the doubling's cap
  std::uint32_t failures = 5;                              // failed answers in a row that open it; 0 = never
  std::uint32_t half_open_trials = 0;                      // 0: no half-open state (no breaker)
  std::uint32_t unhealthy_after = 2;                       // failed probes in a row that open it
  bool breaker() const { return half_open_trials > 0; }

  static HealthPolicy of(const core::PoolConfig& pc);
};

class EndpointHealth {
 public:
  using Clock = std::chrono::steady_clock;

  HealthState state(Clock::time_point now, const HealthPolicy& p) const {
    if (!open_) return HealthState::closed;
    if (now < open_until_) return HealthState::open;
    return p.breaker() ? HealthState::half_open : HealthState::closed;
  }
  // May a new request go here at `now`: closed, or half-open with a trial
  // slot free. O(1); the pick's test for every endpoint.
  bool available(Clock::time_point now, const HealthPolicy& p) const {
    return !open_ || (now >= open_until_ && (p.half_open_trials == 0 || trials_ < p.half_open_trials));
  }
  // A request is sent here: when half-open it takes a trial slot, and the
  // caller must give it back through on_answer(..., trial = true) or
  // end_trial(). Returns whether it took one.
  bool begin(Clock::time_point now, const HealthPolicy& p) {
    if (state(now, p) != HealthState::half_open) return false;
    ++trials_;
    return true;
  }
  // A trial ended without an answer to judge (the client left, the request moved on).
  void end_trial() {
    if (trials_ > 0) --trials_;
  }

  // An answer from this endpoint: `failed` for a 5xx status, a reset or
  // timeout before the head, or a stream's first-token timeout. `trial`:
  // the request held a trial slot (begin()). A good answer clears the
  // count of failures and closes a half-open endpoint; a failed one opens
  // a half-open endpoint again (longer), or a closed one at the
  // policy's failures in a row when `may_open` (the pool's cap allows it).
  // An answer to a request sent before the endpoint last opened (`sent`;
  // unknown when default) changes nothing, open or half-open: only a trial
  // or a request sent since decides (docs/reliability.md).
  Transition on_answer(bool failed, bool trial, Clock::time_point now, const HealthPolicy& p, bool may_open,
                       Clock::time_point sent = {});
  // A connection to it could not be opened: open at once (cause connect).
  Transition on_connect_failure(Clock::time_point now, const HealthPolicy& p);
  // A connection to it was opened: without a breaker this ends the period
  // of an ejection for a refused connection (the endpoint is back in use;
  // its first good answer closes it, the recovery); with one the answer decides.
  Transition on_connected(const HealthPolicy& p);
  // Opens it for `cause` (a TTFT outlier); `now + the doubled period`.
  Transition open(Clock::time_point now, const HealthPolicy& p, OpenCause cause);
  // An active probe ended. After p.unhealthy_after failures in a row the
  // endpoint is open until `held_until` (extended by each failed probe:
  // past the next one) and until a probe succeeds; that success makes it
  // half-open (breaker) or closed.
  Transition on_probe(bool ok, Clock::time_point now, Clock::time_point held_until, const HealthPolicy& p);
  // A configuration reload: this endpoint takes over `old`'s machine (the
  // same endpoint in the replaced pool): its open period, doubling and
  // counts in a row, but no trial slot (the requests holding them give them
  // back to `old`). Without `probes` (the pool has no health: section now)
  // the probes' verdict is dropped: no probe would ever clear it (an
  // opening it caused still ends by time).
  void carry(const EndpointHealth& old, bool probes);

  bool is_open() const { return open_; }  // ejected and no good answer since (its period may have ended)
  Clock::time_point open_until() const { return open_until_; }
  OpenCause cause() const { return cause_; }
  std::uint32_t trips() const { return trips_; }        // openings in a row (the doubling)
  std::uint32_t failures() const { return failures_; }  // failed answers in a row while closed
  std::uint32_t trials() const { return trials_; }      // trial requests in flight
  bool probe_down() const { return probe_down_; }
  std::uint32_t failed_probes() const { return failed_probes_; }  // failed probes in a row

 private:
  Transition reopen(Clock::time_point now, const HealthPolicy& p, OpenCause cause);

  Clock::time_point open_until_{};
  Clock::time_point opened_at_{};  // when it last opened (reopen)
  std::uint32_t failures_ = 0;
  std::uint32_t failed_probes_ = 0;
  std::uint16_t trials_ = 0;
  std::uint8_t trips_ = 0;
  OpenCause cause_ = OpenCause::none;
  bool open_ = false;
  bool probe_down_ = false;
};

// TTFT outlier detection (outlier.ttft_factor) over one pool's endpoints on
// one worker: each endpoint's last kWindow stream TTFTs; an endpoint whose
// median over them is at least `factor` times the pool's median (the lower
// median of the endpoints' medians, once every endpoint in use has
// ttft_min_samples samples: a pool is judged whole, so two slow endpoints
// of three are the norm, not outliers) is an outlier. Allocated only when
// the factor is set.
class TtftOutliers {
 public:
  static constexpr std::uint32_t kWindow = 32;
  TtftOutliers(std::uint32_t endpoints, double factor, std::uint32_t min_samples);
  // Records endpoint `i`'s stream TTFT (request written → first data
  // event, µs). Returns true when `i` is now an outlier, judged once at
  // least max(2, `judged`) endpoints have their samples (the caller passes
  // the endpoints in use). O(kWindow + endpoints).
  bool add(std::uint32_t i, std::uint32_t ttft_us, std::uint32_t judged = 2);
  // Forgets endpoint `i`'s samples (it was ejected: it is judged afresh when back).
  void clear(std::uint32_t i);
  // A configuration reload: endpoint `i` takes endpoint `j`'s samples of
  // `old` (the same endpoint in the replaced pool), judged by this one's min_samples.
  void adopt(std::uint32_t i, const TtftOutliers& old, std::uint32_t j);
  // Endpoint `i`'s median over its window, 0 below min_samples.
  std::uint32_t median_us(std::uint32_t i) const { return i < windows_.size() ? windows_[i].median : 0; }

 private:
  struct Window {
    std::array<std::uint32_t, kWindow> us{};
    std::uint32_t count = 0;   // samples held, ≤ kWindow
    std::uint32_t next = 0;    // where the next goes
    std::uint32_t median = 0;  // of the samples held, once count ≥ min_samples; else 0
  };
  // Sets w.median from its samples (0 below min_samples_).
  void update_median(Window& w) const;
  std::vector<Window> windows_;
  std::vector<std::uint32_t> medians_;  // scratch for the pool's median, reused
  double factor_;
  std::uint32_t min_samples_;
};

// Every worker's view of one pool's endpoints, for /metrics and /ready on
// any thread: one 64-bit cell per (endpoint, worker), written by that worker
// when its view changes (never per request otherwise), read with relaxed
// loads. Half-open is derived by the reader from the time.
class HealthBoard {
 public:
  using Clock = std::chrono::steady_clock;
  HealthBoard(std::uint32_t endpoints, std::uint32_t workers);
  std::uint32_t endpoints() const { return endpoints_; }
  std::uint32_t workers() const { return workers_; }
  // Writer (worker `worker` only): its view of endpoint `endpoint` is `h`.
  void publish(std::uint32_t endpoint, std::uint32_t worker, const EndpointHealth& h);
  // Any thread: worker `worker`'s view of endpoint `endpoint` at `now`.
  HealthState state(std::uint32_t endpoint, std::uint32_t worker, Clock::time_point now, const HealthPolicy& p) const;
  // The cause of that view's last opening (none while closed).
  OpenCause cause(std::uint32_t endpoint, std::uint32_t worker) const;
  // Any thread: some worker may send a request to endpoint `endpoint` now (closed or half-open there).
  bool available(std::uint32_t endpoint, Clock::time_point now, const HealthPolicy& p) const;
  // Any thread: how many of the pool's endpoints are available on some worker.
  std::uint32_t available_endpoints(Clock::time_point now, const HealthPolicy& p) const;

  // A cell's value: open:1 | cause:3 | open_until in ms of the steady clock:60 (0 while closed).
  static std::uint64_t pack(const EndpointHealth& h);

 private:
  std::uint32_t endpoints_, workers_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> cells_;  // [endpoint * workers + worker]
};

}  // namespace weir::routing
