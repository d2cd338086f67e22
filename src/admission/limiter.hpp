// The state behind admission decisions: token buckets, stream slots and
// spend, per scope (a tenant or an API key, see auth::ScopeInfo). Admission
// talks to it through this interface so a Redis-backed store can replace the
// in-process one (LocalLimiter) without touching the request path.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

namespace weir::admission {

using MonoClock = std::chrono::steady_clock;
using Instant = MonoClock::time_point;

enum class Bucket : std::uint8_t {
  requests,  // one unit per request; limit = requests_per_minute
  tokens,    // estimated tokens; limit = tokens_per_minute
};

// Outcome of a take: ok, or how many more units the bucket needs and when
// (seconds, rounded up, >= 1) it will have them. `never` when the cost
// exceeds the bucket's depth (burst): no wait helps. `pending` (with ok =
// false) when the local share is short but the shared store may still have
// the units: refill() and one more take may pass (remote limiters only).
// Eight bytes, returned in one register: keep new fields in the padding.
struct TakeResult {
  bool ok = true;
  bool never = false;
  bool pending = false;
  std::uint32_t retry_after_s = 0;
};

// What a request needs of one scope, for refill().
enum class Resource : std::uint8_t { requests, tokens, streams };
struct Need {
  std::uint32_t scope = 0;
  Resource what = Resource::requests;
  double units = 0;  // requests, tokens, or stream slots
};

// Everything one request needs, filled by Admission::admit when a step came
// back pending: the caller may wait once for refill() and admit again.
struct Shortfall {
  static constexpr int kMax = 6;  // 2 scopes x (requests, tokens, streams)
  bool pending = false;
  std::uint8_t count = 0;
  Need needs[kMax];

  void add(std::uint32_t scope, Resource what, double units) noexcept {
    if (count < kMax) needs[count++] = Need{scope, what, units};
  }
};

// A bucket as the x-ratelimit-* headers show it.
struct BucketView {
  std::uint64_t limit = 0;       // per minute; 0 = the bucket is unlimited
  std::uint64_t remaining = 0;   // whole units available now
  std::uint64_t reset_ms = 0;    // until the bucket is full again
};

// Contract for every implementation:
//  - Calls come from worker threads, each passing its own `worker` index
//    (0..workers-1); they must not block or wait on I/O. A remote store
//    answers from local leases and refills them in the background.
//  - `scope` is an index into the AuthPolicy::scopes() the limiter was built from.
//  - Amounts are in the bucket's units (requests, tokens); money in nano-USD.
class Limiter {
 public:
  virtual ~Limiter() = default;

  virtual std::uint32_t workers() const noexcept = 0;

  // Takes `cost` units from bucket `b` of `scope`, all or nothing.
  virtual TakeResult take(std::uint32_t scope, Bucket b, std::uint32_t worker, double cost, Instant now) = 0;
  // Returns `amount` units taken earlier (a refund; never beyond full).
  virtual void give_back(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) = 0;
  // Takes `amount` units unconditionally, going into debt if needed
  // (usage above the estimate: later requests wait it out).
  virtual void charge(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) = 0;
  virtual BucketView view(std::uint32_t scope, Bucket b, Instant now) const = 0;

  // Takes one in-flight slot; false when max_concurrent_streams are in use.
  virtual bool acquire_stream(std::uint32_t scope, std::uint32_t worker) = 0;
  virtual void release_stream(std::uint32_t scope, std::uint32_t worker) = 0;
  // Slots in use now (for metrics and tests).
  virtual std::uint64_t streams_in_use(std::uint32_t scope) const = 0;

  // Spend of `scope` in its current budget period, nano-USD.
  virtual std::int64_t spent(std::uint32_t scope, Instant now) = 0;
  virtual void add_spend(std::uint32_t scope, std::int64_t nano_usd, Instant now) = 0;

  // --- Remote stores (RedisLimiter). In-process limiters keep the defaults. ---

  // True while the shared store is unreachable and the configuration says
  // fail closed: Admission::admit answers 503 without taking anything. A
  // plain flag, not a virtual call: it is read first on every admission.
  bool refusing() const noexcept { return refusing_.load(std::memory_order_relaxed); }
  // After acquire_stream() returned false: true when the shared store may
  // still grant a slot (refill() and one more acquire may pass).
  virtual bool streams_refillable(std::uint32_t /*scope*/) const noexcept { return false; }
  // Asks the store to top up this process's shares so that `need` fits, and
  // calls `done` exactly once when that finished, failed or timed out (on
  // another thread, or inline). Called by `worker` on the slow path only;
  // `done` must be cheap (post to the worker's executor: see
  // admission/refill.hpp). Default: `done()` at once.
  virtual void refill(const Shortfall& /*need*/, std::uint32_t /*worker*/, std::function<void()> done) { done(); }

 protected:
  std::atomic<bool> refusing_{false};  // set by a remote limiter during a fail-closed outage
};

}  // namespace weir::admission
