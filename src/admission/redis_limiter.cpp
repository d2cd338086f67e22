#include "admission/redis_limiter.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include "admission/redis_limiter_state.hpp"
#include "admission/redis_scripts.hpp"
#include "core/calendar.hpp"
#include "core/note.hpp"

namespace weir::admission {

namespace {

namespace asio = boost::asio;
using redis_detail::kEps;
using redis_detail::whole_down;
using redis_detail::whole_up;

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

std::string random_id() {
  std::random_device rd;
  std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:016x}", v);
}

}  // namespace
RedisLimiter::RedisLimiter(boost::asio::io_context& control, const std::vector<auth::ScopeInfo>& scopes,
                           std::uint32_t workers, RedisConfig config, Instant epoch, LogFn log)
    : control_(control),
      config_(std::move(config)),
      workers_(std::max<std::uint32_t>(workers, 1)),
      epoch_(epoch),
      log_(std::move(log)),
      replica_id_(random_id()) {
  if (!log_) log_ = [](std::string_view m) { weir::core::note("weir: redis: {}\n", m); };
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
  for (std::size_t i = scope_count_; i < scopes.size(); ++i) init_scope(i, scopes[i]);
  scope_count_ = std::max(scope_count_, scopes.size());
  return true;
}

bool RedisLimiter::append_scope(const auth::ScopeInfo& info) {
  const std::size_t i = scope_count_;
  if (i >= kMaxScopes) return false;
  if (!fallback_->append_scope(scaled({info}, config_.fail_open_share)[0])) return false;
  init_scope(i, info);
  scope_count_ = i + 1;
  if (loop_->running) wake();  // as grow(): a new budget is read at once
  return true;
}

