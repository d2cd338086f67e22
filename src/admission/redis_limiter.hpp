// Admission state shared by every replica through Redis: token buckets,
// stream slots and budget spend, answered on worker threads from local
// leases that a control-plane coroutine keeps topped up (docs/admission.md,
// "Distributed mode").
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "admission/limiter.hpp"
#include "admission/local_limiter.hpp"
#include "admission/redis_config.hpp"
#include "auth/policy.hpp"
#include "store/redis_client.hpp"

namespace weir::admission {

// A Limiter whose limits hold across every Weir replica that shares a Redis.
//
// Workers (take, give_back, charge, acquire/release_stream, spent,
// reserve_spend, settle_spend, view) never wait and never lock: each (scope, bucket) has one
// atomic lease counter of whole units this replica may admit; a take is one
// CAS on it. A control-plane coroutine (the `control` io_context, one
// thread) syncs every `sync_interval` in one pipelined round trip:
//  - leases below half their target that were used recently are topped up
//    by lease.lua: the global bucket refills by Redis TIME and grants
//    min(asked, available); debt (usage above the estimate) is pushed to the
//    global bucket; leases above twice the target or untouched for
//    `lease_idle` go back;
//  - stream slots are leased the same way from a per-scope hash of
//    replica → (slots held, expiry), so a crashed replica's slots expire
//    after `slot_ttl` (slots.lua);
//  - each budget is leased the same way, in nano-USD: budget.lua pushes
//    this replica's running total of settled spend for the UTC-aligned
//    period (idempotent: a retried push cannot count twice) and grants an
//    allowance for reservations so that every replica's allowance plus the
//    period's spend stay within the limit; workers reserve a request's
//    worst-case cost from the allowance with one CAS.
// A take that finds its lease short while the global bucket may have units
// returns `pending`; Admission::admit then reports a Shortfall and the
// gateway waits (async_refill) for an immediate sync, and again while the
// answer is pending, up to refill_patience().
//
// Outage (a sync times out after `command_timeout`, the connection is
// refused or lost, or Redis answers an error reply to our scripts other
// than one about a single key's data, key_data_error(); while it lasts the
// loop probes by replaying the op that failed, never a PING): fail_open = true routes the buckets to a LocalLimiter
// (every limit × fail_open_share, per replica) and sets stream allowances to
// the local share; fail_open = false makes refusing() true (503). Spend keeps
// accumulating locally against the last known total. The client reconnects
// with backoff; the first successful sync resumes distributed limits. Both
// transitions are logged (never dropped by the log's rate limit) and
// counted (stats()).
//
// Threads: construct, start() and shutdown() on the control thread (or before
// it runs); the Limiter calls from workers; stats()/degraded() from any
// thread. Destroy after shutdown() completed and after the control
// io_context stopped (handlers posted by refill() point at this object).
// The Lua source of the budget script (KEYS and ARGV in redis_limiter.cpp),
// for tests that run it against a real Redis with their own arguments.
const std::string& budget_lua_text();

class RedisLimiter final : public Limiter {
 public:
  using LogFn = std::function<void(std::string_view)>;

  // `scopes`: AuthPolicy::scopes() (a scope's Redis identity is its name,
  // "tenant:NAME" or "key:ID", so replicas with the same names share state).
  // `workers`: worker threads. `epoch`: origin of the steady time axis.
  // `log`: one line per state change (outage, recovery, connection);
  // default: stderr with a "weir: redis: " prefix.
  RedisLimiter(boost::asio::io_context& control, const std::vector<auth::ScopeInfo>& scopes, std::uint32_t workers,
               RedisConfig config, Instant epoch, LogFn log = {});
  ~RedisLimiter() override;
  RedisLimiter(const RedisLimiter&) = delete;
  RedisLimiter& operator=(const RedisLimiter&) = delete;

