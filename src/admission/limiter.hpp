// The state behind admission decisions: token buckets, stream slots and
// spend, per scope (a tenant or an API key, see auth::ScopeInfo). Admission
// talks to it through this interface so a Redis-backed store can replace the
// in-process one (LocalLimiter) without touching the request path.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "admission/scope_ledger.hpp"
#include "auth/policy.hpp"

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
  // A remote store that cannot decide (down, and this budget never read from it): 503, not a refusal.
  bool unavailable = false;
  std::uint32_t retry_after_s = 0;
};

// `ns` (> 0) as Retry-After's whole seconds (RFC 9110 §10.2.3): rounded up,
// at least 1, capped at what a TakeResult holds.
constexpr std::uint32_t whole_seconds_up(std::int64_t ns) noexcept {
  if (ns <= 1'000'000'000) return 1;
  const std::int64_t s = (ns - 1) / 1'000'000'000 + 1;
  return s > 0xFFFFFFFF ? 0xFFFFFFFFu : static_cast<std::uint32_t>(s);
}

// `ns` (> 0) as retry-after-ms's milliseconds: rounded up, at least 1, capped at 2^32 − 1 (49.7 days).
constexpr std::uint32_t whole_millis_up(std::int64_t ns) noexcept {
  if (ns <= 1'000'000) return 1;
  const std::int64_t ms = (ns - 1) / 1'000'000 + 1;
  return ms > 0xFFFFFFFF ? 0xFFFFFFFFu : static_cast<std::uint32_t>(ms);
}

// A budget's current window as Unix ns (UTC): [start_ns, end_ns); both 0
// when the budget never resets.
struct BudgetWindow {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

// What a request needs of one scope, for refill().
enum class Resource : std::uint8_t { requests, tokens, streams, budget };
struct Need {
  std::uint32_t scope = 0;
  Resource what = Resource::requests;
  double units = 0;  // requests, tokens, stream slots, or nano-USD (budget)
};

// Everything one request needs, filled by Admission::admit when a step came
// back pending: the caller may wait once for refill() and admit again.
struct Shortfall {
  static constexpr int kMax = 8;  // 2 scopes x (requests, tokens, streams, budget)
  bool pending = false;
  // A later wait of the same request (admit_after_refills: another request took
  // what the last refill brought): served by the store's next regular sync
  // rather than one started for it, so waiters that keep losing a race do not
  // drive syncs back to back.
  bool again = false;
  std::uint8_t count = 0;
  Need needs[kMax];

  void add(std::uint32_t scope, Resource what, double units) noexcept {
    if (count < kMax) needs[count++] = Need{scope, what, units};
  }
};

// `ns` (>= 0) of waiting as a refusal's Retry-After: whole seconds rounded
// up, at least 1, at most a day (refill_seconds' clamp).
inline std::uint32_t wait_seconds(double ns) {
  const double secs = std::ceil(std::max(ns, 0.0) / 1e9 - 1e-9);
  return static_cast<std::uint32_t>(std::clamp(secs, 1.0, 86400.0));
}

// Whole seconds (at least 1, at most a day) a bucket refilling at
// `rate_per_min` units a minute takes to gain `deficit` units: a refusal's
// Retry-After (RFC 9110 §10.2.3).
inline std::uint32_t refill_seconds(double deficit, double rate_per_min) {
  const double secs = std::ceil(std::max(deficit, 1e-9) * 60.0 / rate_per_min - 1e-9);
  return static_cast<std::uint32_t>(std::clamp(secs, 1.0, 86400.0));
}

// A bucket as the x-ratelimit-* headers show it, and what admission needs
// to say when it holds enough again.
struct BucketView {
  // The per-minute rate, or the burst when that is larger (then what the
  // bucket holds when full: OpenAI's "the maximum number of requests that
  // are permitted before exhausting the rate limit"); remaining never
  // exceeds it (a burst below the rate caps remaining, not this). 0 = the
  // bucket is unlimited.
  std::uint64_t limit = 0;
  std::uint64_t remaining = 0;  // whole units available now
  std::uint64_t reset_ms = 0;   // until the bucket is full again
  double level = 0;             // units available now, exact (below 0: usage above its estimate, owed)
  double rate_per_min = 0;      // refill rate, units per minute
  double depth = 0;             // what it holds when full, units
};

// Whole seconds (at least 1, at most a day) until the bucket `v` shows holds
// `cost` units, were it one bucket refilling at its rate; 0 when it holds
// them now, and when no wait helps (an unlimited bucket, or `cost` above its
// depth). Exact for a store that keeps each bucket whole (RedisLimiter's
// shared bucket); a sharded one answers Limiter::seconds_until itself.
inline std::uint32_t seconds_until(const BucketView& v, double cost) {
  // (Unlimited, or more than it ever holds: the check itself says so, and no wait helps.)
  if (v.rate_per_min <= 0 || cost > v.depth + 1e-9) return 0;
  const double deficit = cost - v.level;
  return deficit <= 1e-9 ? 0 : refill_seconds(deficit, v.rate_per_min);
}

// `ns` (>= 0) of waiting as a refusal's retry-after-ms: whole milliseconds rounded up, at least 1, at most a
// day (wait_seconds' clamp).
inline std::uint32_t wait_millis(double ns) {
  const double ms = std::ceil(std::max(ns, 0.0) / 1e6 - 1e-9);
  return static_cast<std::uint32_t>(std::clamp(ms, 1.0, 86'400'000.0));
}

// seconds_until(v, cost) in milliseconds (at least 1, at most a day; 0 in the same cases).
inline std::uint32_t millis_until(const BucketView& v, double cost) {
  if (v.rate_per_min <= 0 || cost > v.depth + 1e-9) return 0;
  const double deficit = cost - v.level;
  return deficit <= 1e-9 ? 0 : wait_millis(deficit * 60e9 / v.rate_per_min);
}

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
  // Whole seconds (at least 1, at most a day) from `now` until take() of
  // `cost` units from bucket `b` of `scope` passes, if nothing else takes
  // meanwhile: a refusal's Retry-After, which a client that waits it is not
  // refused again by. 0 when the bucket holds `cost` now, and when no wait
  // helps (an unlimited bucket, or `cost` above its depth). Default: the
  // bucket as one, admission::seconds_until(view()).
  virtual std::uint32_t seconds_until(std::uint32_t scope, Bucket b, double cost, Instant now) const {
    return admission::seconds_until(view(scope, b, now), cost);
  }
  // The same wait in milliseconds (at least 1, at most a day; 0 in the same cases): a refusal's
  // retry-after-ms, which the SDKs read before Retry-After.
  virtual std::uint32_t millis_until(std::uint32_t scope, Bucket b, double cost, Instant now) const {
    return admission::millis_until(view(scope, b, now), cost);
  }

  // Takes one in-flight slot; false when max_concurrent_streams are in use.
  virtual bool acquire_stream(std::uint32_t scope, std::uint32_t worker) = 0;
  virtual void release_stream(std::uint32_t scope, std::uint32_t worker) = 0;
  // Slots in use now (for metrics and tests).
  virtual std::uint64_t streams_in_use(std::uint32_t scope) const = 0;

  // --- Budgets (docs/admission.md, "Budgets"): nano-USD per budget period. ---
  //
  // Reserves `nano_usd` (a request's worst-case cost) against the budget of
  // `scope`, all or nothing: ok when spent + reserved + nano_usd <= limit and
  // spent + reserved < limit (so a budget of $0 admits nothing, not even a
  // free request). Refused: ok = false; `never` when nano_usd exceeds the
  // whole budget (no wait helps); `pending` (remote limiters) when this
  // process's share is short but the shared store may cover it. A refusal
  // that is not `never` carries `retry_after_s`, when the budget can admit
  // the request again: 1 when the settled spend leaves room for it (only
  // reservations of requests in flight are in the way), else the seconds
  // until the budget period ends (rounded up); 0 (no Retry-After) when the
  // budget never resets (no period) and its settled spend leaves no room,
  // and for a budget of $0. A scope without a budget always answers ok.
  // A reservation still in flight when the budget period rolls is carried
  // into the new period, which counts it against its limit (requests that
  // cross a rollover are not charged to a period that forgot them).
  virtual TakeResult reserve_spend(std::uint32_t scope, std::int64_t nano_usd, Instant now) = 0;
  // The same wait as a refusal's retry_after_s, exact to the millisecond (retry-after-ms, which the SDKs read
  // before Retry-After): the milliseconds (rounded up, at least 1) until the budget period of `scope` ends,
  // when that is what a reservation of `nano_usd` waits for; 0 otherwise (the settled spend leaves room,
  // the budget never resets or is $0, or the limiter does not know it): Retry-After's seconds are sent.
  // The refusal path only (it may read the clock).
  virtual std::uint32_t budget_retry_after_ms(std::uint32_t /*scope*/, std::int64_t /*nano_usd*/,
                                              Instant /*now*/) const {
    return 0;
  }
  // Replaces a reservation of `reserved` nano-USD by the request's real cost
  // `actual` (>= 0; above `reserved` the excess is recorded as spend, which
  // is the only way spend passes the limit), in the current period (the
  // reservation was carried into it if the period rolled since). reserved =
  // 0 charges `actual` without a reservation.
  virtual void settle_spend(std::uint32_t scope, std::int64_t reserved, std::int64_t actual, Instant now) = 0;
  // Settled spend of `scope` in its current budget period, nano-USD
  // (reservations of requests in flight not included).
  virtual std::int64_t spent(std::uint32_t scope, Instant now) = 0;
  // The current window of `scope`'s budget `b` (for the admin API's usage).
  // The default, the shared store's windows: calendar windows of the system
  // clock (UTC plus b.utc_offset_s), duration windows floor(Unix time /
  // period) (UTC-aligned, as budget.lua counts them). A read of the system
  // clock: not for the request path.
  virtual BudgetWindow budget_window(std::uint32_t scope, const auth::Budget& b, Instant now) const;

  // --- Remote stores (RedisLimiter). In-process limiters keep the defaults. ---

  // True while the shared store is unreachable and the configuration says
  // fail closed: Admission::admit answers 503 without taking anything to a
  // request whose scopes have a limit or a budget (one with neither passes).
  // A plain flag, not a virtual call: it is read on every admission.
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
  // How long a request whose admission came back pending for `need` may go
  // on waiting: while admit() still answers pending and less than this has
  // passed since its first refill() began, the caller refills and asks
  // again (what a refill brings goes into shares every request takes from:
  // another request may take it first); the answer after that is final. 0
  // (the default; RedisLimiter while it stops or fails over, or for a stream
  // cap other replicas share): one refill, then the final answer.
  virtual std::chrono::milliseconds refill_patience(const Shortfall& /*need*/) const noexcept { return {}; }

  // --- Scopes added at run time (keys created through the admin API). ---

  // Adds state for the scopes of `scopes` (a newer AuthPolicy::scopes())
  // past the ones this limiter holds; existing scopes are untouched. Call on
  // one thread (the control thread) and only then hand the policy that names
  // the new scopes to the workers: posting it orders these writes before
  // their reads. Returns false when this limiter cannot add scopes (a key
  // with limits or a budget of its own cannot be created then).
  virtual bool grow(const std::vector<auth::ScopeInfo>& /*scopes*/) { return false; }
  // Starts scope `to` (just added by grow) with what `from` has in flight
  // and spent: the spend of its current budget period, settled and reserved
  // (a key whose budget changed keeps its spend), and the stream slots its
  // requests hold, which count against `to`'s cap until they end. `from` is
  // retired: the tickets that name it give their slots back and settle their
  // spend where it went. Its buckets are not carried (`to`'s start full).
  virtual void carry_spend(std::uint32_t /*from*/, std::uint32_t /*to*/, Instant /*now*/) {}
  // carry_spend, and each bucket both have starts at the units `from` holds
  // (capped at `to`'s depth; a debt carries as debt; a bucket `from` did not
  // limit starts full). A configuration reload carries a tenant or key whose
  // limits or budget changed this way.
  virtual void carry(std::uint32_t from, std::uint32_t to, Instant now) { carry_spend(from, to, now); }
  // grow() by the one scope `info`, as scope scope_count(); false when full. The default builds the list
  // grow() takes (O(scopes)); LocalLimiter and RedisLimiter add the one scope alone (O(1): a key in Redis
  // with limits of its own costs the same whichever its number).
  virtual bool append_scope(const auth::ScopeInfo& info) {
    std::vector<auth::ScopeInfo> scopes(scope_count() + 1);  // grow() reads only the entries past scope_count()
    scopes.back() = info;
    return grow(scopes);
  }
  // Whether grow() can add scopes (LocalLimiter and RedisLimiter: yes).
  virtual bool grows() const noexcept { return false; }
  // Scopes this limiter holds (0 when it does not grow); the next scope
  // added gets this index.
  virtual std::uint32_t scope_count() const noexcept { return 0; }
  // --- Reusing scopes (admission/scope_ledger.hpp). ---

  // Makes this limiter hold state for every scope `policy` names, and
  // tracks the policy: grows past scope_count() (grow()), and, when this
  // limiter reuses scopes, starts afresh the free ones the policy took
  // (reset_scope) and holds each scope it names until the last reference
  // to the returned policy goes. Publish the returned pointer (an alias of
  // `policy`; a copy of `policy` itself does not hold its scopes). Null
  // when the limiter is full. Control thread, before the policy is posted
  // to the workers (the post orders the resets before their reads).
  std::shared_ptr<const auth::AuthPolicy> adopt(std::shared_ptr<const auth::AuthPolicy> policy);
  // Scopes no policy holds any more, lowest first, for the next policy's
  // fresh scopes (AuthPolicy::build's ScopeNumbers); empty when this
  // limiter does not reuse scopes.
  std::vector<std::uint32_t> reusable_scopes() const {
    if (!recycles()) return {};
    auto free = ledger_->reusable();
    std::erase_if(free, [this](std::uint32_t s) { return !drained(s); });
    return free;
  }
  // Whether adopt() reuses free scopes (LocalLimiter, RedisLimiter: yes).
  virtual bool recycles() const noexcept { return false; }

  // Adds one scope past the ones held (grow() with `info` alone; the same
  // thread rule) and returns its index, or nullopt when the limiter does
  // not grow or is full.
  std::optional<std::uint32_t> add_scope(const auth::ScopeInfo& info) {
    if (!grows()) return std::nullopt;
    const std::uint32_t n = scope_count();
    if (!append_scope(info)) return std::nullopt;
    return n;
  }

 protected:
  // Starts scope `scope` (< scope_count(), free: no policy, no ticket and
  // no carried scope holds it) afresh for `info`, as grow() starts a new
  // one. Only for limiters whose recycles() is true.
  virtual void reset_scope(std::uint32_t /*scope*/, const auth::ScopeInfo& /*info*/) {}
  // Whether free scope `scope` may be started afresh now (control thread). A
  // free scope has no ticket, but a remote store's may still hold shares of
  // the store (leases, stream slots, an allowance) or spend not yet pushed or
  // folded: it is reused once those went back. Default: at once.
  virtual bool drained(std::uint32_t /*scope*/) const noexcept { return true; }
  ScopeLedger& ledger() noexcept { return *ledger_; }

  std::atomic<bool> refusing_{false};  // set by a remote limiter during a fail-closed outage

 private:
  std::shared_ptr<ScopeLedger> ledger_ = std::make_shared<ScopeLedger>();
};

}  // namespace weir::admission
