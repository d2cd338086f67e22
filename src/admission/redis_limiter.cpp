#include "admission/redis_limiter.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "admission/redis_scripts.hpp"

namespace weir::admission {

namespace {

namespace asio = boost::asio;
using core::Timer;
using core::use_task;
constexpr double kEps = 1e-9;

std::int64_t whole_up(double x) { return static_cast<std::int64_t>(std::ceil(x - kEps)); }
std::int64_t whole_down(double x) { return static_cast<std::int64_t>(std::floor(x + kEps)); }

std::uint64_t scale(std::uint64_t v, double share) {
  if (v == 0) return 0;
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(static_cast<double>(v) * share)));
}

std::vector<auth::ScopeInfo> scaled(const std::vector<auth::ScopeInfo>& scopes, double share) {
  std::vector<auth::ScopeInfo> out = scopes;
  for (auto& s : out) {
    s.limits.requests_per_minute = scale(s.limits.requests_per_minute, share);
    s.limits.tokens_per_minute = scale(s.limits.tokens_per_minute, share);
    s.limits.requests_burst = scale(s.limits.requests_burst, share);
    s.limits.tokens_burst = scale(s.limits.tokens_burst, share);
    s.limits.max_concurrent_streams = scale(s.limits.max_concurrent_streams, share);
  }
  return out;
}

// Errors that mean "Redis cannot serve us now" (as opposed to a bug in a request).
bool is_outage(const store::Error& e) {
  if (e.code != store::Errc::server) return true;
  for (std::string_view p :
       {"LOADING", "BUSY", "MASTERDOWN", "READONLY", "OOM", "NOAUTH", "WRONGPASS", "NOPERM", "CLUSTERDOWN", "TRYAGAIN"})
    if (std::string_view(e.message).starts_with(p)) return true;
  return false;
}

// Takes the units above `keep` out of `units` (workers may be taking at the
// same time); returns what it took.
std::int64_t take_above(std::atomic<std::int64_t>& units, std::int64_t keep) {
  std::int64_t cur = units.load(std::memory_order_relaxed);
  while (cur > keep) {
    if (units.compare_exchange_weak(cur, keep, std::memory_order_acq_rel, std::memory_order_relaxed)) return cur - keep;
  }
  return 0;
}

std::string random_id() {
  std::random_device rd;
  std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:016x}", v);
}

}  // namespace

struct RedisLimiter::Spec {
  bool enabled = false;
  double rate_per_min = 0;
  double depth = 0;
};

struct alignas(64) RedisLimiter::Lease {
  std::atomic<std::int64_t> units{0};    // whole units this replica may admit; < 0 = debt not yet pushed
  std::atomic<bool> wanted{false};       // a take found it short since the last sync
  std::atomic<double> remote_avail{0};   // units in the global bucket at the last reply
  std::atomic<double> remote_at_ns{-1};  // when (ns since epoch_); < 0 = never synced
};

struct RedisLimiter::LeaseCtl {
  std::string key;
  std::int64_t target = 1;  // units a busy replica holds
  std::int64_t low = 1;     // top up below this
  std::int64_t high = 2;    // give back above this
  std::int64_t seen = 0;    // units after the last sync: a change means use
  Instant last_used{};
  Instant keep_until{};  // units granted to waiting requests are not given back before their retry
  double waiting = 0;    // units that waiting requests need (refill())
};

struct alignas(64) RedisLimiter::Slots {
  std::atomic<std::int64_t> free{0};       // allowance - in use (< 0 after a shrink)
  std::atomic<std::int64_t> allowance{0};  // slots this replica may hold (written by the control thread)
  std::atomic<std::int64_t> others{0};     // slots the other replicas held at the last renewal
  std::atomic<bool> wanted{false};
};

struct RedisLimiter::SlotsCtl {
  std::string key;
  std::int64_t headroom = 1;   // free slots a busy replica keeps
  std::int64_t low = 1;        // renew below this many free
  std::int64_t local_max = 1;  // allowance during an outage with fail_open
  std::int64_t seen_free = 0;
  std::int64_t waiting = 0;
  std::int64_t told_want = 0;  // the want Redis last recorded for this replica
  bool contended = false;      // another replica was starved at the last renewal
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
};

struct RedisLimiter::Loop {
  explicit Loop(boost::asio::io_context& ioc) : tick(ioc.get_executor()), done(ioc.get_executor()) {}
  Timer tick;  // the sync interval; cancelled to wake the loop early
  Timer done;  // cancelled when run() returns (shutdown waits on it)
  bool running = false;
  bool sleeping = false;
  bool again = false;
  bool finished = true;
  Instant outage_start{};
};

