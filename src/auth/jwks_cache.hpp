// The JWKS key set shared by all workers: fetched on the control-plane thread,
// published as an immutable snapshot, read by workers without a lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

#include "auth/jwk.hpp"
#include "auth/jwt.hpp"

namespace boost::asio {
class io_context;
}

namespace weir::auth {

// Where a JWKS document comes from. Runs on the control-plane io_context.
class JwksSource {
 public:
  using Result = tl::expected<std::string, std::string>;  // the document text, or why not
  using Callback = std::function<void(Result)>;
  virtual ~JwksSource() = default;
  // Starts one fetch and calls `done` exactly once, on the control-plane
  // thread (possibly before returning). Never throws.
  virtual void fetch(Callback done) = 0;
  // For logs: the file path, or the URL through core::redact_url (URLs with
  // userinfo are refused by the configuration; credential-like query
  // parameters show as REDACTED).
  virtual std::string describe() const = 0;
};

// Reads `path` on each fetch (synchronously: a local file, control plane only).
std::unique_ptr<JwksSource> make_file_jwks_source(std::string path);

// GETs `url` (http:// or https://, the latter verified against the system CA
// store and the host name) with `timeout` for the whole exchange, a 1 MiB
// body cap, and a 200 status required. Defined in jwks_http.cpp.
std::unique_ptr<JwksSource> make_http_jwks_source(boost::asio::io_context& control, std::string url,
                                                  std::chrono::milliseconds timeout);

// The refetch floor's clock: monotonic, so a step of the wall clock (NTP,
// an operator) neither blocks refetches (a step back) nor lets them through
// early (a step forward).
using MonoClock = std::chrono::steady_clock;
using MonoTime = MonoClock::time_point;

struct JwksOptions {
  std::chrono::milliseconds refresh_interval{std::chrono::minutes(5)};  // periodic refetch
  // Floor between two fetches that a worker asks for (unknown kid), and the
  // retry delay after a failed fetch.
  std::chrono::milliseconds min_refetch_interval{std::chrono::seconds(30)};
  // Clock of the refetch floor (min_refetch_interval), injectable for tests.
  MonoTime (*clock)() = &MonoClock::now;
};

// Holds the current KeySet. Fetch failures and unparseable documents keep
// the previous set: when the JWKS endpoint is down, Weir keeps serving with
// the keys it has. Each failed fetch prints one line on stderr (why, and
// how many keys are kept), and so does the first success after failures.
//
// Threads: construct, start() and stop() on the control-plane thread (or
// before it runs); keys(), generation(), request_refresh() and
// fetch_for_unknown_kid() from any thread. Destroy only after the control io_context has stopped running.
class JwksCache {
 public:
  JwksCache(boost::asio::io_context& control, std::unique_ptr<JwksSource> source, JwksOptions options);
  ~JwksCache();
  JwksCache(const JwksCache&) = delete;
  JwksCache& operator=(const JwksCache&) = delete;

  // Fetches now and then every refresh_interval (min_refetch_interval after a failure).
  void start();
  // Cancels the refresh timer; a fetch in flight completes but schedules nothing.
  void stop();

  // The current key set (empty before the first successful fetch). One
  // atomic load; call on verification misses only, not per request.
  std::shared_ptr<const KeySet> keys() const noexcept;
  // Bumped whenever the published key material changes (not on a refetch of
  // the same document): workers drop their token caches when it moves.
  std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }
  // Fetches finished so far (successful or not): a request that asked for a
  // refetch waits until this moves past the value it saw.
  std::uint64_t completed_fetches() const noexcept { return seq_.load(std::memory_order_acquire) / 2; }

  // Calls `done` (once, on the control thread) when a fetch has finished
  // after the `mark` of completed_fetches() a request saw, at once if one
  // already has, or when the cache stops. From any thread; the slow path of
  // a key rotation only (see async_wait_fetch in auth/jwks_wait.hpp).
  void on_fetch(std::uint64_t mark, std::function<void()> done);

  // Asks for a refetch, e.g. after a token named an unknown kid.
  // Rate-limited: returns false without doing anything when another
  // call asked for one less than min_refetch_interval before `now`
  // (JwksOptions::clock's time; the first form reads it); otherwise posts a
  // fetch to the control plane (joining the one in flight, if any) and
  // returns true. Only these on-demand fetches set that floor: a periodic,
  // start-up or reload's fetch does not, so a key published just after one
  // is fetched on its first token's demand.
  bool request_refresh() { return request_refresh(options_.clock()); }
  bool request_refresh(MonoTime now);