void RedisLimiter::init_scope(std::size_t i, const auth::ScopeInfo& info) {
  const double window_min = static_cast<double>(config_.lease_window.count()) / 60000.0;
  const bool outage = degraded_.load(std::memory_order_relaxed) && config_.fail_open;
  {
    auto& chunk = chunks_[i / kChunk];
    if (!chunk) chunk = std::make_unique<ScopeState[]>(kChunk);
    ScopeState& st = chunk[i % kChunk];
    const auto& l = info.limits;
    st.member = st.generation == 0 ? fmt::format("{}/{}", replica_id_, i)
                                   : fmt::format("{}/{}.{}", replica_id_, i, st.generation);
    const std::uint64_t rates[2] = {l.requests_per_minute, l.tokens_per_minute};
    const std::uint64_t bursts[2] = {l.requests_burst, l.tokens_burst};
    for (int b = 0; b < 2; ++b) {
      Spec& s = st.spec[b];
      LeaseCtl& c = st.lease_ctl[b];
      c.key = config_.key_prefix + "rl:" + info.name + (b == 0 ? ":req" : ":tok");
      s.enabled = rates[b] > 0;
      if (!s.enabled) continue;
      s.rate_per_min = static_cast<double>(rates[b]);
      s.depth = static_cast<double>(bursts[b] ? bursts[b] : rates[b]);
      const double cap = std::max(1.0, s.depth * config_.lease_max_share);
      double t = std::max(s.rate_per_min * window_min, b == 0 ? 1.0 : static_cast<double>(config_.lease_min_tokens));
      t = std::min(t, cap);
      c.base = std::max<std::int64_t>(1, whole_up(t));
      c.cap = std::max(c.base, whole_up(cap));
      c.target = c.base;
      c.low = (c.target + 1) / 2;
      c.high = 2 * c.target;
    }
    st.max_streams = static_cast<std::int64_t>(l.max_concurrent_streams);
    SlotsCtl& sc = st.slots_ctl;
    sc.key = config_.key_prefix + "slots:" + info.name;
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
    pc.enabled = info.budget.any();
    pc.key = config_.key_prefix + "budget:" + info.name;
    pc.limit = info.budget.limit_nano_usd;
    pc.remaining = pc.limit;
    pc.period_ms = info.budget.period.count();
    pc.calendar = static_cast<int>(info.budget.calendar);
    pc.offset_ms = std::int64_t{info.budget.utc_offset_s} * 1000;
    // Before the first reply nobody is known to hold any of the budget: a reservation waits for that reply
    // (`pending`). It is no spare an outage may hand out (enter_degraded): during an outage a budget Redis
    // never answered for has nothing to reserve from, and its requests get 503 (reserve_spend) unless a
    // reload carried the allowance of the scope it replaces (carry_allowance).
    st.spend.spare.store(outage ? 0 : pc.limit, std::memory_order_relaxed);
  }
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

void RedisLimiter::reset_scope(std::uint32_t i, const auth::ScopeInfo& info) {
  if (i >= scope_count_) return;
  // drained(), and no worker reads it until the policy naming it anew is posted (Limiter::adopt). A scope
  // whose streams counted this one's (took_over) forgets it: its old streams ended.
  ScopeState& st = at(i);
  if (st.superseded_by < scope_count_) {
    std::uint32_t was = i;
    at(st.superseded_by).slots.took_over.compare_exchange_strong(was, UINT32_MAX, std::memory_order_acq_rel);
  }
  constexpr auto rx = std::memory_order_relaxed;
  for (int b = 0; b < 2; ++b) {
    Lease& l = st.lease[b];
    l.units.store(0, rx);
    l.wanted.store(false, rx);
    l.remote_avail.store(0, rx);
    l.remote_at_ns.store(-1, rx);
    st.lease_ctl[b] = LeaseCtl{};
    st.spec[b] = Spec{};
  }
  Slots& sl = st.slots;
  sl.free.store(0, rx);
  sl.allowance.store(0, rx);
  sl.others.store(0, rx);
  sl.others_used.store(0, rx);
  sl.wanted.store(false, rx);
  sl.superseded.store(false, rx);
  sl.took_over.store(UINT32_MAX, rx);
  sl.reply_ns.store(0, rx);
  sl.released_ns.store(0, rx);
  st.slots_ctl = SlotsCtl{};
  Spend& sp = st.spend;
  sp.free.store(0, rx);
  sp.in_use.store(0, rx);
  sp.mine.store(0, rx);
  sp.others.store(0, rx);
  sp.spare.store(0, rx);
  sp.biggest.store(0, rx);
  sp.wanted.store(false, rx);
  sp.touched.store(false, rx);
  sp.period_end_ns.store(-1, rx);
  sp.period_idx.store(-1, rx);
  st.spend_ctl = SpendCtl{};
  st.max_streams = 0;
  st.continues.store(ScopeState::kNoScope, rx);
  st.successor = ScopeState::kNoScope;
  st.folded_into.store(ScopeState::kNoScope, rx);
  st.superseded_by = ScopeState::kNoScope;
  ++st.generation;  // a member of its own in Redis
  init_scope(i, info);
  fallback_->restart_scope(i, scaled({info}, config_.fail_open_share)[0]);
  // Visited at the next sync, as a new scope is (its budget read at once).
  woken_.push_back(i);
  if (loop_->running) wake();
}

RedisLimiter::ScopeState& RedisLimiter::at(std::uint32_t scope) const noexcept {
  return chunks_[scope / kChunk][scope % kChunk];
}

RedisLimiter::~RedisLimiter() {
  if (client_) client_->stop();
}

void RedisLimiter::log(std::string_view msg) const { log_line(msg, false); }

void RedisLimiter::log_state(std::string_view msg) const { log_line(msg, true); }

void RedisLimiter::log_line(std::string_view msg, bool always) const {
  // Control thread only. At most kLogBurst lines, then one per kLogEvery:
  // a Redis or a network that comes and goes cannot flood the log with its
  // connection's lines (what was left out is counted in the next line).
  // A state change is always written: the log's last word on Redis must be
  // true (the number of those is bounded by real outages: a sync fails,
  // and the client's reconnect backoff paces the next).
  constexpr double kLogBurst = 20;
  constexpr auto kLogEvery = std::chrono::seconds(6);
  const Instant now = MonoClock::now();
  if (log_at_ != Instant{}) {
    log_tokens_ += std::chrono::duration<double>(now - log_at_) / kLogEvery;
    log_tokens_ = std::min(log_tokens_, kLogBurst);
  }
  log_at_ = now;
  if (log_tokens_ < 1 && !always) {
    ++log_dropped_;
    return;
  }
  log_tokens_ = std::max(0.0, log_tokens_ - 1);
  if (log_dropped_ > 0) {
    log_(fmt::format("({} earlier lines not logged: rate limited) {}", log_dropped_, msg));
    log_dropped_ = 0;
    return;
  }
  log_(msg);
}

double RedisLimiter::ns(Instant t) const noexcept {
  return std::chrono::duration<double, std::nano>(t - epoch_).count();
}

double RedisLimiter::remote_estimate(const Lease& l, std::uint32_t i, Instant now) const noexcept {
  const Spec& s = at(i / 2).spec[i % 2];
  const std::int64_t at = l.remote_at_ns.load(std::memory_order_relaxed);
  if (at < 0) return s.depth;  // never synced: a bucket nobody used is full
  const double avail = l.remote_avail.load(std::memory_order_relaxed);
  // The time since the reply in integer ns: exact at any uptime (a double of ns since epoch_ is not).
  const std::int64_t since = std::chrono::duration_cast<std::chrono::nanoseconds>(now - epoch_).count() - at;
  return std::min(s.depth, avail + static_cast<double>(std::max<std::int64_t>(since, 0)) * s.rate_per_min / 60e9);
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
  const double have = remote_estimate(l, i, now) + static_cast<double>(cur);
  if (have >= cost - kEps) return TakeResult{.ok = false, .pending = true, .retry_after_s = 1};
  return TakeResult{.ok = false, .retry_after_s = refill_seconds(cost - have, s.rate_per_min)};
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
    at(i / 2).lease[i % 2].units.fetch_sub(
        a, std::memory_order_acq_rel);  // may go negative: the next sync pushes the debt
}

BucketView RedisLimiter::view(std::uint32_t scope, Bucket b, Instant now) const {
  if (degraded_.load(std::memory_order_relaxed) && config_.fail_open) return fallback_->view(scope, b, now);
  const std::uint32_t i = scope * 2 + static_cast<std::uint32_t>(b);
  const Spec& s = at(i / 2).spec[i % 2];
  BucketView v;
  if (!s.enabled) return v;
  const Lease& l = at(i / 2).lease[i % 2];
  // (Below 0 is a debt, usage above its estimate: the bucket is full again only once it is paid, as
  // LocalLimiter::view reads it.)
  const double total =
      std::min(remote_estimate(l, i, now) + static_cast<double>(l.units.load(std::memory_order_relaxed)), s.depth);
  v.limit = static_cast<std::uint64_t>(std::max(s.rate_per_min, s.depth));
  v.remaining = total <= 0 ? 0 : static_cast<std::uint64_t>(std::floor(total + kEps));
  v.level = total;
  v.rate_per_min = s.rate_per_min;
  v.depth = s.depth;
  v.reset_ms = static_cast<std::uint64_t>(std::ceil((s.depth - total) * 60000.0 / s.rate_per_min - 1e-9));
  return v;
}

std::uint32_t RedisLimiter::seconds_until(std::uint32_t scope, Bucket b, double cost, Instant now) const {
  if (degraded_.load(std::memory_order_relaxed) && config_.fail_open)
    return fallback_->seconds_until(scope, b, cost, now);
  return Limiter::seconds_until(scope, b, cost, now);
}

std::uint32_t RedisLimiter::millis_until(std::uint32_t scope, Bucket b, double cost, Instant now) const {
  if (degraded_.load(std::memory_order_relaxed) && config_.fail_open)
    return fallback_->millis_until(scope, b, cost, now);
  return Limiter::millis_until(scope, b, cost, now);
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
  Slots& s = at(scope).slots;
  s.free.fetch_add(1, std::memory_order_acq_rel);
  if (s.superseded.load(std::memory_order_relaxed))
    s.released_ns.store(ns(MonoClock::now()), std::memory_order_release);
}

std::uint64_t RedisLimiter::streams_in_use(std::uint32_t scope) const {
  if (at(scope).max_streams == 0) return 0;
  // This scope's streams, and those still in flight under the scopes it
  // took over from (a cap changed by a reload or a PATCH: they count
  // against the new one, as admission counts them).
  std::int64_t used = 0;
  std::uint32_t s = scope;
  for (int steps = 0; s < scope_count_ && steps < 64; ++steps) {
    const Slots& sl = at(s).slots;
    used += std::max<std::int64_t>(
        0, sl.allowance.load(std::memory_order_acquire) - sl.free.load(std::memory_order_acquire));
    // (The links end at UINT32_MAX: a scope's is cleared when the one it names is reused.)
    const std::uint32_t prev = sl.took_over.load(std::memory_order_acquire);
    if (prev == s) break;
    s = prev;
  }
  return static_cast<std::uint64_t>(used);
}

bool RedisLimiter::streams_refillable(std::uint32_t scope) const noexcept {
  if (degraded_.load(std::memory_order_relaxed) || at(scope).max_streams == 0) return false;
  const Slots& s = at(scope).slots;
  if (s.others.load(std::memory_order_relaxed) + s.allowance.load(std::memory_order_relaxed) < at(scope).max_streams)
    return true;
  // The others hold slots they do not use (a replica's idle headroom): they
  // give them back once this replica's demand is recorded; wait for that.
  const std::int64_t mine =
      std::max<std::int64_t>(0, s.allowance.load(std::memory_order_relaxed) - s.free.load(std::memory_order_relaxed));
  if (s.others_used.load(std::memory_order_relaxed) + mine < at(scope).max_streams) return true;
  // The cap looked full at the last renewal; that answer may count slots
  // released since: a stream of a scope this one took over from that ended
  // here after it (Redis counts it until that scope's next renewal), or, in
  // an answer older than kSlotsStaleNs, one anywhere. Ask again rather than
  // refuse on it.
  const double reply = s.reply_ns.load(std::memory_order_acquire);
  if (ns(MonoClock::now()) - reply > kSlotsStaleNs) return true;
  std::uint32_t prev = s.took_over.load(std::memory_order_acquire);
  for (std::uint32_t cur = scope, steps = 0; prev < scope_count_ && prev != cur && steps < 64; ++steps) {
    if (at(prev).slots.released_ns.load(std::memory_order_acquire) > reply) return true;
    cur = prev;
    prev = at(cur).slots.took_over.load(std::memory_order_acquire);
  }
  return false;
}

BudgetWindow RedisLimiter::budget_window(std::uint32_t scope, const auth::Budget& b, Instant now) const {
  // (`scope` is held: the caller checked scope_count(), as for spent().)
  const std::int64_t idx = at(spend_home(scope)).spend.period_idx.load(std::memory_order_relaxed);
  if (idx < 0 || !b.resets()) return Limiter::budget_window(scope, b, now);
  if (b.calendar == core::CalendarPeriod::none) {
    const std::int64_t p = std::chrono::duration_cast<std::chrono::nanoseconds>(b.period).count();
    if (p <= 0) return {};
    return {idx * p, idx * p + p};  // (idx = Unix ms / period ms: the product is a Unix time in ns)
  }
  // The first local day of period idx (budget.lua's numbering), then its window.
  std::int64_t day = idx;
  if (b.calendar == core::CalendarPeriod::week) day = idx * 7 - 3;
  if (b.calendar == core::CalendarPeriod::month)
    day = core::days_from_civil(1970 + core::floor_div(idx, 12),
                                static_cast<unsigned>(idx - core::floor_div(idx, 12) * 12) + 1, 1);
  const std::int64_t local = day * core::kNsPerDay;
  const auto w = core::calendar_window(b.calendar, local - static_cast<std::int64_t>(b.utc_offset_s) * 1'000'000'000,
                                       b.utc_offset_s);
  return {w.start_ns, w.end_ns};
}

std::int64_t RedisLimiter::spent(std::uint32_t scope, Instant /*now*/) {
  Spend& sp = at(spend_home(scope)).spend;
  if (!sp.touched.load(std::memory_order_relaxed)) sp.touched.store(true, std::memory_order_relaxed);
  return sp.others.load(std::memory_order_acquire) + sp.mine.load(std::memory_order_acquire);
}

TakeResult RedisLimiter::reserve_spend(std::uint32_t scope, std::int64_t nano_usd, Instant now) {
  scope = spend_home(scope);                // (a retired scope's budget was folded into its successor's)
  const SpendCtl& c = at(scope).spend_ctl;  // enabled, limit and period_ms are read-only after construction
  if (!c.enabled) return {};
  Spend& sp = at(scope).spend;
  if (!sp.touched.load(std::memory_order_relaxed)) sp.touched.store(true, std::memory_order_relaxed);
  if (nano_usd > c.limit) return TakeResult{.ok = false, .never = true};
  if (c.limit == 0) return TakeResult{.ok = false};
  // Refused until the period ends (as Redis counts it), or for good when it never does.
  const auto until_period_end = [&] {
    if (c.period_ms <= 0 && c.calendar == 0) return TakeResult{.ok = false};
    const std::int64_t end = sp.period_end_ns.load(std::memory_order_relaxed);
    const auto left = end < 0 ? std::int64_t{1'000'000'000} : end - static_cast<std::int64_t>(ns(now));
    return TakeResult{.ok = false, .retry_after_s = whole_seconds_up(left)};
  };
  if (nano_usd == 0) {
    // A free request: admitted while the budget is not spent.
    return spent(scope, now) < c.limit ? TakeResult{} : until_period_end();
  }
  if (nano_usd > sp.biggest.load(std::memory_order_relaxed)) sp.biggest.store(nano_usd, std::memory_order_relaxed);
  std::int64_t cur = sp.free.load(std::memory_order_relaxed);
  while (cur >= nano_usd) {
    if (sp.free.compare_exchange_weak(cur, cur - nano_usd, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      sp.in_use.fetch_add(nano_usd, std::memory_order_seq_cst);  // (seq_cst: against fold_retired's check)
      return {};
    }
  }
  if (!sp.wanted.load(std::memory_order_relaxed)) sp.wanted.store(true, std::memory_order_relaxed);
  if (degraded_.load(std::memory_order_relaxed)) {
    // An outage, and Redis never answered for this budget (this process started during it, or it is
    // new since): what the replicas spent is unknown, so it cannot be admitted against (503).
    if (sp.period_idx.load(std::memory_order_relaxed) < 0)
      return TakeResult{.ok = false, .unavailable = true, .retry_after_s = 1};
  } else if (sp.spare.load(std::memory_order_relaxed) + std::max<std::int64_t>(cur, 0) >= nano_usd) {
    // Short here: the budget no replica holds may still cover it.
    return TakeResult{.ok = false, .pending = true, .retry_after_s = 1};
  }
  // When it can admit again: the replicas' settled spend leaves room (only
  // reservations in flight, here or on other replicas, are in the way), or
  // the period ends (as Redis counts it), or never.
  const std::int64_t settled = spent(scope, now);
  if (settled < c.limit && settled + nano_usd <= c.limit) return TakeResult{.ok = false, .retry_after_s = 1};
  return until_period_end();
}

std::uint32_t RedisLimiter::budget_retry_after_ms(std::uint32_t scope, std::int64_t nano_usd, Instant now) const {
  // As reserve_spend's until_period_end: the period's end as Redis counts it (its last reply's), when the
  // replicas' settled spend leaves no room.
  scope = spend_home(scope);
  const SpendCtl& c = at(scope).spend_ctl;
  if (!c.enabled || c.limit == 0 || (c.period_ms <= 0 && c.calendar == 0)) return 0;
  const Spend& sp = at(scope).spend;
  const std::int64_t settled = sp.others.load(std::memory_order_acquire) + sp.mine.load(std::memory_order_acquire);
  if (nano_usd > 0 && settled < c.limit && settled + nano_usd <= c.limit) return 0;
  const std::int64_t end = sp.period_end_ns.load(std::memory_order_relaxed);
  if (end < 0) return 0;
  const auto left = end - static_cast<std::int64_t>(ns(now));
  return left > 0 ? whole_millis_up(left) : 0;
}

void RedisLimiter::settle_spend(std::uint32_t scope, std::int64_t reserved, std::int64_t actual, Instant /*now*/) {
  // A reservation from an earlier period still counts in in_use (Redis
  // granted this period's allowance with it), so both cases settle alike:
  // the cost is charged to the current period.
  if (!at(scope).spend_ctl.enabled) return;
  if (at(scope).folded_into.load(std::memory_order_acquire) != ScopeState::kNoScope) {
    // Folded into its successor (fold_retired): a reservation made here before the fold (a race with its
    // check) is released here; the cost, and a reservation made at the successor, are the successor's.
    Spend& old = at(scope).spend;
    std::int64_t cur = old.in_use.load(std::memory_order_acquire);
    bool here = false;
    while (reserved > 0 && cur >= reserved && !here)
      here = old.in_use.compare_exchange_weak(cur, cur - reserved, std::memory_order_acq_rel);
    if (here) {
      old.free.fetch_add(reserved, std::memory_order_acq_rel);
      reserved = 0;
    }
    scope = spend_home(scope);
  }
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

std::chrono::milliseconds RedisLimiter::refill_patience(const Shortfall& need) const noexcept {
  if (degraded_.load(std::memory_order_relaxed) || stopping_.load(std::memory_order_relaxed)) return {};
  for (std::uint8_t k = 0; k < need.count && k < Shortfall::kMax; ++k) {
    const Need& n = need.needs[k];
    if (n.what == Resource::streams && n.scope < scope_count_ && at(n.scope).max_streams > 0 &&
        at(n.scope).slots.others.load(std::memory_order_relaxed) > 0)
      return {};
  }
  // (As on_refill's slot waiters: a busy holder of an idle slot gives it back within a few renewals.)
  const auto busy_renew =
      std::max<std::chrono::milliseconds>(5 * config_.sync_interval, std::chrono::milliseconds(100));
  return 3 * busy_renew + config_.command_timeout;
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
  s.key_errors = key_errors_.load(std::memory_order_relaxed);
  s.key_resets = key_resets_.load(std::memory_order_relaxed);
  s.evicting = evicting_.load(std::memory_order_relaxed);
  s.walks = walks_.load(std::memory_order_relaxed);
  s.scopes_walked = scopes_walked_.load(std::memory_order_relaxed);
  return s;
}

const std::string& budget_lua_text() { return budget_script().text(); }

}  // namespace weir::admission