  // Connects and starts the sync loop; the first sync (reading every
  // budget) starts at once.
  void start();
  // Stops syncing, gives back every lease and stream slot headroom, pushes
  // the spend and debt, and closes the connection. A client waiting to
  // reconnect connects at once for that: at most connect_timeout +
  // command_timeout. Spend or debt that does not reach Redis is logged per
  // budget and bucket. Waiters still queued are completed. Call after the
  // workers drained.
  store::Task<void> shutdown();

  // --- Limiter ---
  std::uint32_t workers() const noexcept override { return workers_; }
  TakeResult take(std::uint32_t scope, Bucket b, std::uint32_t worker, double cost, Instant now) override;
  void give_back(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) override;
  void charge(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) override;
  // Approximate: the global bucket as of the last sync, refilled since, plus this replica's lease.
  BucketView view(std::uint32_t scope, Bucket b, Instant now) const override;
  // The shared bucket as one (Limiter's default); while failing open, the
  // local fallback's (its shards') answer, as take() is then.
  std::uint32_t seconds_until(std::uint32_t scope, Bucket b, double cost, Instant now) const override;
  std::uint32_t millis_until(std::uint32_t scope, Bucket b, double cost, Instant now) const override;
  bool acquire_stream(std::uint32_t scope, std::uint32_t worker) override;
  void release_stream(std::uint32_t scope, std::uint32_t worker) override;
  // This replica's slots in use.
  std::uint64_t streams_in_use(std::uint32_t scope) const override;
  // Every replica's settled spend in the current period as of the last
  // read-back, plus this replica's since.
  std::int64_t spent(std::uint32_t scope, Instant now) override;
  // The budget's current window as Redis counts it (the period number of the
  // last reply, from Redis TIME: the clock of the spend and of Retry-After),
  // Unix ns; before the first reply, the default (the local clock's).
  BudgetWindow budget_window(std::uint32_t scope, const auth::Budget& b, Instant now) const override;
  // From this replica's allowance (one CAS); `pending` when it is short but
  // the budget no replica holds could cover the request. `*period` is
  // always 0: a reservation that crosses a period rollover is charged to
  // the new period (settle_spend), as in-process.
  TakeResult reserve_spend(std::uint32_t scope, std::int64_t nano_usd, Instant now) override;
  std::uint32_t budget_retry_after_ms(std::uint32_t scope, std::int64_t nano_usd, Instant now) const override;
  void settle_spend(std::uint32_t scope, std::int64_t reserved, std::int64_t actual, Instant now) override;
  bool streams_refillable(std::uint32_t scope) const noexcept override;
  void refill(const Shortfall& need, std::uint32_t worker, std::function<void()> done) override;
  // A slot waiter's wait (three renewals of a busy holder: 3 × max(5 ×
  // sync_interval, 100 ms)) plus one round trip's command_timeout; 0 while
  // degraded or stopping (refill() answers at once then), and when `need`
  // has a stream slot of a cap other replicas hold slots of (their fair
  // shares: slots.lua; a request waiting on would hold its replica's claim
  // against the one that is starved).
  std::chrono::milliseconds refill_patience(const Shortfall& need) const noexcept override;
  // Adds the scopes of `scopes` past the ones held (control thread only;
  // see Limiter::grow). A new scope's shared state is found by its name, so
  // a key created on any replica shares its buckets, stream slots and
  // budget with that key on every other replica; its first budget
  // reservation waits for one sync. False past kMaxScopes.
  bool grow(const std::vector<auth::ScopeInfo>& scopes) override;
  bool append_scope(const auth::ScopeInfo& info) override;
  // Scopes `from` and `to` share a name, hence their state in Redis: the
  // fail-open fallback's local state is carried, and, when the budget's
  // period changed (another count in Redis), this replica's settled spend.
  void carry_spend(std::uint32_t from, std::uint32_t to, Instant now) override;
  void carry(std::uint32_t from, std::uint32_t to, Instant now) override;
  bool grows() const noexcept override { return true; }
  // A scope nothing holds any more is reused once drained (drained()): its
  // leases, stream slots and allowance given back to Redis, its spend pushed,
  // or folded into its successor's (fold_retired). A reused scope writes
  // Redis under a member of its own (`<replica>/<scope>.<generation>`), so
  // nothing its old occupant left there (a slot count until it expires, a
  // removed tenant's pushed spend) is taken for its own.
  bool recycles() const noexcept override { return true; }
  std::uint32_t scope_count() const noexcept override { return static_cast<std::uint32_t>(scope_count_); }
  static constexpr std::uint32_t kChunk = 64;
  static constexpr std::uint32_t kMaxScopes = kChunk * 4096;
  // An `others` of stream slots older than this (ns) is asked again before
  // a request is refused on it (streams_refillable).
  static constexpr double kSlotsStaleNs = 100e6;