RedisLimiter::RedisLimiter(boost::asio::io_context& control, const std::vector<auth::ScopeInfo>& scopes,
                           std::uint32_t workers, RedisConfig config, Instant epoch, LogFn log)
    : control_(control),
      config_(std::move(config)),
      workers_(std::max<std::uint32_t>(workers, 1)),
      epoch_(epoch),
      log_(std::move(log)),
      replica_id_(random_id()) {
  if (!log_) log_ = [](std::string_view m) { fmt::print(stderr, "weir: redis: {}\n", m); };
  fallback_ = std::make_unique<LocalLimiter>(scaled(scopes, config_.fail_open_share), workers_, epoch_);

  store::ClientOptions co = client_options(config_);
  co.log = [this](std::string_view m) { this->log(m); };
  client_ = std::make_unique<store::Client>(control_, std::move(co));

  chunks_ = std::make_unique<std::unique_ptr<ScopeState[]>[]>(kMaxScopes / kChunk);
  add_scopes(scopes);
  loop_ = std::make_unique<Loop>(control_);
}

bool RedisLimiter::add_scopes(const std::vector<auth::ScopeInfo>& scopes) {
  if (scopes.size() > kMaxScopes) return false;
  const double window_min = static_cast<double>(config_.lease_window.count()) / 60000.0;
  const bool outage = degraded_.load(std::memory_order_relaxed) && config_.fail_open;
  for (std::size_t i = scope_count_; i < scopes.size(); ++i) {
    auto& chunk = chunks_[i / kChunk];
    if (!chunk) chunk = std::make_unique<ScopeState[]>(kChunk);
    ScopeState& st = chunk[i % kChunk];
    const auto& l = scopes[i].limits;
    st.member = fmt::format("{}/{}", replica_id_, i);
    const std::uint64_t rates[2] = {l.requests_per_minute, l.tokens_per_minute};
    const std::uint64_t bursts[2] = {l.requests_burst, l.tokens_burst};
    for (int b = 0; b < 2; ++b) {
      Spec& s = st.spec[b];
      LeaseCtl& c = st.lease_ctl[b];
      c.key = config_.key_prefix + "rl:" + scopes[i].name + (b == 0 ? ":req" : ":tok");
      s.enabled = rates[b] > 0;
      if (!s.enabled) continue;
      s.rate_per_min = static_cast<double>(rates[b]);
      s.depth = static_cast<double>(bursts[b] ? bursts[b] : rates[b]);
      double t = std::max(s.rate_per_min * window_min, b == 0 ? 1.0 : static_cast<double>(config_.lease_min_tokens));
      t = std::min(t, std::max(1.0, s.depth * config_.lease_max_share));
      c.target = std::max<std::int64_t>(1, whole_up(t));
      c.low = (c.target + 1) / 2;
      c.high = 2 * c.target;
    }
    st.max_streams = static_cast<std::int64_t>(l.max_concurrent_streams);
    SlotsCtl& sc = st.slots_ctl;
    sc.key = config_.key_prefix + "slots:" + scopes[i].name;
    if (st.max_streams > 0) {
      const auto m = static_cast<double>(st.max_streams);
      sc.headroom = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(m * config_.lease_max_share)));
      sc.low = (sc.headroom + 1) / 2;
      sc.local_max = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(m * config_.fail_open_share)));
      if (outage) {  // as enter_degraded() gives every scope
        st.slots.allowance.store(sc.local_max, std::memory_order_relaxed);
        st.slots.free.store(sc.local_max, std::memory_order_relaxed);
      }
    }
    SpendCtl& pc = st.spend_ctl;
    pc.enabled = scopes[i].budget.any();
    pc.key = config_.key_prefix + "budget:" + scopes[i].name;
    pc.limit = scopes[i].budget.limit_nano_usd;
    pc.remaining = pc.limit;
    pc.period_ms = scopes[i].budget.period.count();
    pc.calendar = static_cast<int>(scopes[i].budget.calendar);
    pc.offset_ms = std::int64_t{scopes[i].budget.utc_offset_s} * 1000;
    // Before the first reply nobody is known to hold any of the budget.
    st.spend.spare.store(pc.limit, std::memory_order_relaxed);
    if (outage && pc.enabled) {  // as enter_degraded() gives every budget
      const auto extra = static_cast<std::int64_t>(std::floor(static_cast<double>(pc.limit) * config_.fail_open_share));
      st.spend.spare.store(0, std::memory_order_relaxed);
      pc.allowance = extra;
      st.spend.free.store(extra, std::memory_order_relaxed);
    }
  }
  scope_count_ = std::max(scope_count_, scopes.size());
  return true;
}

bool RedisLimiter::grow(const std::vector<auth::ScopeInfo>& scopes) {
  if (scopes.size() <= scope_count_) return true;
  if (scopes.size() > kMaxScopes) return false;
  if (!fallback_->grow(scaled(scopes, config_.fail_open_share))) return false;
  add_scopes(scopes);
  // New budgets are read at once (their first reservation waits for it).
  if (loop_->running) wake();
  return true;
}

void RedisLimiter::carry(std::uint32_t from, std::uint32_t to, Instant now) {
  // The shared state is found by the scope's name, which both scopes share
  // (a tenant or key whose limits or budget changed): its buckets, stream
  // slots and spend go on in Redis as they are. Only the fallback's local
  // state is carried.
  fallback_->carry(from, to, now);
}

void RedisLimiter::carry_spend(std::uint32_t from, std::uint32_t to, Instant now) {
  fallback_->carry_spend(from, to, now);
}

