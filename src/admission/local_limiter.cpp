#include "admission/local_limiter.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

namespace weir::admission {

namespace {
constexpr double kEps = 1e-9;  // units: below this a bucket counts as exact
constexpr double kNsPerMin = 60e9;

// The Unix time (ns) of steady instant `t`: one read of each clock.
std::int64_t unix_ns_of(Instant t) noexcept {
  const auto wall = std::chrono::system_clock::now();
  const auto mono = MonoClock::now();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(wall.time_since_epoch()).count() -
         std::chrono::duration_cast<std::chrono::nanoseconds>(mono - t).count();
}
}  // namespace

LocalLimiter::LocalLimiter(const std::vector<auth::ScopeInfo>& scopes, std::uint32_t workers, Instant epoch,
                           std::optional<std::int64_t> epoch_unix_ns)
    : workers_(std::max<std::uint32_t>(workers, 1)),
      shards_(std::min(std::max<std::uint32_t>(workers, 1), kMaxShards)),
      epoch_(epoch),
      epoch_unix_ns_(epoch_unix_ns ? *epoch_unix_ns : unix_ns_of(epoch)),
      chunks_(std::make_unique<std::unique_ptr<Scope[]>[]>(kMaxScopes / kChunk)) {
  grow(scopes);
}

void LocalLimiter::init(Scope& sc, const auth::ScopeInfo& info) {
  const double n = shards_;
  const auto& l = info.limits;
  const std::uint64_t rates[2] = {l.requests_per_minute, l.tokens_per_minute};
  const std::uint64_t bursts[2] = {l.requests_burst, l.tokens_burst};
  for (int b = 0; b < 2; ++b) {
    Spec& s = sc.spec[b];
    s.enabled = rates[b] > 0;
    if (!s.enabled) continue;
    s.rate_per_min = static_cast<double>(rates[b]);
    s.depth = static_cast<double>(bursts[b] ? bursts[b] : rates[b]);
    s.t_ns = kNsPerMin * n / s.rate_per_min;
    s.tau_ns = s.depth / n * s.t_ns;
  }
  sc.max_streams = l.max_concurrent_streams;
  sc.has_budget = info.budget.any();
  sc.budget_nano_usd = info.budget.limit_nano_usd;
  sc.period_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(info.budget.period).count();
  sc.calendar = info.budget.calendar;
  sc.utc_offset_s = info.budget.utc_offset_s;
  // A calendar window's index may be any int64: the first call rolls into it.
  sc.window.store(INT64_MIN, std::memory_order_relaxed);  // the first roll() sets the current window
  sc.shards = std::make_unique<Shard[]>(shards_);
  for (std::uint32_t j = 0; j < shards_; ++j) {
    sc.shards[j].tat[0].store(0.0, std::memory_order_relaxed);
    sc.shards[j].tat[1].store(0.0, std::memory_order_relaxed);
    const std::uint64_t share = sc.max_streams / shards_ + (j < sc.max_streams % shards_ ? 1 : 0);
    sc.shards[j].free_streams.store(static_cast<std::int64_t>(share), std::memory_order_relaxed);
  }
}

bool LocalLimiter::grow(const std::vector<auth::ScopeInfo>& scopes) {
  if (scopes.size() > kMaxScopes) return false;
  for (std::size_t i = scope_count_; i < scopes.size(); ++i) {
    auto& chunk = chunks_[i / kChunk];
    if (!chunk) chunk = std::make_unique<Scope[]>(kChunk);
    init(chunk[i % kChunk], scopes[i]);
  }
  scope_count_ = std::max(scope_count_, scopes.size());
  return true;
}

void LocalLimiter::carry_spend(std::uint32_t from, std::uint32_t to, Instant now) {
  if (from >= scope_count_ || to >= scope_count_) return;
  const std::int64_t s = spent(from, now);
  Scope& dst = at(to);
  roll(dst, now);
  dst.committed.fetch_add(s, std::memory_order_acq_rel);
  dst.spent.fetch_add(s, std::memory_order_acq_rel);
}

void LocalLimiter::carry(std::uint32_t from, std::uint32_t to, Instant now) {
  if (from >= scope_count_ || to >= scope_count_ || from == to) return;
  const double t = ns(now);
  for (int b = 0; b < 2; ++b) {
    const Spec& src = at(from).spec[b];
    const Spec& dst = at(to).spec[b];
    if (!src.enabled || !dst.enabled) continue;  // a bucket new to the scope starts full
    const double level = std::min(available(from, static_cast<Bucket>(b), now), dst.depth);
    // Spread evenly over the shards: available = (now + tau - tat) / t per shard.
    const double tat = t + dst.tau_ns - level / shards_ * dst.t_ns;
    for (std::uint32_t j = 0; j < shards_; ++j) at(to).shards[j].tat[b].store(tat, std::memory_order_relaxed);
  }
  carry_spend(from, to, now);
}

LocalLimiter::~LocalLimiter() = default;

BudgetWindow Limiter::budget_window(std::uint32_t /*scope*/, const auth::Budget& b, Instant /*now*/) const {
  const std::int64_t t =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (b.calendar != core::CalendarPeriod::none) {
    const auto w = core::calendar_window(b.calendar, t, b.utc_offset_s);
    return {w.start_ns, w.end_ns};
  }
  const std::int64_t p = std::chrono::duration_cast<std::chrono::nanoseconds>(b.period).count();
  if (p <= 0) return {};
  const std::int64_t start = core::floor_div(t, p) * p;
  return {start, start + p};
}

double LocalLimiter::ns(Instant t) const noexcept {
  return std::chrono::duration<double, std::nano>(t - epoch_).count();
}

double LocalLimiter::shard_available(const Spec& s, const std::atomic<double>& tat, double now) noexcept {
  const double base = std::max(tat.load(std::memory_order_relaxed), now);
  return (now + s.tau_ns - base) / s.t_ns;
}

double LocalLimiter::take_up_to(const Spec& s, std::atomic<double>& tat, double want, double now) noexcept {
  double cur = tat.load(std::memory_order_relaxed);
  while (true) {
    const double base = std::max(cur, now);
    const double avail = (now + s.tau_ns - base) / s.t_ns;
    if (avail <= kEps) return 0;
    const double got = std::min(want, avail);
    if (tat.compare_exchange_weak(cur, base + got * s.t_ns, std::memory_order_acq_rel, std::memory_order_relaxed))
      return got;
  }
}

void LocalLimiter::refund(const Spec& s, std::atomic<double>& tat, double amount, double now) noexcept {
  double cur = tat.load(std::memory_order_relaxed);
  while (true) {
    const double next = std::max(cur - amount * s.t_ns, now);  // a full bucket stays full
    if (next >= cur) return;
    if (tat.compare_exchange_weak(cur, next, std::memory_order_acq_rel, std::memory_order_relaxed)) return;
  }
}

TakeResult LocalLimiter::take(std::uint32_t scope, Bucket b, std::uint32_t worker, double cost, Instant now) {
  Scope& sc = at(scope);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled || cost <= 0) return {};
  if (cost > s.depth + kEps) return TakeResult{.ok = false, .never = true};
  const double t = ns(now);
  const int bi = static_cast<int>(b);
  const std::uint32_t own = shard_of(worker);
  double got = take_up_to(s, sc.shards[own].tat[bi], cost, t);
  if (got >= cost - kEps) return {};  // the common case: the worker's own shard had it

