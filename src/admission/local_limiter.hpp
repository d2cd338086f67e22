// In-process limiter state: per-worker shards, lock-free, no I/O.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "admission/limiter.hpp"
#include "auth/policy.hpp"

namespace weir::admission {

// Each scope's token bucket (rate r per minute, depth b) is split into one
// shard per worker with rate r/N and depth b/N, kept as a GCRA "theoretical
// arrival time" in one atomic word, so a shard is a bucket that needs no
// lock. A worker takes from its own shard (one uncontended CAS on a cache
// line that only it writes in the common case) and, when that shard is short,
// borrows the rest from the other shards in turn.
//
// Tolerance (docs/admission.md): the shards add up to exactly the configured
// bucket, so admission never exceeds r per minute plus b at once (beyond
// deliberate debt from settle() and integer rounding, < 1 ns of refill per
// operation, the same at any uptime: Spec). The error is on the safe side: under contention two workers
// that each hold a partial borrow can both refuse a request that either
// alone would have admitted. A refund goes to the worker's own shard, and
// what that shard cannot hold (units borrowed from others) to the other
// shards; only what the whole bucket cannot hold (it refilled meanwhile) is
// dropped, a bucket never above full.
//
// Stream slots (max_concurrent_streams = M) are split the same way, M/N per
// shard with the remainder on the first ones; acquire borrows from other
// shards, release returns the slot to the releasing worker's shard. The sum
// is exactly M at all times.
//
// A configuration change that gives a tenant or key new limits gives it a
// new scope (carry(); a free one is reused, reset_scope()): the old scope's streams in flight and its committed
// spend move to the new one, which counts them against its cap and budget,
// and the tickets that still name the old scope give their slots and settle
// their spend there through its forward link. The move is exact under
// concurrency: each counter of the old scope is marked dead by one atomic
// add, so every operation lands either before the mark (moved with it) or
// after (and follows the link).
//
// A budget is two shared atomic counters per scope: `committed` (settled
// spend plus the reservations of requests in flight), on which a
// reservation is one compare-and-swap that never passes the limit, and
// `spent` (settled only, for reporting). A budget period rolls when a call
// sees a later window (the settled spend goes; the reservations of requests
// in flight stay, counted against the new window's limit until they
// settle there): for a duration, floor(Unix time / period), so a
// `24h` budget resets at 00:00 UTC and a `1h` one on the hour, as
// budget.lua counts them with Redis; for a calendar period (day, ISO week,
// month; core/calendar.hpp), a window of wall-clock time on UTC plus the
// budget's offset. Wall-clock time is the
// steady `now` mapped by the wall-clock time of `epoch`, read once at
// creation: no clock read per request, and a later step of the system
// clock is not followed (NTP slewing is, as the steady clock slews alike).
class LocalLimiter final : public Limiter {
 public:
  // Most workers a limiter shards for (more are folded onto these shards).
  static constexpr std::uint32_t kMaxShards = 256;

  // `scopes`: AuthPolicy::scopes(). `workers`: worker threads (>= 1).
  // `epoch`: origin of the limiter's time axis (any Instant <= the first `now`).
  // `epoch_unix_ns`: the wall-clock time of `epoch`, ns since 1970-01-01
  // UTC (Unix time), for calendar budgets; nullopt = read the system clock
  // now and map it back to `epoch`. Tests give it to fix the calendar.
  LocalLimiter(const std::vector<auth::ScopeInfo>& scopes, std::uint32_t workers, Instant epoch,
               std::optional<std::int64_t> epoch_unix_ns = std::nullopt);
  ~LocalLimiter() override;