  // For a token whose kid the key set does not hold (or with no set loaded):
  // the completed_fetches() mark to wait past (on_fetch, async_wait_fetch)
  // when a fetch will answer it, either one in flight (start-up, periodic, a
  // reload's or another request's: a rotation's burst of new-kid tokens all
  // wait for the one fetch) or one request_refresh(now) started; nullopt
  // when none is in flight and the floor refuses a new one, so the token is
  // refused at once (a flood of made-up kids neither waits nor makes fetches).
  // From any thread (one short lock, shared with request_refresh).
  std::optional<std::uint64_t> fetch_for_unknown_kid() { return fetch_for_unknown_kid(options_.clock()); }
  std::optional<std::uint64_t> fetch_for_unknown_kid(MonoTime now);

  // An operator's configuration reload (docs/operations.md, "Reloading"):
  // fetches now, past min_refetch_interval (that floor is for tokens naming
  // unknown kids, which anyone can send; a reload is deliberate and rare).
  // A fetch already in flight began before the reload and may bring the
  // old document: another follows it. The outcome is said on stderr once
  // (the number of keys and whether the set changed, or why it failed).
  // Control thread only.
  void refetch_now();

  // Parses and publishes `jwks_text` at once (start-up and reloads from a
  // file, tests). True when the published set changed (another document
  // than the one in use, or none was loaded); an error keeps the set in use.
  tl::expected<bool, std::string> install(std::string_view jwks_text);

  struct Stats {
    std::uint64_t fetches = 0;           // fetches started
    std::uint64_t failures = 0;          // fetches or parses that failed (keys kept)
    std::uint64_t updates = 0;           // key-set changes published
    std::uint64_t refresh_requests = 0;  // request_refresh() calls that scheduled a fetch
    std::uint64_t refresh_limited = 0;   // request_refresh() calls refused by the rate limit
    std::uint64_t refresh_joined = 0;    // fetch_for_unknown_kid() calls that joined a fetch in flight
  };
  Stats stats() const noexcept;

 private:
  void fetch_now();
  // The floor check and, past it, a fetch posted; its mark, or nullopt when refused. Under refetch_mu_.
  std::optional<std::uint64_t> ask_locked(MonoTime now);
  void on_result(JwksSource::Result r);
  void schedule(std::chrono::milliseconds delay);

  struct Timer;
  boost::asio::io_context& control_;
  std::unique_ptr<JwksSource> source_;
  JwksOptions options_;
  std::unique_ptr<Timer> timer_;
  std::atomic<std::shared_ptr<const KeySet>> keys_;
  std::atomic<std::uint64_t> generation_{0};
  // Whether a fetch is in flight and the refetch floor, decided together: a
  // request with an unknown kid either joins a fetch or is refused by the
  // floor, never refused while the fetch another request asked for is about
  // to start. Taken by workers on a kid miss only (and by the control thread
  // twice a fetch), never on the verified path.
  std::mutex refetch_mu_;
  std::int64_t next_refetch_ns_ = INT64_MIN;  // under refetch_mu_: MonoTime ns before which request_refresh refuses
  // Twice the fetches finished, plus one while a fetch is in flight or asked
  // for; written under refetch_mu_, read without it (completed_fetches()).
  std::atomic<std::uint64_t> seq_{0};
  bool in_flight_ = false;         // control thread only
  bool running_ = false;           // control thread only
  bool failing_ = false;           // control thread only: the last fetch failed (its success is then logged)
  bool again_ = false;             // control thread only: refetch_now() came while a fetch was in flight
  bool announce_ = false;          // control thread only: the fetch in flight is a reload's (its outcome is said)
  bool announced_change_ = false;  // control thread only: a fetch followed by a reload's (again_) changed the set
  std::vector<std::pair<std::uint64_t, std::function<void()>>> waiters_;  // control thread only
  std::atomic<std::uint64_t> fetches_{0}, failures_{0}, updates_{0}, refresh_requests_{0}, refresh_limited_{0},
      refresh_joined_{0};
};

}  // namespace weir::auth