RedisLimiter::ScopeState& RedisLimiter::at(std::uint32_t scope) const noexcept {
  return chunks_[scope / kChunk][scope % kChunk];
}

RedisLimiter::~RedisLimiter() {
  if (client_) client_->stop();
}

void RedisLimiter::log(std::string_view msg) const { log_(msg); }

double RedisLimiter::ns(Instant t) const noexcept {
  return std::chrono::duration<double, std::nano>(t - epoch_).count();
}

double RedisLimiter::remote_estimate(const Lease& l, std::uint32_t i, double now_ns) const noexcept {
  const Spec& s = at(i / 2).spec[i % 2];
  const double at = l.remote_at_ns.load(std::memory_order_relaxed);
  if (at < 0) return s.depth;  // never synced: a bucket nobody used is full
  const double avail = l.remote_avail.load(std::memory_order_relaxed);
  return std::min(s.depth, avail + std::max(0.0, now_ns - at) * s.rate_per_min / 60e9);
}

// ---------------------------------------------------------------- workers

TakeResult RedisLimiter::take(std::uint32_t scope, Bucket b, std::uint32_t worker, double cost, Instant now) {
  if (degraded_.load(std::memory_order_relaxed)) {
    if (!config_.fail_open) return TakeResult{.ok = false, .retry_after_s = 1};
    fallback_takes_.fetch_add(1, std::memory_order_relaxed);
    return fallback_->take(scope, b, worker, cost, now);
  }
  const std::uint32_t i = scope * 2 + static_cast<std::uint32_t>(b);
  const Spec& s = at(i / 2).spec[i % 2];
  if (!s.enabled || cost <= 0) return {};
  if (cost > s.depth + kEps) return TakeResult{.ok = false, .never = true};
  const std::int64_t c = whole_up(cost);
  Lease& l = at(i / 2).lease[i % 2];
  std::int64_t cur = l.units.load(std::memory_order_relaxed);
  while (cur >= c) {
    if (l.units.compare_exchange_weak(cur, cur - c, std::memory_order_acq_rel, std::memory_order_relaxed)) return {};
  }
  // Short: ask the next sync for a top-up even if nobody waits for it.
  if (!l.wanted.load(std::memory_order_relaxed)) l.wanted.store(true, std::memory_order_relaxed);
  const double have = remote_estimate(l, i, ns(now)) + static_cast<double>(cur);
  if (have >= cost - kEps) return TakeResult{.ok = false, .pending = true, .retry_after_s = 1};
  const double deficit = std::max(cost - have, kEps);
  const double secs = std::ceil(deficit * 60.0 / s.rate_per_min - 1e-9);
  return TakeResult{.ok = false, .retry_after_s = static_cast<std::uint32_t>(std::clamp(secs, 1.0, 86400.0))};
}

void RedisLimiter::give_back(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) {
  if (degraded_.load(std::memory_order_relaxed)) {
    if (config_.fail_open) fallback_->give_back(scope, b, worker, amount, now);
    return;
  }
  const std::uint32_t i = scope * 2 + static_cast<std::uint32_t>(b);
  if (!at(i / 2).spec[i % 2].enabled) return;
  const std::int64_t a = whole_down(amount);
  if (a > 0) at(i / 2).lease[i % 2].units.fetch_add(a, std::memory_order_acq_rel);
}

void RedisLimiter::charge(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) {
  if (degraded_.load(std::memory_order_relaxed)) {
    if (config_.fail_open) fallback_->charge(scope, b, worker, amount, now);
    return;
  }
  const std::uint32_t i = scope * 2 + static_cast<std::uint32_t>(b);
  if (!at(i / 2).spec[i % 2].enabled) return;
  const std::int64_t a = whole_up(amount);
  if (a > 0)
    at(i / 2).lease[i % 2].units.fetch_sub(a, std::memory_order_acq_rel);  // may go negative: the next sync pushes the debt
}

BucketView RedisLimiter::view(std::uint32_t scope, Bucket b, Instant now) const {
  if (degraded_.load(std::memory_order_relaxed) && config_.fail_open) return fallback_->view(scope, b, now);
  const std::uint32_t i = scope * 2 + static_cast<std::uint32_t>(b);
  const Spec& s = at(i / 2).spec[i % 2];
  BucketView v;
  if (!s.enabled) return v;
  const Lease& l = at(i / 2).lease[i % 2];
  const double total = std::clamp(
      remote_estimate(l, i, ns(now)) + static_cast<double>(l.units.load(std::memory_order_relaxed)), 0.0, s.depth);
  v.limit = static_cast<std::uint64_t>(s.rate_per_min);
  v.remaining = static_cast<std::uint64_t>(std::floor(total + kEps));
  v.reset_ms = static_cast<std::uint64_t>(std::ceil((s.depth - total) * 60000.0 / s.rate_per_min - 1e-9));
  return v;
}