  std::uint32_t workers() const noexcept override { return workers_; }
  TakeResult take(std::uint32_t scope, Bucket b, std::uint32_t worker, double cost, Instant now) override;
  void give_back(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) override;
  void charge(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) override;
  // reset_ms: until every shard is full (a full shard gains nothing, so
  // with uneven shards that is up to N times (depth - level) / r).
  BucketView view(std::uint32_t scope, Bucket b, Instant now) const override;
  // Exact for the shards (wait_ns), not the whole bucket at rate r.
  std::uint32_t seconds_until(std::uint32_t scope, Bucket b, double cost, Instant now) const override;
  std::uint32_t millis_until(std::uint32_t scope, Bucket b, double cost, Instant now) const override;
  bool acquire_stream(std::uint32_t scope, std::uint32_t worker) override;
  void release_stream(std::uint32_t scope, std::uint32_t worker) override;
  std::uint64_t streams_in_use(std::uint32_t scope) const override;
  TakeResult reserve_spend(std::uint32_t scope, std::int64_t nano_usd, Instant now) override;
  std::uint32_t budget_retry_after_ms(std::uint32_t scope, std::int64_t nano_usd, Instant now) const override;
  void settle_spend(std::uint32_t scope, std::int64_t reserved, std::int64_t actual, Instant now) override;
  std::int64_t spent(std::uint32_t scope, Instant now) override;
  // Up to kMaxScopes in all; scopes live in chunks that never move.
  bool grow(const std::vector<auth::ScopeInfo>& scopes) override;
  bool append_scope(const auth::ScopeInfo& info) override;
  void carry_spend(std::uint32_t from, std::uint32_t to, Instant now) override;
  void carry(std::uint32_t from, std::uint32_t to, Instant now) override;
  bool grows() const noexcept override { return true; }
  // A scope nothing holds any more is reused (admission/scope_ledger.hpp):
  // reloads and key changes that give tenants and keys new limits take no
  // more scopes, nor memory, than the most held at once.
  bool recycles() const noexcept override { return true; }
  std::uint32_t scope_count() const noexcept override { return static_cast<std::uint32_t>(scope_count_); }
  static constexpr std::uint32_t kChunk = 64;
  static constexpr std::uint32_t kMaxScopes = kChunk * 4096;
  // Settled spend plus reservations in flight, nano-USD. For tests and metrics.
  std::int64_t committed(std::uint32_t scope, Instant now);
  BudgetWindow budget_window(std::uint32_t scope, const auth::Budget& b, Instant now) const override;
  // `now` as Unix ns (the steady->wall mapping of the constructor).
  std::int64_t unix_ns(Instant now) const noexcept {
    return epoch_unix_ns_ + std::chrono::duration_cast<std::chrono::nanoseconds>(now - epoch_).count();
  }

  // Starts scope `scope` (< scope_count()) afresh for `info`, as reset_scope: for a limiter that keeps
  // this one as its fail-open fallback and reuses a scope it knows to be free (RedisLimiter).
  void restart_scope(std::uint32_t scope, const auth::ScopeInfo& info) { reset_scope(scope, info); }

  // Units available in bucket `b` of `scope` now, summed over shards (may be
  // negative while in debt). For tests and metrics.
  double available(std::uint32_t scope, Bucket b, Instant now) const;

 private:
  // A shard's bucket in integer nanoseconds of its own refill time (docs/admission.md, "Precision"): its
  // TAT is ns since epoch_ in an int64, a unit costs t_ns of it, and a cost is turned into ns once, rounded
  // down (a refund rounded up), so the sums stay exact at any uptime: a full bucket holds exactly
  // floor(depth * t_ns) ns, what a request of cost == depth needs, and N takes of 1 never need more than
  // one of N. Admission is exact to 1 ns of refill per operation (on the client's side), whatever the uptime.
  struct Spec {
    bool enabled = false;
    double rate_per_min = 0;      // whole bucket
    double depth = 0;             // whole bucket (burst)
    double t_ns = 0;              // ns of a shard's time per unit (60e9 * N / rate)
    std::int64_t tau_ns = 0;      // a shard's depth in ns: floor(depth * t_ns) split over the N shards,
    std::uint32_t tau_extra = 0;  // the first tau_extra of them holding 1 ns more
    std::int64_t tau(std::uint32_t shard) const noexcept { return tau_ns + (shard < tau_extra ? 1 : 0); }
    std::int64_t total_ns = 0;  // the whole bucket: floor(depth * t_ns), at least 1 ns a shard
    std::int64_t total() const noexcept { return total_ns; }
  };
  struct alignas(64) Shard {
    std::atomic<std::int64_t> tat[2];  // per Bucket, ns since epoch; <= now means full
    std::atomic<std::int64_t> free_streams{0};
  };
  // A scope carried to another (retire()) stays behind for the requests
  // that hold its tickets: its counters are pushed far out of range (a dead
  // mark: free_streams and `inherited` by -kDead / +kDead, committed and
  // spent by +kDeadSpend), so an operation that lands in one after the
  // carry sees it in the value it gets back, and takes itself to `forward`.
  static constexpr std::int64_t kDead = std::int64_t{1} << 40;
  static constexpr std::int64_t kDeadSpend = std::int64_t{1} << 61;
  static constexpr std::uint32_t kNoScope = 0xffffffffu;
  struct Scope {
    Spec spec[2];
    std::uint64_t max_streams = 0;
    bool has_budget = false;
    std::int64_t budget_nano_usd = 0;
    std::int64_t period_ns = 0;
    core::CalendarPeriod calendar = core::CalendarPeriod::none;
    std::int32_t utc_offset_s = 0;
    std::unique_ptr<Shard[]> shards;
    alignas(64) std::atomic<std::int64_t> committed{0};  // spent + reserved
    std::atomic<std::int64_t> spent{0};
    std::atomic<std::int64_t> window{0};
    // Streams admitted on the scopes carried here that still run: they
    // count against max_streams until their tickets give them back.
    std::atomic<std::int64_t> inherited{0};
    // Set once it was carried: where its tickets' streams and spend go now.
    std::atomic<std::uint32_t> forward{kNoScope};
  };

