// A worker's view of one pool: its endpoints, their load and health, and
// their idle upstream connections. Owned by one worker thread; no locks.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "http/io.hpp"
#include "http/upstream.hpp"
#include "routing/balance.hpp"
#include "routing/endpoint_set.hpp"
#include "routing/health.hpp"
#include "routing/load.hpp"
#include "routing/prefix_index.hpp"
#include "routing/queue.hpp"
#include "routing/rng.hpp"

namespace weir::routing {

struct EndpointState {
  const core::EndpointConfig* cfg = nullptr;
  // The address connections go to: the first the host resolved to, then
  // whichever of `addresses` last answered (connect_endpoint).
  http::tcp::endpoint addr;
  std::span<const http::tcp::endpoint> addresses;  // all of them, when several (SharedPoolState::addresses)
  http::ConnectionPool conns;
  http::TlsTarget tls;          // https:// endpoints: the pool's TLS context and the server name; else no client
  std::uint32_t in_flight = 0;  // requests of this worker currently on this endpoint
  EndpointHealth health;        // ejection and circuit breaker (routing/health.hpp)
  std::uint64_t published = 0;  // the health last written to the shared HealthBoard (HealthBoard::pack)
  std::array<std::uint64_t, static_cast<std::size_t>(OpenCause::count_)> opened{};  // openings by cause
  std::uint64_t recovered = 0;            // half-open (or probe-ejected) endpoints found healthy again
  std::uint32_t scrape_seq = 0;           // the last /metrics scrape this worker saw (LoadSnapshot::seq)
  std::uint32_t in_flight_at_scrape = 0;  // in_flight when it saw it
  // The server's batch capacity as learned from the scrapes: what the
  // latest scrape showing waiting requests had running; a later scrape
  // running more with none waiting raises it to twice that (a probe, see
  // see_scrape) (0 = never seen queueing).
  std::uint32_t capacity_seen = 0;
  std::chrono::steady_clock::time_point tls_failure_logged{};  // log_tls_failure's rate limit
};

// Logs (stderr) why a TLS handshake with endpoint `e` of pool `pool` failed
// (http::UpstreamConnection::tls_error: the verification result or the
// handshake error), at most once per 10 s per endpoint and worker, so a
// pool with a bad certificate does not flood the log.
void log_tls_failure(EndpointState& e, std::string_view pool, std::string_view reason,
                     std::chrono::steady_clock::time_point now);

using http::connect_share;

// Connects `x` (an http::Exchange or UpstreamExchange: connect(address,
// tls, timeout)) to endpoint `e` within `timeout` in all: its current
// address, then, while one is refused or unreachable (connect_refused) or
// does not answer within its share of the timeout (connect_timeout;
// connect_share), each other address its host name resolved to, in order.
// The one that answers becomes the endpoint's address for this worker, so
// a name such as localhost (::1 and 127.0.0.1) reaches a server listening
// on one of them, and a name with one dead address (a host down, packets
// dropped) reaches the others, as curl and Go's net/http do. A host with one
// address gets the whole timeout. Returns the last try's outcome.
template <class Exchange>
core::Task<http::UpstreamFailure> connect_endpoint(Exchange& x, EndpointState& e, std::chrono::milliseconds timeout) {
  if (e.addresses.size() < 2) co_return co_await x.connect(e.addr, e.tls, timeout);
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + timeout;
  auto left = [&] { return std::chrono::ceil<std::chrono::milliseconds>(end - Clock::now()); };
  const http::tcp::endpoint first = e.addr;
  std::size_t tries = 1;
  for (const auto& a : e.addresses) tries += a == first ? 0 : 1;
  // Each try's TCP connect within its share; a TLS handshake within what is left of the whole timeout.
  auto f = co_await x.connect(first, e.tls, connect_share(timeout, tries--), end);
  for (const auto& a : e.addresses) {
    if (f != http::UpstreamFailure::connect_refused && f != http::UpstreamFailure::connect_timeout) break;
    if (a == first) continue;
    const auto remaining = left();
    if (remaining.count() <= 0) break;
    f = co_await x.connect(a, e.tls, connect_share(remaining, tries--), end);
    if (f == http::UpstreamFailure::none) e.addr = a;
  }
  co_return f;
}

// What the workers of one process share about one pool: the endpoints'
// scraped load (written by the LoadScraper on the control thread) and, for
// balance: prefix_affinity, the prefix index. Built before the workers, kept
// until they are gone; read and written without locks (load.hpp, prefix_index.hpp).
struct SharedPoolState {
  // `workers`: the worker threads that will publish their view of the endpoints' health.
  explicit SharedPoolState(const core::PoolConfig& cfg, std::uint32_t workers = 1);
  LoadBoard loads;
  HealthPolicy policy;                    // the pool's ejection and breaker rules
  HealthBoard health;                     // every worker's view of every endpoint (/metrics, /ready)
  std::unique_ptr<PrefixIndex> prefixes;  // null unless balance is prefix_affinity
  // The TLS client context of the pool's https:// endpoints (set by the
  // server at start-up, http::TlsClient::make); null when none is https://.
  std::shared_ptr<http::TlsClient> tls;
  // Per endpoint (as cfg.endpoints): every address its host name resolved
  // to, in the resolver's order (RFC 6724), when it resolved to several;
  // empty otherwise (set before any worker builds a WorkerPool on it).
  std::vector<std::vector<http::tcp::endpoint>> addresses;
};

// Endpoint load `s` (a scrape, s.seq != 0) passes a saturation threshold of
// `qc` (the Inference Extension's detector): waiting requests or KV-cache use.
bool endpoint_saturated(const LoadSnapshot& s, const core::QueueConfig& qc);

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
  // endpoints have no TLS context: tests only) outlives the pool; `worker`
  // is the index this pool publishes its endpoints' health under there.
  // `keep` holds what `cfg` and `shared` live in (a configuration
  // generation's pool) for as long as the pool exists; empty: they outlive it.
  WorkerPool(const core::PoolConfig& cfg, const std::vector<http::tcp::endpoint>& addrs,
             SharedPoolState* shared = nullptr, std::uint32_t worker = 0, std::shared_ptr<const void> keep = {});