bool RedisLimiter::acquire_stream(std::uint32_t scope, std::uint32_t /*worker*/) {
  if (at(scope).max_streams == 0) return true;
  Slots& s = at(scope).slots;
  std::int64_t cur = s.free.load(std::memory_order_relaxed);
  while (cur > 0) {
    if (s.free.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel, std::memory_order_relaxed)) return true;
  }
  if (!s.wanted.load(std::memory_order_relaxed)) s.wanted.store(true, std::memory_order_relaxed);
  return false;
}

void RedisLimiter::release_stream(std::uint32_t scope, std::uint32_t /*worker*/) {
  if (at(scope).max_streams == 0) return;
  at(scope).slots.free.fetch_add(1, std::memory_order_acq_rel);
}

std::uint64_t RedisLimiter::streams_in_use(std::uint32_t scope) const {
  if (at(scope).max_streams == 0) return 0;
  const Slots& s = at(scope).slots;
  const std::int64_t used = s.allowance.load(std::memory_order_acquire) - s.free.load(std::memory_order_acquire);
  return used > 0 ? static_cast<std::uint64_t>(used) : 0;
}

bool RedisLimiter::streams_refillable(std::uint32_t scope) const noexcept {
  if (degraded_.load(std::memory_order_relaxed) || at(scope).max_streams == 0) return false;
  const Slots& s = at(scope).slots;
  return s.others.load(std::memory_order_relaxed) + s.allowance.load(std::memory_order_relaxed) < at(scope).max_streams;
}

std::int64_t RedisLimiter::spent(std::uint32_t scope, Instant /*now*/) {
  Spend& sp = at(scope).spend;
  if (!sp.touched.load(std::memory_order_relaxed)) sp.touched.store(true, std::memory_order_relaxed);
  return sp.others.load(std::memory_order_acquire) + sp.mine.load(std::memory_order_acquire);
}

