// RedisLimiter's per-scope state and sync loop, shared by its two files
// (redis_limiter.cpp: scopes and the workers' calls; redis_sync.cpp: the
// control thread's sync). Private to them: include nowhere else.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

#include "admission/redis_limiter.hpp"
#include "core/async.hpp"

namespace weir::admission {

namespace redis_detail {
constexpr double kEps = 1e-9;
inline std::int64_t whole_up(double x) { return static_cast<std::int64_t>(std::ceil(x - kEps)); }
inline std::int64_t whole_down(double x) { return static_cast<std::int64_t>(std::floor(x + kEps)); }
}  // namespace redis_detail

struct RedisLimiter::Spec {
  bool enabled = false;
  double rate_per_min = 0;
  double depth = 0;
};

struct alignas(64) RedisLimiter::Lease {
  std::atomic<std::int64_t> units{0};   // whole units this replica may admit; < 0 = debt not yet pushed
  std::atomic<bool> wanted{false};      // a take found it short since the last sync
  std::atomic<double> remote_avail{0};  // units in the global bucket at the last reply
  // When (integer ns since epoch_: the time since, which refills the estimate, is exact at any uptime); < 0 = never
  // synced.
  std::atomic<std::int64_t> remote_at_ns{-1};
};

struct RedisLimiter::LeaseCtl {
  std::string key;
  std::int64_t target = 1;  // units a busy replica holds now: base, raised by demand x round trip, up to cap
  std::int64_t low = 1;     // top up below this
  std::int64_t high = 2;    // give back above this
  std::int64_t base = 1;    // target from the configuration (rate x lease_window, lease_min_tokens)
  std::int64_t cap = 1;     // most the target may grow to: max(1, depth x lease_max_share)
  std::int64_t seen = 0;    // units after the last sync: a change means use
  double taken = 0;         // units seen taken since the demand was last measured
  double demand = 0;        // units per second this replica's requests take or wait for (smoothed)
  Instant measured_at{};    // when `demand` was last updated
  Instant last_used{};
  Instant keep_until{};  // units granted to waiting requests are not given back before their retry
  double waiting = 0;    // units that waiting requests need (refill())
};

struct alignas(64) RedisLimiter::Slots {
  std::atomic<std::int64_t> free{0};         // allowance - in use (< 0 after a shrink)
  std::atomic<std::int64_t> allowance{0};    // slots this replica may hold (written by the control thread)
  std::atomic<std::int64_t> others{0};       // slots the other replicas held at the last renewal
  std::atomic<std::int64_t> others_used{0};  // of those, in use (by their last renewals)
  std::atomic<bool> wanted{false};
  // Set when another scope of the same name took over (carry: a key's or
  // tenant's limits changed): this scope keeps only the slots of its
  // streams still in flight, and gives its headroom back at the next sync,
  // where the new scope asks too (its slots would otherwise count as the
  // others' for about lease_idle, refusing the new scope its whole cap).
  std::atomic<bool> superseded{false};
  // The scope this one took over from (carry), UINT32_MAX for none: its
  // streams still in flight count as this scope's in use (streams_in_use).
  std::atomic<std::uint32_t> took_over{UINT32_MAX};
  // When the last renewal's answer came (ns(), the sync loop's clock): an
  // `others` older than kSlotsStale may hold slots released since (an old
  // scope's streams that ended): a refused request waits for a sync then.
  std::atomic<double> reply_ns{0};
  // When a stream of this scope last ended after it was superseded: its
  // slot is free, though Redis counts it in the new scope's `others` until
  // this scope's next renewal.
  std::atomic<double> released_ns{0};
};

struct RedisLimiter::SlotsCtl {
  std::string key;
  std::int64_t headroom = 1;   // free slots a busy replica keeps
  std::int64_t low = 1;        // renew below this many free
  std::int64_t local_max = 1;  // allowance during an outage with fail_open
  std::int64_t seen_free = 0;
  std::int64_t waiting = 0;
  std::int64_t told_want = 0;    // the want Redis last recorded for this replica
  std::int64_t told_demand = 0;  // the demand (requests waiting or refused) it last recorded
  std::int64_t recorded = 0;     // the slots it last recorded as held (>= allowance)
  bool contended = false;        // another replica was starved at the last renewal
  Instant last_used{};
  Instant last_renew{};
  Instant keep_until{};  // as LeaseCtl::keep_until
};

// A budget as workers see it (nano-USD). A reservation is one CAS on `free`.
struct alignas(64) RedisLimiter::Spend {
  // allowance - reservations in flight - settled spend not yet pushed (< 0 after a shrink or an overshoot)
  std::atomic<std::int64_t> free{0};
  std::atomic<std::int64_t> in_use{0};   // reservations of requests in flight
  std::atomic<std::int64_t> mine{0};     // this replica's settled spend in the current period, pushed or not
  std::atomic<std::int64_t> others{0};   // the other replicas' settled spend in it, as of the last reply
  std::atomic<std::int64_t> spare{0};    // budget no replica held at the last reply (for `pending`)
  std::atomic<std::int64_t> biggest{0};  // largest reservation asked for since the budget went idle
  std::atomic<bool> wanted{false};       // a reservation found `free` short since the last sync
  std::atomic<bool> touched{false};      // used since the last push (spent(), reserve_spend(), settle_spend())
  // When the current period ends per the last reply, ns since epoch_ (Retry-After); -1 before it or never.
  std::atomic<std::int64_t> period_end_ns{-1};
  // The current period's number in Redis's count (budget.lua's idx: Redis TIME's), -1 before the first reply.
  std::atomic<std::int64_t> period_idx{-1};
};

struct RedisLimiter::SpendCtl {
  bool enabled = false;
  std::string key;
  std::int64_t limit = 0;  // nano-USD
  std::int64_t period_ms = 0;
  int calendar = 0;            // core::CalendarPeriod (0 = none: period_ms applies)
  std::int64_t offset_ms = 0;  // a calendar period's offset east of UTC
  std::int64_t idx = -1;       // period of `mine` per the last reply; -1 before the first
  std::int64_t pushed = 0;     // `mine` at the last acknowledged push
  std::int64_t allowance = 0;  // granted by the last reply (plus an outage's extra)
  std::int64_t remaining = 0;  // limit - total - others' allowances at the last reply
  std::int64_t seen_free = 0;
  double waiting = 0;  // nano-USD that waiting requests need (refill())
  Instant last_sync{};
  Instant last_used{};
  Instant keep_until{};  // as LeaseCtl::keep_until
  Instant period_end = Instant::max();
  // Spend in `mine` carried from scopes of other periods (carry_period_spend), by the set of periods'
  // hashes in Redis that count it already (period_hash()s, each followed by '\n', sorted; "" = none
  // known): spend carried back into one of them (day -> month -> day) is not pushed there again. At most
  // kCarriedMax entries.
  std::vector<std::pair<std::string, std::int64_t>> carried;
  static constexpr std::size_t kCarriedMax = 8;
  // Of `carried`, what the current period's hash counts already under another member of this replica:
  // set at the first reply (when the period is known), dropped when the period rolls. A push sends
  // mine - skip, and the others' spend is total - pushed - skip.
  std::int64_t skip = 0;
  // Members of retired scopes folded into this one (fold_retired) whose fields in the period's hash are
  // still to be merged into this one's: sent with each push (budget.lua's fold list, idempotent) until a
  // reply acknowledges them. At most kFoldsMax: a scope with that many waiting folds no more until then.
  std::vector<std::string> folds;
  static constexpr std::size_t kFoldsMax = 64;
};

// One scope's state. Worker-shared parts first, each on its own cache line;
// the *Ctl parts are the control thread's. Chunks of these never move, so
// grow() can add scopes while workers read the existing ones.
struct RedisLimiter::ScopeState {
  Lease lease[2];  // per Bucket
  Slots slots;
  Spend spend;
  // Read-only after init.
  Spec spec[2];
  std::int64_t max_streams = 0;
  // Control thread.
  LeaseCtl lease_ctl[2];
  SlotsCtl slots_ctl;
  SpendCtl spend_ctl;
  // This scope's field in the shared hashes (slots.lua, budget.lua): the
  // replica's id and the scope's index, so two scopes of one name here (a
  // key whose limits changed, and its requests still in flight) never
  // overwrite each other's stream slots or pushed spend.
  std::string member;
  // Times this scope was reused (reset_scope): its member names it past the first.
  std::uint32_t generation = 0;
  // Control thread: the scope that took over this one's stream slots (supersede_slots), whose `took_over`
  // names this one until it is reused.
  std::uint32_t superseded_by = 0xffffffffu;
  // The scope this one continues within the same budget period (a carry
  // whose period did not change; kNoScope otherwise): this replica's spend
  // of the period is also under that scope's member, and a later change of
  // period carries it too (carry_period_spend).
  static constexpr std::uint32_t kNoScope = 0xffffffffu;
  std::atomic<std::uint32_t> continues{kNoScope};
  // The scope that continues this one within the same budget period (the reverse of `continues`; control
  // thread): once this one has no reservation in flight, its spend folds into that one (fold_retired).
  std::uint32_t successor = kNoScope;
  // Set once this scope's spend was folded into that scope (kNoScope: not folded); never cleared. Workers
  // follow it (spend_home): a late reservation or settlement of a ticket of this scope goes there.
  std::atomic<std::uint32_t> folded_into{kNoScope};
  // Control thread: the sync's walk that last visited this scope, and the last one that sent it a command.
  std::uint64_t visited = 0;
  std::uint64_t sent = 0;
};

// One command of a sync's pipeline and what its reply applies to.
struct RedisLimiter::SyncOp {
  enum class Kind : std::uint8_t { lease, slots, spend, probe } kind;
  std::uint32_t i;                   // lease: scope * 2 + bucket; slots, spend: the scope
  std::int64_t a = 0, b = 0, c = 0;  // lease: ask, put, owe; slots: want, floor, demand; spend: mine, in use, folds
  bool for_waiters = false;          // requests wait for this grant: keep it until they retried
};

// A sync's pipeline as sync_once builds it.
struct RedisLimiter::SyncPlan {
  Instant now;
  bool deg = false;         // an outage goes on
  bool final_sync = false;  // shutdown's: everything goes back
  std::vector<store::Command> cmds;
  std::vector<SyncOp> ops;  // one per command, in order
};

struct RedisLimiter::Loop {
  explicit Loop(boost::asio::io_context& ioc) : tick(ioc.get_executor()), done(ioc.get_executor()) {}
  core::Timer tick;  // the sync interval; cancelled to wake the loop early
  core::Timer done;  // cancelled when run() returns (shutdown waits on it)
  bool running = false;
  bool sleeping = false;
  bool again = false;
  bool finished = true;
  Instant outage_start{};
  Instant recovered{};  // when Redis was last reachable again after an outage
  // The op whose failure began the outage, which the probe replays: a
  // lease (probe_i = scope * 2 + bucket), stream slots or a budget
  // (probe_i = scope); `key`: the probe writes a key of ours instead.
  enum class Probe : std::uint8_t { key, lease, slots, spend };
  Probe probe_kind = Probe::key;
  std::uint32_t probe_i = UINT32_MAX;
  // The first error of the final sync (shutdown), for the lines about what it did not push.
  std::string final_error;
  bool final_maybe_sent = false;  // that error came after the commands were written (a timeout, a lost connection)
  // A sync's round trip, seconds: follows a slower one at once, a faster
  // one gradually. Leases are sized to cover their demand while a top-up
  // is on its way (sync_once).
  double rtt_s = 0;
};

}  // namespace weir::admission