  const core::PoolConfig& config() const { return *cfg_; }
  std::uint32_t size() const { return static_cast<std::uint32_t>(endpoints_.size()); }
  EndpointState& endpoint(std::uint32_t i) { return endpoints_[i]; }
  const EndpointState& endpoint(std::uint32_t i) const { return endpoints_[i]; }

  // The endpoint for a request, among those that are available (closed, or
  // half-open with a trial slot free: routing/health.hpp), never `exclude`
  // when another exists, chosen by the pool's policy (balance.hpp):
  // p2c on in-flight requests, least_load, or prefix_affinity on `req`'s
  // prompt; a `req.session` with session_header set goes by session
  // affinity first. prefix_affinity records the choice in the prefix index.
  // O(n) in the endpoints (p2c: O(1) for ≤ 2), plus for prefix_affinity
  // O(prompt bytes) hashing (at most max_blocks * block_bytes). When none is
  // available: with a breaker, npos (the pool is unavailable); without, the
  // one whose ejection ends first.
  std::uint32_t pick(Clock::time_point now, Rng& rng, std::uint32_t exclude = npos, const PickRequest& req = {}) {
    EndpointSet excluded;
    if (exclude != npos) excluded.insert(exclude);
    return pick_excluding(now, rng, excluded, req);
  }
  // The same over the endpoints not in `excluded` (any index: a pool of
  // more than 64 endpoints too); when every one is excluded, or (breaker)
  // none of the others is available, as pick(now, rng). When every one not
  // excluded is ejected, an available excluded one (tried already: a 503
  // may pass next time, a dead endpoint will not) comes before any ejected
  // one, unless it is in `never` (a resume's: the endpoint whose stream broke).
  std::uint32_t pick_excluding(Clock::time_point now, Rng& rng, const EndpointSet& excluded,
                               const PickRequest& req = {}, const EndpointSet& never = {});

  // Endpoint `i`'s load as the load-aware policies see it (balance.hpp's
  // load_of): from the latest scrape plus this worker's in-flight change
  // since, else in-flight. `scraped` tells which.
  std::uint32_t load(std::uint32_t i, bool* scraped = nullptr);
  // The rule of the last pick (PickRule::p2c also when every endpoint was ejected or the pool has one).
  PickRule last_rule() const { return last_rule_; }
  // The shared state (null when none was given).
  SharedPoolState* shared() { return shared_; }