TakeResult RedisLimiter::reserve_spend(std::uint32_t scope, std::int64_t nano_usd, Instant now, std::uint32_t* period) {
  const SpendCtl& c = at(scope).spend_ctl;  // enabled, limit and period_ms are read-only after construction
  if (!c.enabled) return {};
  Spend& sp = at(scope).spend;
  if (!sp.touched.load(std::memory_order_relaxed)) sp.touched.store(true, std::memory_order_relaxed);
  if (period) *period = 0;  // settle_spend treats every period alike (see there)
  if (nano_usd > c.limit) return TakeResult{.ok = false, .never = true};
  if (c.limit == 0) return TakeResult{.ok = false};
  if (nano_usd == 0) {
    // A free request: admitted while the budget is not spent.
    return spent(scope, now) < c.limit ? TakeResult{} : TakeResult{.ok = false};
  }
  if (nano_usd > sp.biggest.load(std::memory_order_relaxed)) sp.biggest.store(nano_usd, std::memory_order_relaxed);
  std::int64_t cur = sp.free.load(std::memory_order_relaxed);
  while (cur >= nano_usd) {
    if (sp.free.compare_exchange_weak(cur, cur - nano_usd, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      sp.in_use.fetch_add(nano_usd, std::memory_order_acq_rel);
      return {};
    }
  }
  if (!sp.wanted.load(std::memory_order_relaxed)) sp.wanted.store(true, std::memory_order_relaxed);
  // Short here: the budget no replica holds may still cover it (not during an outage).
  if (!degraded_.load(std::memory_order_relaxed) &&
      sp.spare.load(std::memory_order_relaxed) + std::max<std::int64_t>(cur, 0) >= nano_usd)
    return TakeResult{.ok = false, .pending = true, .retry_after_s = 1};
  // When it can admit again: the replicas' settled spend leaves room (only
  // reservations in flight, here or on other replicas, are in the way), or
  // the period ends (as Redis counts it), or never.
  const std::int64_t settled = spent(scope, now);
  if (settled < c.limit && settled + nano_usd <= c.limit) return TakeResult{.ok = false, .retry_after_s = 1};
  if (c.period_ms <= 0 && c.calendar == 0) return TakeResult{.ok = false};
  const std::int64_t end = sp.period_end_ns.load(std::memory_order_relaxed);
  const auto left = end < 0 ? std::int64_t{1'000'000'000} : end - static_cast<std::int64_t>(ns(now));
  return TakeResult{.ok = false, .retry_after_s = whole_seconds_up(left)};
}

void RedisLimiter::settle_spend(std::uint32_t scope, std::int64_t reserved, std::int64_t actual,
                                std::uint32_t /*period*/, Instant /*now*/) {
  // A reservation from an earlier period still counts in in_use (Redis
  // granted this period's allowance with it), so both cases settle alike:
  // the cost is charged to the current period.
  if (!at(scope).spend_ctl.enabled) return;
  Spend& sp = at(scope).spend;
  if (reserved != 0) sp.in_use.fetch_sub(reserved, std::memory_order_acq_rel);
  if (reserved != actual) sp.free.fetch_add(reserved - actual, std::memory_order_acq_rel);
  if (actual > 0) sp.mine.fetch_add(actual, std::memory_order_acq_rel);
  if (!sp.touched.load(std::memory_order_relaxed)) sp.touched.store(true, std::memory_order_relaxed);
}

void RedisLimiter::refill(const Shortfall& need, std::uint32_t /*worker*/, std::function<void()> done) {
  refills_.fetch_add(1, std::memory_order_relaxed);
  if (degraded_.load(std::memory_order_relaxed) || stopping_.load(std::memory_order_relaxed)) {
    done();
    return;
  }
  // The slow path's one cross-thread step (Asio's scheduler takes its mutex briefly).
  asio::post(control_, [this, need, done = std::move(done)]() mutable { on_refill(need, std::move(done)); });
}

std::int64_t RedisLimiter::lease_units(std::uint32_t scope, Bucket b) const noexcept {
  return at(scope).lease[static_cast<std::uint32_t>(b)].units.load(std::memory_order_acquire);
}

std::int64_t RedisLimiter::budget_free(std::uint32_t scope) const noexcept {
  return at(scope).spend.free.load(std::memory_order_acquire);
}

RedisLimiter::Stats RedisLimiter::stats() const noexcept {
  Stats s;
  s.degraded = degraded();
  s.outages = outages_.load(std::memory_order_relaxed);
  s.syncs = syncs_.load(std::memory_order_relaxed);
  s.sync_failures = sync_failures_.load(std::memory_order_relaxed);
  s.leases = leases_n_.load(std::memory_order_relaxed);
  s.units_granted = units_granted_.load(std::memory_order_relaxed);
  s.refills = refills_.load(std::memory_order_relaxed);
  s.fallback_takes = fallback_takes_.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------- control plane

void RedisLimiter::start() {
  if (loop_->running) return;
  loop_->running = true;
  loop_->finished = false;
  loop_->again = true;  // the first sync (every budget) at once
  loop_->done.expires_at(Timer::time_point::max());
  client_->start();
  asio::co_spawn(control_, run(), asio::detached);
}

void RedisLimiter::wake() {
  if (loop_->sleeping)
    loop_->tick.cancel();
  else
    loop_->again = true;
}

void RedisLimiter::on_refill(const Shortfall& need, std::function<void()> done) {
  if (!loop_->running || degraded_.load(std::memory_order_relaxed)) {
    done();
    return;
  }
  for (std::uint8_t k = 0; k < need.count && k < Shortfall::kMax; ++k) {
    const Need& n = need.needs[k];
    if (n.scope >= scope_count_) continue;
    if (n.what == Resource::streams)
      at(n.scope).slots_ctl.waiting += std::max<std::int64_t>(1, whole_up(n.units));
    else if (n.what == Resource::budget)
      at(n.scope).spend_ctl.waiting += n.units;
    else
      at(n.scope).lease_ctl[n.what == Resource::tokens ? 1 : 0].waiting += n.units;
  }
  waiters_.push_back(std::move(done));
  wake();
}

store::Task<void> RedisLimiter::run() {
  while (loop_->running) {
    if (!loop_->again) {
      loop_->sleeping = true;
      loop_->tick.expires_after(config_.sync_interval);
      co_await loop_->tick.async_wait(use_task);
      loop_->sleeping = false;
      if (!loop_->running) break;
    }
    loop_->again = false;
    co_await sync_once(false);
  }
  loop_->finished = true;
  loop_->done.cancel();
}

store::Task<void> RedisLimiter::shutdown() {
  stopping_.store(true, std::memory_order_relaxed);
  loop_->running = false;
  loop_->tick.cancel();
  if (!loop_->finished) co_await loop_->done.async_wait(use_task);
  co_await sync_once(true);
  client_->stop();
  auto waiters = std::move(waiters_);
  waiters_.clear();
  for (auto& w : waiters) w();
}

void RedisLimiter::enter_degraded(const std::string& why) {
  if (degraded_.load(std::memory_order_relaxed)) return;
  loop_->outage_start = MonoClock::now();
  outages_.fetch_add(1, std::memory_order_relaxed);
  if (config_.fail_open) {
    // Stream slots: the local share of each limit while Redis cannot arbitrate.
    for (std::uint32_t i = 0; i < scope_count_; ++i) {
      if (at(i).max_streams == 0) continue;
      Slots& s = at(i).slots;
      const std::int64_t a = s.allowance.load(std::memory_order_relaxed);
      s.allowance.store(at(i).slots_ctl.local_max, std::memory_order_release);
      s.free.fetch_add(at(i).slots_ctl.local_max - a, std::memory_order_acq_rel);
    }
  }
  if (config_.fail_open) {
    // Budgets: besides its own allowance, a replica may reserve its share
    // of the budget no replica held at the last reply (docs/admission.md,
    // the outage bound). The next sync after the outage re-bases it.
    for (std::uint32_t i = 0; i < scope_count_; ++i) {
      SpendCtl& c = at(i).spend_ctl;
      if (!c.enabled) continue;
      const auto extra = static_cast<std::int64_t>(
          std::floor(static_cast<double>(at(i).spend.spare.exchange(0)) * config_.fail_open_share));
      if (extra <= 0) continue;
      c.allowance += extra;
      at(i).spend.free.fetch_add(extra, std::memory_order_acq_rel);
    }
  }
  degraded_.store(true, std::memory_order_release);
  if (!config_.fail_open) refusing_.store(true, std::memory_order_relaxed);
  if (config_.fail_open)
    log(
        fmt::format("Redis {}:{} unreachable ({}): fail_open is on, limiting per replica from local state "
                    "(each limit x {}) until it is back",
                    config_.host, config_.port, why, config_.fail_open_share));
  else
    log(fmt::format("Redis {}:{} unreachable ({}): fail_open is off, refusing requests with 503 until it is back",
                    config_.host, config_.port, why));
}

void RedisLimiter::leave_degraded() {
  if (!degraded_.load(std::memory_order_relaxed)) return;
  refusing_.store(false, std::memory_order_relaxed);
  degraded_.store(false, std::memory_order_release);
  const double secs = std::chrono::duration<double>(MonoClock::now() - loop_->outage_start).count();
  log(fmt::format("Redis {}:{} reachable again after {:.1f} s: distributed limits resumed", config_.host, config_.port,
                  secs));
}

store::Task<void> RedisLimiter::sync_once(bool final_sync) {
  struct Op {
    enum class Kind : std::uint8_t { lease, slots, spend, ping } kind;
    std::uint32_t i;
    std::int64_t a = 0, b = 0, c = 0;  // lease: ask, put, owe; slots: want, in use; spend: cum
    bool for_waiters = false;          // requests wait for this grant: keep it until they retried
  };
  // Waiting requests retry on their worker after the sync; what they were
  // granted must not go back (as excess) before then.
  const auto grace = std::max<std::chrono::milliseconds>(5 * config_.sync_interval, std::chrono::milliseconds(100));
  const Instant now = MonoClock::now();
  const bool deg = degraded_.load(std::memory_order_relaxed);
  auto waiters = std::move(waiters_);
  waiters_.clear();
  std::vector<store::Command> cmds;
  std::vector<Op> ops;
  auto str = [](auto v) { return fmt::format("{}", v); };

  // Leases (frozen during an outage: takes go to the fallback then).
  if (!deg || final_sync) {
    for (std::uint32_t i = 0; i < scope_count_ * 2; ++i) {
      const Spec& s = at(i / 2).spec[i % 2];
      if (!s.enabled) continue;
      Lease& l = at(i / 2).lease[i % 2];
      LeaseCtl& c = at(i / 2).lease_ctl[i % 2];
      const std::int64_t u = l.units.load(std::memory_order_acquire);
      const bool wanted = l.wanted.load(std::memory_order_relaxed) && l.wanted.exchange(false);
      const bool used = wanted || u != c.seen || c.waiting > 0;
      if (used) c.last_used = now;
      const bool active = now - c.last_used < config_.lease_idle;
      std::int64_t ask = 0, put = 0, owe = u < 0 ? -u : 0;
      const std::int64_t held = std::max<std::int64_t>(u, 0);
      if (final_sync || (!active && held > 0)) {
        put = take_above(l.units, 0);
      } else if (held > c.high && now >= c.keep_until) {
        put = take_above(l.units, c.target);
      } else if (c.waiting > 0 || (active && held < c.low)) {
        ask = std::clamp<std::int64_t>(c.target + whole_up(c.waiting) - held, 0, whole_down(s.depth));
      }
      const bool waiting = c.waiting > 0;
      c.waiting = 0;
      if (owe > 0) l.units.fetch_add(owe, std::memory_order_acq_rel);
      if (ask == 0 && put == 0 && owe == 0) {
        c.seen = l.units.load(std::memory_order_relaxed);
        continue;
      }
      const std::string keys[] = {c.key};
      const std::string args[] = {str(std::llround(s.rate_per_min)), str(std::llround(s.depth)), str(ask), str(put),
                                  str(owe)};
      cmds.push_back(store::Command::evalsha(lease_script(), keys, args));
      ops.push_back(Op{Op::Kind::lease, i, ask, put, owe, waiting});
    }
  }

  // Stream slots.
  const auto renew_every = config_.slot_ttl / 3;
  // A busy replica renews this often, so it learns within ~100 ms that
  // another replica is starved and shrinks to its fair share (slots.lua).
  const auto busy_renew =
      std::max<std::chrono::milliseconds>(5 * config_.sync_interval, std::chrono::milliseconds(100));
  for (std::uint32_t i = 0; i < scope_count_; ++i) {
    const std::int64_t limit = at(i).max_streams;
    if (limit == 0) continue;
    Slots& s = at(i).slots;
    SlotsCtl& c = at(i).slots_ctl;
    const std::int64_t a = s.allowance.load(std::memory_order_relaxed);
    const std::int64_t free = s.free.load(std::memory_order_acquire);
    const std::int64_t inuse = std::max<std::int64_t>(0, a - free);
    const bool wanted = s.wanted.load(std::memory_order_relaxed) && s.wanted.exchange(false);
    const bool used = wanted || free != c.seen_free || c.waiting > 0;
    if (used) c.last_used = now;
    const bool active = now - c.last_used < config_.lease_idle;
    std::int64_t want = 0;
    const bool keep = now < c.keep_until;
    if (!final_sync) want = std::min(limit, active ? inuse + c.headroom + c.waiting : inuse);
    if (keep && !final_sync) want = std::max(want, std::min(a, limit));
    const bool holding = a > 0 || inuse > 0;
    const bool need = final_sync ? holding
                                 : (c.waiting > 0 || (deg && holding) || (active && free < c.low && want != a) ||
                                    (free > 2 * c.headroom && !keep) || (!active && a > inuse && !keep) ||
                                    (holding && now - c.last_renew >= renew_every) ||
                                    (active && holding && (c.contended || now - c.last_renew >= busy_renew)) ||
                                    (c.told_want > std::max(a, inuse) && want <= a));
    const bool waiting = c.waiting > 0;
    c.waiting = 0;
    c.seen_free = free;
    if (!need) continue;
    const std::string keys[] = {c.key};
    const std::string args[] = {at(i).member, str(want), str(inuse), str(limit), str(config_.slot_ttl.count())};
    cmds.push_back(store::Command::evalsha(slots_script(), keys, args));
    ops.push_back(Op{Op::Kind::slots, i, want, inuse, 0, waiting});
  }

  // Budgets: push this replica's settled spend, renew its allowance for
  // reservations (top up below half the headroom, give back above twice it),
  // read the others' spend.
  for (std::uint32_t i = 0; i < scope_count_; ++i) {
    SpendCtl& c = at(i).spend_ctl;
    if (!c.enabled) continue;
    Spend& sp = at(i).spend;
    const std::int64_t mine = sp.mine.load(std::memory_order_acquire);
    const std::int64_t inuse = std::max<std::int64_t>(0, sp.in_use.load(std::memory_order_acquire));
    const std::int64_t free = sp.free.load(std::memory_order_acquire);
    const bool wanted = sp.wanted.load(std::memory_order_relaxed) && sp.wanted.exchange(false);
    const bool touched = sp.touched.load(std::memory_order_relaxed) && sp.touched.exchange(false);
    const bool used = wanted || c.waiting > 0 || free != c.seen_free || inuse > 0;
    if (used) c.last_used = now;
    const bool active = now - c.last_used < config_.lease_idle;
    if (!active) sp.biggest.store(0, std::memory_order_relaxed);
    // Headroom: a share of what is left, and at least the largest request seen.
    const std::int64_t headroom = std::max<std::int64_t>(
        sp.biggest.load(std::memory_order_relaxed),
        static_cast<std::int64_t>(
            std::floor(static_cast<double>(std::max<std::int64_t>(c.remaining, 0)) * config_.lease_max_share)));
    // The script adds `mine` to the period's total before it grants, so the
    // allowance need only cover reservations in flight plus the headroom.
    std::int64_t want = inuse;
    if (active && !final_sync) want += headroom + whole_up(c.waiting);
    const bool keep = now < c.keep_until && !final_sync;
    if (keep) want = std::max(want, c.allowance);
    bool due = false;
    if (final_sync) {
      due = (mine != c.pushed || c.allowance > 0) && c.idx >= 0;
    } else if (deg) {
      due = false;  // the outage probe (PING) runs below; allowances are frozen
    } else if (c.idx < 0 || now >= c.period_end || c.waiting > 0) {
      due = true;
    } else if (active && free < (headroom + 1) / 2 && want != c.allowance) {
      due = true;  // top up
    } else if (free > 2 * headroom + 1 && !keep) {
      due = true;  // give back
    } else if (!active && c.allowance > inuse && !keep) {
      due = true;  // idle: give back everything not in use
    } else if (now - c.last_sync >= config_.budget_sync_interval && (touched || mine != c.pushed)) {
      due = true;  // push the spend, read the others'
    } else if (c.allowance > 0 && now - c.last_sync >= config_.slot_ttl / 3) {
      due = true;  // renew before the allowance expires
    }
    const bool waiting = c.waiting > 0;
    c.waiting = 0;
    c.seen_free = free;
    if (!due) continue;
    c.last_sync = now;
    const std::string keys[] = {c.key};
    const std::string args[] = {at(i).member,    str(c.period_ms), str(c.idx),   str(mine),
                                str(inuse),      str(want),        str(c.limit), str(config_.slot_ttl.count()),
                                str(c.calendar), str(c.offset_ms)};
    cmds.push_back(store::Command::evalsha(budget_script(), keys, args));
    ops.push_back(Op{Op::Kind::spend, i, mine, inuse, 0, waiting});
  }

  if (cmds.empty()) {
    if (!deg || final_sync) {
      for (auto& w : waiters) w();
      co_return;
    }
    cmds.push_back(store::Command{"PING"});  // probe: is Redis back?
    ops.push_back(Op{Op::Kind::ping, 0});
  }

  auto results = co_await client_->exec(std::move(cmds));
  const Instant replied = MonoClock::now();
  const double replied_ns = ns(replied);

  std::string outage;
  for (const auto& r : results)
    if (!r && is_outage(r.error())) {
      outage = r.error().message.empty() ? std::string(store::to_string(r.error().code)) : r.error().message;
      break;
    }
  if (outage.empty()) {
    syncs_.fetch_add(1, std::memory_order_relaxed);
    leave_degraded();
  } else {
    sync_failures_.fetch_add(1, std::memory_order_relaxed);
  }

  bool logged_bug = false;
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const Op& op = ops[k];
    const auto& r = results[k];
    const bool ok = r && r->type == store::Reply::Type::array && r->elements.size() >= 2;
    if (!r && !is_outage(r.error()) && !logged_bug) {
      log(fmt::format("sync command failed: {}", r.error().message));
      logged_bug = true;
    }
    switch (op.kind) {
      case Op::Kind::lease: {
        Lease& l = at(op.i / 2).lease[op.i % 2];
        LeaseCtl& c = at(op.i / 2).lease_ctl[op.i % 2];
        if (ok && r->elements.size() >= 3) {
          const std::int64_t grant = r->elements[0].as_int();
          if (grant > 0) {
            l.units.fetch_add(grant, std::memory_order_acq_rel);
            units_granted_.fetch_add(static_cast<std::uint64_t>(grant), std::memory_order_relaxed);
          }
          if (op.for_waiters && grant > 0) c.keep_until = replied + grace;
          l.remote_avail.store(static_cast<double>(r->elements[1].as_int()), std::memory_order_relaxed);
          l.remote_at_ns.store(replied_ns, std::memory_order_relaxed);
          leases_n_.fetch_add(1, std::memory_order_relaxed);
        } else {
          // Debt stays local (counted twice if it did reach Redis); units given
          // back stay lost unless they certainly never left: both on the safe side.
          if (op.c > 0) l.units.fetch_sub(op.c, std::memory_order_acq_rel);
          if (op.b > 0 && !r && r.error().not_sent()) l.units.fetch_add(op.b, std::memory_order_acq_rel);
        }
        c.seen = l.units.load(std::memory_order_relaxed);
        break;
      }
      case Op::Kind::slots: {
        if (!ok) break;
        Slots& s = at(op.i).slots;
        SlotsCtl& c = at(op.i).slots_ctl;
        const std::int64_t grant = r->elements[0].as_int();
        const std::int64_t before = s.allowance.load(std::memory_order_relaxed);
        s.allowance.store(grant, std::memory_order_release);
        s.free.fetch_add(grant - before, std::memory_order_acq_rel);
        s.others.store(r->elements[1].as_int(), std::memory_order_relaxed);
        c.contended = r->elements.size() >= 3 && r->elements[2].as_int() > 0;
        c.told_want = op.a;
        c.last_renew = replied;
        if (op.for_waiters && grant > before) c.keep_until = replied + grace;
        c.seen_free = s.free.load(std::memory_order_relaxed);
        break;
      }
      case Op::Kind::spend: {
        if (!ok || r->elements.size() < 6) break;
        Spend& sp = at(op.i).spend;
        SpendCtl& c = at(op.i).spend_ctl;
        const std::int64_t grant = r->elements[0].as_int();
        const std::int64_t total = r->elements[1].as_int();
        const std::int64_t mine_remote = r->elements[2].as_int();
        const std::int64_t idx = r->elements[3].as_int();
        const std::int64_t left = r->elements[4].as_int(-1);
        const std::int64_t others_alloc = r->elements[5].as_int();
        // op.a = `mine` when sent: that much is now in Redis's total (or, when
        // the period rolled, in the old period's), so it no longer takes
        // room in this replica's allowance. free += grant - old allowance +
        // spend just pushed (workers keep reserving meanwhile: one add).
        const std::int64_t just_pushed = c.idx >= 0 ? op.a - c.pushed : 0;
        sp.free.fetch_add(grant - c.allowance + just_pushed, std::memory_order_acq_rel);
        c.allowance = grant;
        if (c.idx >= 0 && idx != c.idx) {
          // The period rolled over: what was pushed belongs to the old one.
          sp.mine.fetch_sub(op.a, std::memory_order_acq_rel);
          c.pushed = 0;
        } else if (c.idx >= 0) {
          c.pushed = op.a;
        }
        c.idx = idx;
        sp.others.store(total - mine_remote, std::memory_order_release);
        c.remaining = c.limit - total - others_alloc;
        sp.spare.store(std::max<std::int64_t>(0, c.remaining - grant), std::memory_order_relaxed);
        if (op.for_waiters && grant > 0) c.keep_until = replied + grace;
        c.seen_free = sp.free.load(std::memory_order_relaxed);
        c.period_end = left < 0 ? Instant::max() : replied + std::chrono::milliseconds(left);
        sp.period_end_ns.store(left < 0 ? -1 : static_cast<std::int64_t>(ns(c.period_end)), std::memory_order_relaxed);
        break;
      }
      case Op::Kind::ping:
        break;
    }
  }
  if (outage.empty()) {
    synced_.store(true, std::memory_order_release);
  } else if (!final_sync) {
    enter_degraded(outage);
  }
  for (auto& w : waiters) w();
}

const std::string& budget_lua_text() { return budget_script().text(); }

}  // namespace weir::admission
