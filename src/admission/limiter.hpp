// The state behind admission decisions: token buckets, stream slots and
// spend, per scope (a tenant or an API key, see auth::ScopeInfo). Admission
// talks to it through this interface so a Redis-backed store can replace the
// in-process one (LocalLimiter) without touching the request path.
#pragma once

#include <chrono>
#include <cstdint>

namespace weir::admission {

using MonoClock = std::chrono::steady_clock;
using Instant = MonoClock::time_point;

enum class Bucket : std::uint8_t {
  requests,  // one unit per request; limit = requests_per_minute
  tokens,    // estimated tokens; limit = tokens_per_minute
};

// Outcome of a take: ok, or how many more units the bucket needs and when
// (seconds, rounded up, >= 1) it will have them. `never` when the cost
// exceeds the bucket's depth (burst): no wait helps.
struct TakeResult {
  bool ok = true;
  bool never = false;
  std::uint32_t retry_after_s = 0;
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
};

}  // namespace weir::admission