  // --- health (routing/health.hpp): every report updates endpoint `i`'s
  // machine, counts its transitions and publishes a change to the shared board.
  const HealthPolicy& policy() const { return policy_; }
  // The machine's state of endpoint `i` at `now`.
  HealthState state(std::uint32_t i, Clock::time_point now) const { return endpoints_[i].health.state(now, policy_); }
  // A request goes to endpoint `i`: true when it took a half-open trial slot
  // (then give it back with the report of its answer, or end_trial()).
  bool begin_request(std::uint32_t i, Clock::time_point now) { return endpoints_[i].health.begin(now, policy_); }
  void end_trial(std::uint32_t i) { endpoints_[i].health.end_trial(); }
  // Connect refused, timed out or failed TLS: opens it at once (eject_for,
  // doubling per opening in a row) and closes its idle connections.
  void report_connect_failure(std::uint32_t i, Clock::time_point now, bool trial = false);
  // A connection to `i` opened (ends a refusal's ejection without a breaker).
  void report_success(std::uint32_t i);
  // An answer from endpoint `i`: `failed` for a 5xx status, a reset or
  // timeout before the head, or a stream's first-token timeout; `trial`
  // when the request held a trial slot. Opens it at outlier.consecutive_failures
  // failures in a row (never beyond max_ejected_percent of the pool without
  // a breaker), reopens a half-open one on a failure and closes it on a
  // success. Returns true when this opened it.
  // `sent`: when the request was sent (EndpointHealth::on_answer: one sent before the endpoint opened counts
  // for nothing); unknown when default.
  // `capped`: a failure that opens the endpoint only within max_ejected_percent, breaker or not (a 429: the
  // upstream's capacity or one caller's quota, which must never make the whole pool unavailable).
  bool report_answer(std::uint32_t i, bool failed, Clock::time_point now, bool trial = false,
                     Clock::time_point sent = {}, bool capped = false);
  // A stream's TTFT on endpoint `i` (request written → first data event,
  // µs), for outlier.ttft_factor. Returns true when this ejected `i` (never
  // beyond max_ejected_percent of the pool).
  bool report_ttft(std::uint32_t i, std::uint32_t ttft_us, Clock::time_point now);
  // An active health probe of endpoint `i` (cfg.health) ended. After
  // cfg.health.unhealthy_after failures in a row the endpoint is open until
  // a probe succeeds (re-held at each failed probe); returns true when this
  // probe changed it between up and down.
  bool report_probe(std::uint32_t i, bool ok, Clock::time_point now);
  // Some endpoint may take a request at `now` (pick() would not return npos).
  bool any_available(Clock::time_point now) const;
  // How long until an endpoint may take a request again (0 when one may now).
  Clock::duration unavailable_for(Clock::time_point now) const;