  void reset_scope(std::uint32_t scope, const auth::ScopeInfo& info) override;
  Scope& at(std::uint32_t scope) noexcept { return chunks_[scope / kChunk][scope % kChunk]; }
  const Scope& at(std::uint32_t scope) const noexcept { return chunks_[scope / kChunk][scope % kChunk]; }
  void init(Scope& sc, const auth::ScopeInfo& info);
  std::int64_t ns(Instant t) const noexcept;
  std::uint32_t shard_of(std::uint32_t worker) const noexcept { return worker % shards_; }
  // `units` as ns of a shard's refill time: rounded down (a cost) or up (a refund), within [0, kFarNs].
  static std::int64_t cost_ns(const Spec& s, double units) noexcept;
  static std::int64_t refund_ns(const Spec& s, double units) noexcept;
  // The ns of refill shard `j` of bucket `bi` holds now (<= its tau; negative while in debt).
  std::int64_t shard_ns(const Scope& sc, int bi, std::uint32_t j, std::int64_t now) const noexcept;
  // Units in bucket `bi` summed over the shards: exactly its depth when every shard is full.
  double level(const Scope& sc, int bi, std::int64_t now) const noexcept;
  // The same for `have` ns summed over a bucket's shards (`s`: its spec), at most the depth.
  static double level_of(const Spec& s, std::int64_t have) noexcept;
  // Nanoseconds from `now` until the shards of bucket `bi` of `sc` can give
  // `need` ns (<= the bucket's total) between them, as take() borrows them, if no one
  // takes meanwhile; 0 when they can now. Each shard refills 1 ns a ns up to its tau
  // only, and one in debt gives nothing until it is paid: the sum
  // is piecewise linear in time, walked through its breakpoints.
  double wait_ns(const Scope& sc, int bi, std::int64_t need, std::int64_t now) const noexcept;
  // Takes up to `want` ns from one shard whose depth is `tau`; returns what it took.
  static std::int64_t take_up_to(std::int64_t tau, std::atomic<std::int64_t>& tat, std::int64_t want,
                                 std::int64_t now) noexcept;
  // Puts `amount` ns back into one shard, up to full; returns what did not fit.
  static std::int64_t refund(std::atomic<std::int64_t>& tat, std::int64_t amount, std::int64_t now) noexcept;
  void roll(Scope& sc, Instant now);
  // Carries the in-flight state of `from` (its streams and its committed
  // spend) to `to` and marks `from` dead (Scope::forward).
  void retire(std::uint32_t from, std::uint32_t to, Instant now);
  // `forward` of a dead scope, once the carry that marked it has set it.
  std::uint32_t forward_of(const Scope& sc) const noexcept;
  // A stream slot counted in `inherited` (a ticket of a carried scope).
  bool acquire_inherited(std::uint32_t scope);
  void release_inherited(std::uint32_t scope);
  // Committed and settled spend added to `scope`, following carries.
  void add_committed(std::uint32_t scope, std::int64_t delta);
  void add_spent(std::uint32_t scope, std::int64_t delta);
  std::int64_t free_streams_sum(const Scope& sc) const noexcept;
  // A refused reservation's Retry-After (Limiter::reserve_spend).
  std::uint32_t budget_retry_after(const Scope& sc, std::int64_t nano_usd, Instant now) const noexcept;
  // Its wait in ns until the budget period ends; 0 when the settled spend leaves room (1 s is said), -1 when
  // no wait helps (a $0 budget, or one that never resets).
  std::int64_t budget_wait_ns(const Scope& sc, std::int64_t nano_usd, Instant now) const noexcept;

  std::uint32_t workers_;
  std::uint32_t shards_;
  Instant epoch_;
  std::int64_t epoch_unix_ns_ = 0;  // wall-clock time of epoch_, Unix ns
  // Scope i is chunks_[i / kChunk][i % kChunk]; a chunk is allocated whole
  // by the constructor or grow() and never moves.
  std::unique_ptr<std::unique_ptr<Scope[]>[]> chunks_;
  std::size_t scope_count_ = 0;
};

}  // namespace weir::admission