  // True during an outage (fallback or refusing).
  bool degraded() const noexcept { return degraded_.load(std::memory_order_relaxed); }
  // True once a sync succeeded (budgets have been read).
  bool synced() const noexcept { return synced_.load(std::memory_order_acquire); }
  // Units this replica holds in the lease of (scope, b); negative = debt. For tests and metrics.
  std::int64_t lease_units(std::uint32_t scope, Bucket b) const noexcept;
  // Budget of `scope` this replica may still reserve, nano-USD (its allowance
  // minus reservations in flight and unpushed spend). For tests and metrics.
  std::int64_t budget_free(std::uint32_t scope) const noexcept;
  const std::string& replica_id() const noexcept { return replica_id_; }

  struct Stats {
    bool degraded = false;
    std::uint64_t outages = 0;         // transitions into degraded
    std::uint64_t syncs = 0;           // round trips that succeeded
    std::uint64_t sync_failures = 0;   // round trips that failed (timeout, refused, lost)
    std::uint64_t leases = 0;          // lease.lua calls
    std::uint64_t units_granted = 0;   // units granted by lease.lua (requests + tokens)
    std::uint64_t refills = 0;         // refill() calls (requests that waited)
    std::uint64_t fallback_takes = 0;  // takes answered by the local fallback
    std::uint64_t key_errors = 0;      // script calls failed by one key's data (key_data_error): no outage
    std::uint64_t key_resets = 0;      // keys the scripts found unusable and reset (wrong type, bad fields)
    std::uint64_t walks = 0;           // syncs' walks of the scopes (plan_walk)
    std::uint64_t scopes_walked = 0;   // scopes those walks visited
    // Redis's maxmemory-policy evicts keys (anything but noeviction): virtual keys, budgets and
    // buckets can vanish under memory pressure (docs/admission.md). Checked once per connection.
    bool evicting = false;
  };
  Stats stats() const noexcept;

 private:
  struct Lease;
  struct LeaseCtl;
  struct Slots;
  struct SlotsCtl;
  struct Spend;
  struct SpendCtl;
  struct Loop;
  struct Spec;
  struct ScopeState;