  double taken[kMaxShards];
  taken[0] = got;
  std::uint32_t k = 1;
  for (; k < shards_ && got < cost - kEps; ++k) {
    const std::uint32_t j = (own + k) % shards_;
    taken[k] = take_up_to(s, sc.shards[j].tat[bi], cost - got, t);
    got += taken[k];
  }
  if (got >= cost - kEps) return {};
  // Not enough anywhere: put every borrowed unit back where it came from.
  for (std::uint32_t i = 0; i < k; ++i)
    if (taken[i] > 0) refund(s, sc.shards[(own + i) % shards_].tat[bi], taken[i], t);
  double total = 0;
  // Debt counts against the total (it is usage already served).
  for (std::uint32_t j = 0; j < shards_; ++j) total += shard_available(s, sc.shards[j].tat[bi], t);
  const double deficit = std::max(cost - total, kEps);
  const double secs = std::ceil(deficit * 60.0 / s.rate_per_min - 1e-9);
  return TakeResult{.ok = false, .retry_after_s = static_cast<std::uint32_t>(std::clamp(secs, 1.0, 86400.0))};
}

void LocalLimiter::give_back(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) {
  Scope& sc = at(scope);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled || amount <= 0) return;
  refund(s, sc.shards[shard_of(worker)].tat[static_cast<int>(b)], amount, ns(now));
}