  // --- overload (pools.X.queue): this worker's admission queue, null when off.
  PoolQueue* queue() { return queue_.get(); }
  const PoolQueue* queue() const { return queue_.get(); }
  // The pool is saturated by its endpoints' own metrics (queue.saturation):
  // every available endpoint with a scrape has vllm:num_requests_waiting
  // ≥ saturation.waiting or vllm:kv_cache_usage_perc ≥ saturation.kv_cache
  // (at least one has a scrape). Waiting is the scrape's plus what this
  // worker started since, less what ended (estimated_waiting): between two
  // scrapes the gate closes once this worker has filled vLLM's queue up to
  // `waiting`, not only at the next scrape, so one tenant's burst cannot
  // fill it far beyond and make the queue's higher priorities wait it out.
  // O(endpoints) relaxed loads.
  bool saturated(Clock::time_point now) { return room(now) == 0; }
  // How many more requests this worker may send before the pool is
  // saturated: over the available endpoints, saturation.waiting less each
  // one's estimated waiting (none for one at the KV-cache threshold);
  // kUnlimited without saturation, or when one has no scrape (fail open).
  static constexpr std::uint32_t kUnlimited = 0xffffffffu;
  std::uint32_t room(Clock::time_point now);
  // Endpoint `i`'s waiting requests now, as estimated from scrape `s`: with
  // a capacity learned (EndpointState::capacity_seen),
  // running + waiting + this worker's in-flight change since the scrape,
  // beyond that capacity; without one, the scrape's waiting plus that change
  // when it was queueing, else its waiting (free slots unknown: a burst on
  // an idle server is not held back). Never below 0.
  std::uint32_t estimated_waiting(std::uint32_t i, const LoadSnapshot& s);
  // Lets waiting requests through while the gate is open, at most room(now)
  // of them; returns how many. Each one let out counts against room()
  // until it resumes (admitted_resumed()): it starts on an endpoint only
  // then, so several requests ending in one turn of the loop, each
  // dispatching, do not each see the same room.
  std::uint32_t dispatch_queue(Clock::time_point now);
  // Reads every endpoint's latest scrape for the saturation gate (see_scrape:
  // the learned capacity, this worker's in-flight count at the scrape).
  // dispatch_queue() calls it, on the worker's tick and at every request's
  // end; O(endpoints) relaxed loads, nothing without queue.saturation.
  void observe_scrapes();
  // A waiter dispatch_queue() let out with limited room (holds_room)
  // resumed: it starts on an endpoint now, or gives up; either way it no
  // longer counts against room().
  void admitted_resumed() {
    if (let_out_ > 0) --let_out_;
  }

  // A configuration reload replaced `old` (a pool of the same name) by this
  // one: each endpoint of this pool that `old` has too (same URL and
  // address) takes its health machine (EndpointHealth::carry: open or
  // half-open with its period and doubling, failures and failed probes in a
  // row), its TTFT samples, its transition counts and, over plain HTTP, its
  // idle connections (a TLS connection was made with the old pool's
  // context, which may trust other CAs, and is left to close), and
  // publishes it on this pool's board. In-flight counts, half-open trial
  // slots and the admission queue (its waiters and active requests) stay
  // with `old`: its requests end there.
  void carry_from(WorkerPool& old);
  // Called on this pool's thread at each opening of an endpoint (`t`
  // opened, `cause` why) and each recovery (`t` closed): the worker's
  // metrics. Not called for carry_from. Empty: none.
  using TransitionHook = std::function<void(std::uint32_t endpoint, Transition t, OpenCause cause)>;
  void on_transition(TransitionHook hook) { on_transition_ = std::move(hook); }

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
  // After an event on endpoint `i`: counts transition `t`, closes the idle
  // connections of an opened endpoint when `drop_conns`, publishes a change.
  void after(std::uint32_t i, Transition t, bool drop_conns = false);
  // Endpoints open (ejected) at `now`.
  std::uint32_t open_count(Clock::time_point now) const;
  // Opening one more keeps the pool within outlier.max_ejected_percent.
  bool may_eject(std::uint32_t i, Clock::time_point now) const;

  const core::PoolConfig* cfg_;
  HealthPolicy policy_;
  std::uint32_t worker_ = 0;
  std::unique_ptr<TtftOutliers> ttft_;  // outlier.ttft_factor set
  std::uint32_t let_out_ = 0;           // waiters dispatch_queue() let out that have not resumed yet
  std::unique_ptr<PoolQueue> queue_;    // queue configured
  std::vector<EndpointState> endpoints_;
  // Notes scrape `s` of endpoint `i` (its first sight: what is in flight
  // then, and the capacity it shows while queueing).
  void see_scrape(std::uint32_t i, const LoadSnapshot& s);
  // The non-p2c policies (and sessions) over the healthy endpoints in scratch_.
  std::uint32_t pick_by_policy(Clock::time_point now, Rng& rng, const PickRequest& req);

  SharedPoolState* shared_;
  PickRule last_rule_ = PickRule::p2c;
  std::vector<std::uint32_t> scratch_;  // healthy candidates, reused
  std::vector<Candidate> candidates_;   // the same with their loads (non-p2c policies), reused
  std::vector<std::uint64_t> seeds_;    // session rendezvous seed per endpoint (endpoint_seed)
  std::uint32_t in_flight_ = 0;
  std::uint32_t retrying_ = 0;
  TransitionHook on_transition_;
  std::shared_ptr<const void> keep_;
};

}  // namespace weir::routing