  store::Task<void> run();
  store::Task<void> sync_once(bool final_sync);
  // Limiter's reuse of free scopes (control thread).
  bool drained(std::uint32_t scope) const noexcept override;
  void reset_scope(std::uint32_t scope, const auth::ScopeInfo& info) override;
  // sync_once's steps. A sync's pipeline: one command per op (a lease, stream slots or a budget of a scope
  // the walk visits, or the outage's probe), built by the plan_* steps in order.
  struct SyncOp;
  using Op = SyncOp;
  struct SyncPlan;
  void plan_leases(SyncPlan& p);   // top-ups, give-backs and debt of the visited buckets (not during an outage)
  void plan_slots(SyncPlan& p);    // stream slot renewals
  void plan_budgets(SyncPlan& p);  // pushes of settled spend, allowances, folds of retired scopes
  void plan_probe(SyncPlan& p);    // during an outage: the op that failed, replayed
  // The key an op's script works on (a budget's base key: the script names the period's).
  const std::string& op_key(const SyncOp& op) const;
  // Reads the replies for errors: the first that is an outage's (its reason returned, "" for none;
  // `answered`: Redis replied with an error), logging keys of bad data, which are no outage.
  std::string read_errors(const SyncPlan& p, const std::vector<store::Result<store::Reply>>& results, bool& answered);
  // Applies a reply to its scope (`replied`: when it came; `grace`: how long a grant to waiting requests is
  // kept; `frozen`: an outage goes on, the stream allowances stay the local share).
  void apply_lease(const SyncOp& op, const store::Result<store::Reply>& r, Instant replied,
                   std::chrono::milliseconds grace);
  void apply_slots(const SyncOp& op, const store::Result<store::Reply>& r, Instant replied,
                   std::chrono::milliseconds grace, bool frozen);
  void apply_spend(const SyncOp& op, const store::Result<store::Reply>& r, Instant replied,
                   std::chrono::milliseconds grace);
  // Once per connection: asks Redis for its maxmemory-policy (INFO memory,
  // else CONFIG GET), sets evicting_ and warns when it evicts.
  store::Task<void> check_eviction();
  void wake();
  void on_refill(const Shortfall& need, std::function<void()> done);
  // `answered`: Redis replied with an error (it is up but cannot do our work).
  void enter_degraded(const std::string& why, bool answered);
  struct SlotWaiter;
  // After a sync: completes the requests waiting for a stream slot, or keeps
  // them for the next sync (every one when `all`).
  void settle_slot_waiters(std::vector<SlotWaiter> waiters, bool all, std::chrono::milliseconds grace);
  void leave_degraded();
  // After the final sync: one line per budget whose spend, and per bucket
  // whose debt, did not reach Redis (lost with this process).
  void report_unpushed();
  // A script's "what was reset" reply element: logged when not empty.
  void note_reset(const std::string& what);
  // Chatter (connection lines, a key reset): rate limited, see log_line().
  void log(std::string_view msg) const;
  // A line that carries state (an outage begins or ends, spend lost at
  // exit): never dropped by the rate limit, though it uses its allowance.
  void log_state(std::string_view msg) const;
  void log_line(std::string_view msg, bool always) const;
  // Initialises scopes [scope_count_, scopes.size()) (constructor, grow()).
  bool add_scopes(const std::vector<auth::ScopeInfo>& scopes);
  void init_scope(std::size_t i, const auth::ScopeInfo& info);  // scope i's state (add_scopes, append_scope)
  // carry()'s part for a budget whose period changed (another hash in Redis).
  void carry_period_spend(std::uint32_t from, std::uint32_t to);
  // The sync's step for a retired scope `p` (a successor continues it in the same period): once it has no
  // reservation in flight and both know the period, its spend (settled, pushed or not, and carried), its
  // allowance and its member in the period's hash fold into the successor's (budget.lua merges the
  // member's running total into the successor's at its next push), and it is forgotten: it pushes no
  // more, and a late operation of one of its tickets goes to the successor (spend_home). So a process
  // keeps one member per budget however many reloads or PATCHes changed its scope. Control thread; true
  // when `p` is folded (now or before): the sync sends nothing for its budget.
  bool fold_retired(std::uint32_t p);
  // The scope whose spend state `scope`'s budget operations use: `scope`, or the one it was folded into
  // (followed: at most 64 links, each to a scope made later).
  std::uint32_t spend_home(std::uint32_t scope) const noexcept;
  // Adds `parts` (hash sets and spend, as SpendCtl::carried) to `into`, merging equal sets; beyond
  // kCarriedMax the oldest count as of no known hash (pushed: an overcount, never an overspend).
  static void merge_carried(std::vector<std::pair<std::string, std::int64_t>>& into,
                            std::vector<std::pair<std::string, std::int64_t>> parts);
  // The Redis hash budget.lua counts period `idx` of budget `c` in (its key(idx)).
  static std::string period_hash(const SpendCtl& c, std::int64_t idx);
  // A set of hashes as SpendCtl::carried keeps it: `set` with `hash` added, and whether it holds `hash`.
  static std::string with_hash(const std::string& set, const std::string& hash);
  static bool holds_hash(const std::string& set, const std::string& hash);
  // carry()'s part during an outage: the budget's unreserved allowance moves from `from` to `to`
  // (move_allowance()); with Redis up nothing moves (the new scope asks Redis, the old gives its back).
  void carry_allowance(std::uint32_t from, std::uint32_t to);
  // What an outage's carry moves (carry_allowance's doc), whenever it is called: at the reload during an
  // outage, or when an outage begins for a successor Redis never answered for (enter_degraded).
  void move_allowance(std::uint32_t from, std::uint32_t to);
  void supersede_slots(std::uint32_t from, std::uint32_t to);
  ScopeState& at(std::uint32_t scope) const noexcept;
  // The sync's walk: every scope on a full walk (every full_walk_every(), during an outage, the final
  // sync), else the scopes the last walk found busy, those a refill named since and those added since.
  // A quiet scope (quiet()) has nothing to sync until a request uses it, which its refill says; thousands
  // of idle keys in Redis with limits cost one walk of them a second, not one every sync_interval.
  void plan_walk(bool full, Instant now);
  // Holds, owes and wants nothing, unused for lease_idle, its budget pushed: nothing for a sync to do.
  bool quiet(std::uint32_t scope, Instant now) const noexcept;
  std::chrono::milliseconds full_walk_every() const noexcept;
  double remote_estimate(const Lease& l, std::uint32_t i, Instant now) const noexcept;
  double ns(Instant t) const noexcept;