void LocalLimiter::charge(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) {
  Scope& sc = at(scope);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled || amount <= 0) return;
  auto& tat = sc.shards[shard_of(worker)].tat[static_cast<int>(b)];
  const double t = ns(now);
  double cur = tat.load(std::memory_order_relaxed);
  while (!tat.compare_exchange_weak(cur, std::max(cur, t) + amount * s.t_ns, std::memory_order_acq_rel,
                                    std::memory_order_relaxed)) {
  }
}

double LocalLimiter::available(std::uint32_t scope, Bucket b, Instant now) const {
  const Scope& sc = at(scope);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled) return 0;
  const double t = ns(now);
  double total = 0;
  for (std::uint32_t j = 0; j < shards_; ++j) total += shard_available(s, sc.shards[j].tat[static_cast<int>(b)], t);
  return total;
}

BucketView LocalLimiter::view(std::uint32_t scope, Bucket b, Instant now) const {
  const Scope& sc = at(scope);
  const Spec& s = sc.spec[static_cast<int>(b)];
  BucketView v;
  if (!s.enabled) return v;
  const double t = ns(now);
  double total = 0, until_full_ns = 0;
  for (std::uint32_t j = 0; j < shards_; ++j) {
    const auto& tat = sc.shards[j].tat[static_cast<int>(b)];
    total += shard_available(s, tat, t);
    until_full_ns = std::max(until_full_ns, tat.load(std::memory_order_relaxed) - t);
  }
  v.limit = static_cast<std::uint64_t>(s.rate_per_min);
  v.remaining = total <= 0 ? 0 : static_cast<std::uint64_t>(std::floor(total + kEps));
  v.reset_ms = static_cast<std::uint64_t>(std::ceil(std::max(until_full_ns, 0.0) / 1e6 - 1e-9));
  return v;
}

bool LocalLimiter::acquire_stream(std::uint32_t scope, std::uint32_t worker) {
  Scope& sc = at(scope);
  if (sc.max_streams == 0) return true;
  const std::uint32_t own = shard_of(worker);
  for (std::uint32_t k = 0; k < shards_; ++k) {
    auto& free = sc.shards[(own + k) % shards_].free_streams;
    std::int64_t cur = free.load(std::memory_order_relaxed);
    while (cur > 0) {
      if (free.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel, std::memory_order_relaxed)) return true;
    }
  }
  return false;
}

void LocalLimiter::release_stream(std::uint32_t scope, std::uint32_t worker) {
  Scope& sc = at(scope);
  if (sc.max_streams == 0) return;
  sc.shards[shard_of(worker)].free_streams.fetch_add(1, std::memory_order_acq_rel);
}

std::uint64_t LocalLimiter::streams_in_use(std::uint32_t scope) const {
  const Scope& sc = at(scope);
  std::int64_t free = 0;
  for (std::uint32_t j = 0; j < shards_; ++j) free += sc.shards[j].free_streams.load(std::memory_order_relaxed);
  return sc.max_streams - static_cast<std::uint64_t>(free);
}

void LocalLimiter::roll(Scope& sc, Instant now) {
  std::int64_t w = 0;
  if (sc.calendar != core::CalendarPeriod::none)
    w = core::calendar_window(sc.calendar, unix_ns(now), sc.utc_offset_s).index;
  else if (sc.period_ns > 0)
    w = unix_ns(now) / sc.period_ns;  // UTC-aligned, as budget.lua counts them
  else
    return;
  std::int64_t cur = sc.window.load(std::memory_order_acquire);
  // One winner resets; a reservation or spend added between its CAS and its
  // stores is lost to the new window (documented tolerance: the requests
  // that cross a period rollover at that instant).
  if (w > cur && sc.window.compare_exchange_strong(cur, w, std::memory_order_acq_rel)) {
    sc.committed.store(0, std::memory_order_release);
    sc.spent.store(0, std::memory_order_release);
  }
}

TakeResult LocalLimiter::reserve_spend(std::uint32_t scope, std::int64_t nano_usd, Instant now, std::uint32_t* period) {
  Scope& sc = at(scope);
  if (!sc.has_budget) return {};
  roll(sc, now);
  if (period) *period = static_cast<std::uint32_t>(sc.window.load(std::memory_order_acquire));
  const std::int64_t limit = sc.budget_nano_usd;
  if (nano_usd > limit) return TakeResult{.ok = false, .never = true};
  std::int64_t cur = sc.committed.load(std::memory_order_relaxed);
  while (cur < limit && cur + nano_usd <= limit) {
    if (sc.committed.compare_exchange_weak(cur, cur + nano_usd, std::memory_order_acq_rel, std::memory_order_relaxed))
      return {};
  }
  return TakeResult{.ok = false, .retry_after_s = budget_retry_after(sc, nano_usd, now)};
}

std::uint32_t LocalLimiter::budget_retry_after(const Scope& sc, std::int64_t nano_usd, Instant now) const noexcept {
  const std::int64_t limit = sc.budget_nano_usd;
  if (limit <= 0) return 0;  // $0: nothing is ever admitted
  const std::int64_t settled = sc.spent.load(std::memory_order_acquire);
  if (settled < limit && settled + nano_usd <= limit) return 1;  // reservations in flight are in the way
  if (sc.calendar != core::CalendarPeriod::none)                 // until the next calendar window starts
    return whole_seconds_up(core::calendar_window(sc.calendar, unix_ns(now), sc.utc_offset_s).end_ns - unix_ns(now));
  if (sc.period_ns <= 0) return 0;                                      // never resets
  return whole_seconds_up(sc.period_ns - unix_ns(now) % sc.period_ns);  // until the window rolls
}

void LocalLimiter::settle_spend(std::uint32_t scope, std::int64_t reserved, std::int64_t actual, std::uint32_t period,
                                Instant now) {
  Scope& sc = at(scope);
  if (!sc.has_budget) return;
  roll(sc, now);
  // A reservation from an earlier period went with it: charge the cost to this one.
  const bool same = static_cast<std::uint32_t>(sc.window.load(std::memory_order_acquire)) == period;
  const std::int64_t delta = actual - (same ? reserved : 0);
  if (delta != 0) sc.committed.fetch_add(delta, std::memory_order_acq_rel);
  if (actual > 0) sc.spent.fetch_add(actual, std::memory_order_acq_rel);
}

std::int64_t LocalLimiter::spent(std::uint32_t scope, Instant now) {
  Scope& sc = at(scope);
  roll(sc, now);
  return sc.spent.load(std::memory_order_acquire);
}

BudgetWindow LocalLimiter::budget_window(std::uint32_t scope, const auth::Budget& b, Instant now) const {
  if (scope >= scope_count_) return Limiter::budget_window(scope, b, now);
  const Scope& sc = at(scope);
  const std::int64_t t = unix_ns(now);
  if (sc.calendar != core::CalendarPeriod::none) {
    const auto w = core::calendar_window(sc.calendar, t, sc.utc_offset_s);
    return {w.start_ns, w.end_ns};
  }
  if (sc.period_ns <= 0) return {};
  const std::int64_t start = t - t % sc.period_ns;
  return {start, start + sc.period_ns};
}

std::int64_t LocalLimiter::committed(std::uint32_t scope, Instant now) {
  Scope& sc = at(scope);
  roll(sc, now);
  return sc.committed.load(std::memory_order_acquire);
}

}  // namespace weir::admission