  boost::asio::io_context& control_;
  RedisConfig config_;
  std::uint32_t workers_;
  Instant epoch_;
  LogFn log_;
  std::string replica_id_;
  std::size_t scope_count_ = 0;  // written by the control thread only
  std::unique_ptr<LocalLimiter> fallback_;
  std::unique_ptr<store::Client> client_;
  // Scope i is chunks_[i / kChunk][i % kChunk]; a chunk is allocated whole
  // and never moves (workers read scopes while grow() adds others).
  std::unique_ptr<std::unique_ptr<ScopeState[]>[]> chunks_;

  std::unique_ptr<Loop> loop_;
  // log()'s rate limit (control thread).
  mutable double log_tokens_ = 20;
  mutable Instant log_at_{};
  mutable std::uint64_t log_dropped_ = 0;
  // Keys whose script failed with key_data_error() and were logged; a key
  // leaves the set when its script works again (control thread).
  std::unordered_set<std::string> bad_keys_;
  std::uint64_t policy_checked_ = 0;  // the client's connection count when check_eviction() last got an answer
  std::string policy_warned_;         // the evicting policy last warned of (empty: none)
  std::vector<std::function<void()>> waiters_;
  // The walk (control thread): see plan_walk().
  std::vector<std::uint32_t> visit_;  // this sync's scopes (its storage reused)
  std::vector<std::uint32_t> busy_;   // scopes the last walk did not find quiet
  std::vector<std::uint32_t> woken_;  // scopes refills named since the last walk
  std::size_t walked_ = 0;            // scope_count_ at the last walk: scopes past it are new
  std::uint64_t walk_no_ = 0;
  bool syncing_ = false;  // a sync's commands are out: its replies apply to the scopes walk_no_ sent them for
  Instant next_full_walk_{};
  // Requests waiting for a stream slot that another replica holds idle: kept
  // across syncs (each re-asks) until a slot came, the cap is full of
  // streams in flight, or `until` (a few renewals of the holder).
  struct SlotWaiter {
    std::function<void()> done;
    Shortfall need;
    Instant until;
  };
  std::vector<SlotWaiter> slot_waiters_;

  alignas(64) std::atomic<bool> degraded_{false};
  std::atomic<bool> synced_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> evicting_{false};
  std::atomic<std::uint64_t> outages_{0}, syncs_{0}, sync_failures_{0}, leases_n_{0}, units_granted_{0}, refills_{0},
      fallback_takes_{0}, key_errors_{0}, key_resets_{0}, walks_{0}, scopes_walked_{0};
};

}  // namespace weir::admission
