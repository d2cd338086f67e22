#include "admission/local_limiter.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <thread>

namespace weir::admission {

namespace {
constexpr double kEps = 1e-9;  // units: a cost above depth + kEps is never admitted
constexpr double kNsPerMin = 60e9;
// The farthest a TAT or a bucket reaches, ns (2^61: 73 years): a bucket deeper than that
// (a burst of more than 73 years of its rate) is cut there, and a debt stops growing there.
constexpr std::int64_t kFarNs = std::int64_t{1} << 61;

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
    // (Below 1 ns a unit, above 1e9 units a second a shard, a unit is taken as 1 ns.)
    s.total_ns = std::max<std::int64_t>(cost_ns(s, s.depth), shards_);
    s.tau_ns = s.total_ns / shards_;
    s.tau_extra = static_cast<std::uint32_t>(s.total_ns % shards_);
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
    sc.shards[j].tat[0].store(INT64_MIN / 2, std::memory_order_relaxed);  // full
    sc.shards[j].tat[1].store(INT64_MIN / 2, std::memory_order_relaxed);
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

bool LocalLimiter::append_scope(const auth::ScopeInfo& info) {
  const std::size_t i = scope_count_;
  if (i >= kMaxScopes) return false;
  auto& chunk = chunks_[i / kChunk];
  if (!chunk) chunk = std::make_unique<Scope[]>(kChunk);
  init(chunk[i % kChunk], info);
  scope_count_ = i + 1;
  return true;
}

void LocalLimiter::reset_scope(std::uint32_t scope, const auth::ScopeInfo& info) {
  if (scope >= scope_count_) return;
  // Nothing holds it (Limiter::adopt): no worker reads it until the policy
  // naming it anew is posted, which orders these writes before those reads.
  Scope& sc = at(scope);
  sc.committed.store(0, std::memory_order_relaxed);
  sc.spent.store(0, std::memory_order_relaxed);
  sc.inherited.store(0, std::memory_order_relaxed);
  sc.forward.store(kNoScope, std::memory_order_relaxed);
  init(sc, info);
}

void LocalLimiter::carry_spend(std::uint32_t from, std::uint32_t to, Instant now) {
  if (from >= scope_count_ || to >= scope_count_ || from == to) return;
  retire(from, to, now);
}

void LocalLimiter::carry(std::uint32_t from, std::uint32_t to, Instant now) {
  if (from >= scope_count_ || to >= scope_count_ || from == to) return;
  const std::int64_t t = ns(now);
  for (int b = 0; b < 2; ++b) {
    const Spec& src = at(from).spec[b];
    const Spec& dst = at(to).spec[b];
    if (!src.enabled || !dst.enabled) continue;  // a bucket new to the scope starts full
    // What the new bucket misses of full, spread evenly over its shards (a full one stays exactly full).
    const double lvl = level(at(from), b, t);
    const std::int64_t missing =
        lvl >= dst.depth ? 0 : dst.total() - (lvl <= 0 ? 0 : std::min(cost_ns(dst, lvl), dst.total()));
    for (std::uint32_t j = 0; j < shards_; ++j) {
      const std::int64_t lag = missing / shards_ + (j < missing % shards_ ? 1 : 0);
      at(to).shards[j].tat[b].store(lag > 0 ? t + lag : INT64_MIN / 2, std::memory_order_relaxed);
    }
  }
  retire(from, to, now);
}

void LocalLimiter::retire(std::uint32_t from, std::uint32_t to, Instant now) {
  Scope& a = at(from);
  Scope& b = at(to);
  if (a.forward.load(std::memory_order_acquire) != kNoScope) return;  // carried before
  ledger().pin(from, to);  // `to` is not reused while tickets of `from` may follow the link
  roll(a, now);
  roll(b, now);
  // The marks first, each by one atomic add whose result is the value the
  // carry moves: a ticket's operation lands before it (and is in that value)
  // or after it (and follows `forward`, which it waits for if need be).
  std::int64_t free = 0;
  for (std::uint32_t j = 0; j < shards_; ++j)
    free += a.shards[j].free_streams.fetch_sub(kDead, std::memory_order_acq_rel);
  const std::int64_t inherited = a.inherited.fetch_add(kDead, std::memory_order_acq_rel);
  const std::int64_t committed = a.committed.fetch_add(kDeadSpend, std::memory_order_acq_rel);
  const std::int64_t spent = a.spent.fetch_add(kDeadSpend, std::memory_order_acq_rel);
  a.forward.store(to, std::memory_order_release);
  // Streams held on `from` (with a cap there: without one none were counted).
  const std::int64_t held = (a.max_streams > 0 ? static_cast<std::int64_t>(a.max_streams) - free : 0) + inherited;
  if (held > 0) b.inherited.fetch_add(held, std::memory_order_acq_rel);
  // The spend of the current period, settled and reserved: `to` counts it
  // (a key whose budget changed keeps its spend, and requests in flight
  // keep their reservations).
  if (committed != 0) b.committed.fetch_add(committed, std::memory_order_acq_rel);
  if (spent != 0) b.spent.fetch_add(spent, std::memory_order_acq_rel);
}

std::uint32_t LocalLimiter::forward_of(const Scope& sc) const noexcept {
  // retire() marks the counters, then sets the link: one that saw a mark
  // waits out the few instructions between.
  std::uint32_t f;
  while ((f = sc.forward.load(std::memory_order_acquire)) == kNoScope) std::this_thread::yield();
  return f;
}

std::int64_t LocalLimiter::free_streams_sum(const Scope& sc) const noexcept {
  std::int64_t free = 0;
  for (std::uint32_t j = 0; j < shards_; ++j) free += sc.shards[j].free_streams.load(std::memory_order_acquire);
  return free;
}

bool LocalLimiter::acquire_inherited(std::uint32_t scope) {
  Scope& sc = at(scope);
  const std::int64_t was = sc.inherited.fetch_add(1, std::memory_order_acq_rel);
  if (was >= kDead / 2) return acquire_inherited(forward_of(sc));  // carried on too (the add fell in the old count)
  if (sc.max_streams == 0) return true;
  // Taken, then checked: never over the cap, at worst a refusal when two race.
  if (free_streams_sum(sc) >= sc.inherited.load(std::memory_order_acquire)) return true;
  release_inherited(scope);
  return false;
}

void LocalLimiter::release_inherited(std::uint32_t scope) {
  Scope& sc = at(scope);
  if (sc.inherited.fetch_sub(1, std::memory_order_acq_rel) >= kDead / 2) release_inherited(forward_of(sc));
}

void LocalLimiter::add_committed(std::uint32_t scope, std::int64_t delta) {
  Scope& sc = at(scope);
  if (sc.committed.fetch_add(delta, std::memory_order_acq_rel) >= kDeadSpend / 2) add_committed(forward_of(sc), delta);
}

void LocalLimiter::add_spent(std::uint32_t scope, std::int64_t delta) {
  Scope& sc = at(scope);
  if (sc.spent.fetch_add(delta, std::memory_order_acq_rel) >= kDeadSpend / 2) add_spent(forward_of(sc), delta);
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

std::int64_t LocalLimiter::ns(Instant t) const noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t - epoch_).count();
}

std::int64_t LocalLimiter::cost_ns(const Spec& s, double units) noexcept {
  const double v = units * s.t_ns;
  return v >= static_cast<double>(kFarNs) ? kFarNs : v <= 0 ? 0 : static_cast<std::int64_t>(v);  // floor
}

std::int64_t LocalLimiter::refund_ns(const Spec& s, double units) noexcept {
  const double v = std::ceil(units * s.t_ns);
  return v >= static_cast<double>(kFarNs) ? kFarNs : v <= 0 ? 0 : static_cast<std::int64_t>(v);
}

std::int64_t LocalLimiter::shard_ns(const Scope& sc, int bi, std::uint32_t j, std::int64_t now) const noexcept {
  const std::int64_t lag = sc.shards[j].tat[bi].load(std::memory_order_relaxed) - now;
  return sc.spec[bi].tau(j) - std::max<std::int64_t>(lag, 0);
}

double LocalLimiter::level(const Scope& sc, int bi, std::int64_t now) const noexcept {
  std::int64_t have = 0;
  for (std::uint32_t j = 0; j < shards_; ++j) have += shard_ns(sc, bi, j, now);
  return level_of(sc.spec[bi], have);
}

double LocalLimiter::level_of(const Spec& s, std::int64_t have) noexcept {
  // Full: the depth itself (have / t_ns is short of it by the ns cost_ns rounded away).
  // (Never above the depth: under 1 ns of refill per unit, each unit costs 1 ns and have / t_ns overstates.)
  return have >= s.total() ? s.depth : std::min(s.depth, static_cast<double>(have) / s.t_ns);
}

std::int64_t LocalLimiter::take_up_to(std::int64_t tau, std::atomic<std::int64_t>& tat, std::int64_t want,
                                      std::int64_t now) noexcept {
  std::int64_t cur = tat.load(std::memory_order_relaxed);
  while (true) {
    const std::int64_t base = std::max(cur, now);
    const std::int64_t avail = tau - (base - now);
    if (avail <= 0) return 0;
    const std::int64_t got = std::min(want, avail);
    if (tat.compare_exchange_weak(cur, base + got, std::memory_order_acq_rel, std::memory_order_relaxed)) return got;
  }
}

std::int64_t LocalLimiter::refund(std::atomic<std::int64_t>& tat, std::int64_t amount, std::int64_t now) noexcept {
  std::int64_t cur = tat.load(std::memory_order_relaxed);
  while (true) {
    if (cur <= now) return amount;  // a full bucket stays full
    const std::int64_t next = cur - std::min(amount, cur - now);
    if (tat.compare_exchange_weak(cur, next, std::memory_order_acq_rel, std::memory_order_relaxed))
      return amount - (cur - next);  // what did not fit
  }
}

TakeResult LocalLimiter::take(std::uint32_t scope, Bucket b, std::uint32_t worker, double cost, Instant now) {
  Scope& sc = at(scope);
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope) return take(f, b, worker, cost, now);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled || cost <= 0) return {};
  if (cost > s.depth + kEps) return TakeResult{.ok = false, .never = true};
  const std::int64_t t = ns(now);
  const int bi = static_cast<int>(b);
  const std::uint32_t own = shard_of(worker);
  // cost == depth is the whole bucket (the same rounding as Spec::total()).
  const std::int64_t need = std::clamp<std::int64_t>(cost_ns(s, cost), 1, s.total());
  std::int64_t got = take_up_to(s.tau(own), sc.shards[own].tat[bi], need, t);
  if (got >= need) return {};  // the common case: the worker's own shard had it

  std::int64_t taken[kMaxShards];
  taken[0] = got;
  std::uint32_t k = 1;
  for (; k < shards_ && got < need; ++k) {
    const std::uint32_t j = (own + k) % shards_;
    taken[k] = take_up_to(s.tau(j), sc.shards[j].tat[bi], need - got, t);
    got += taken[k];
  }
  if (got >= need) return {};
  // Not enough anywhere: put every borrowed unit back where it came from.
  for (std::uint32_t i = 0; i < k; ++i)
    if (taken[i] > 0) refund(sc.shards[(own + i) % shards_].tat[bi], taken[i], t);
  // The wait of these shards, not of one bucket at rate r: a full shard
  // gains nothing, so the bucket may refill at as little as r/N.
  return TakeResult{.ok = false, .retry_after_s = wait_seconds(wait_ns(sc, bi, need, t))};
}

double LocalLimiter::wait_ns(const Scope& sc, int bi, std::int64_t need, std::int64_t now) const noexcept {
  const Spec& s = sc.spec[bi];
  // Shard j gives take() clamp(tau_j - lag + dt, 0, tau_j) ns after dt ns: nothing
  // until its debt is paid (start = lag - tau_j), then 1 ns a ns until it is full (lag).
  std::int64_t starts[kMaxShards];
  std::int64_t fills[kMaxShards];
  std::uint32_t filling = 0;
  std::int64_t have = 0;
  for (std::uint32_t j = 0; j < shards_; ++j) {
    const std::int64_t tau = s.tau(j);
    const std::int64_t lag = sc.shards[j].tat[bi].load(std::memory_order_relaxed) - now;
    if (lag <= 0) {
      have += tau;  // full: gains nothing more
      continue;
    }
    have += std::clamp<std::int64_t>(tau - lag, 0, tau);
    starts[filling] = std::max<std::int64_t>(lag - tau, 0);
    fills[filling] = lag;
    ++filling;
  }
  if (have >= need) return 0;
  std::sort(starts, starts + filling);
  std::sort(fills, fills + filling);
  // Between two breakpoints the k shards that are filling gain k ns a ns.
  std::int64_t at = 0;
  std::uint32_t k = 0, si = 0, fi = 0;
  while (fi < filling) {
    const bool start_next = si < filling && starts[si] <= fills[fi];
    const std::int64_t next = start_next ? starts[si] : fills[fi];
    const std::int64_t gain = static_cast<std::int64_t>(k) * (next - at);
    if (k > 0 && have + gain >= need) return static_cast<double>(at) + static_cast<double>(need - have) / k;
    have += gain;
    at = next;
    if (start_next) {
      ++k;
      ++si;
    } else {
      --k;
      ++fi;
    }
  }
  return static_cast<double>(at);  // every shard full: the whole bucket (>= need)
}

std::uint32_t LocalLimiter::seconds_until(std::uint32_t scope, Bucket b, double cost, Instant now) const {
  const Scope& sc = at(scope);
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope) return seconds_until(f, b, cost, now);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled || cost <= 0 || cost > s.depth + kEps) return 0;
  const double w = wait_ns(sc, static_cast<int>(b), std::clamp<std::int64_t>(cost_ns(s, cost), 1, s.total()), ns(now));
  return w <= 0 ? 0 : wait_seconds(w);
}

std::uint32_t LocalLimiter::millis_until(std::uint32_t scope, Bucket b, double cost, Instant now) const {
  const Scope& sc = at(scope);
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope) return millis_until(f, b, cost, now);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled || cost <= 0 || cost > s.depth + kEps) return 0;
  const double w = wait_ns(sc, static_cast<int>(b), std::clamp<std::int64_t>(cost_ns(s, cost), 1, s.total()), ns(now));
  return w <= 0 ? 0 : wait_millis(w);
}

void LocalLimiter::give_back(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) {
  Scope& sc = at(scope);
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope)
    return give_back(f, b, worker, amount, now);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled || amount <= 0) return;
  // The worker's own shard first; what does not fit there (a reservation
  // that borrowed from other shards) goes to the others, so no unit the
  // request did not use is lost while the bucket as a whole has room.
  const std::int64_t t = ns(now);
  const int bi = static_cast<int>(b);
  const std::uint32_t own = shard_of(worker);
  std::int64_t left = refund(sc.shards[own].tat[bi], refund_ns(s, amount), t);
  for (std::uint32_t k = 1; k < shards_ && left > 0; ++k)
    left = refund(sc.shards[(own + k) % shards_].tat[bi], left, t);
}

void LocalLimiter::charge(std::uint32_t scope, Bucket b, std::uint32_t worker, double amount, Instant now) {
  Scope& sc = at(scope);
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope)
    return charge(f, b, worker, amount, now);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled || amount <= 0) return;
  // What the bucket still holds pays first (the worker's own shard, then
  // the others'), so a debt is only what the whole bucket cannot pay; that
  // is spread over every shard by its share. A debt on one shard alone let
  // the other workers admit from theirs while the bucket as a whole owed
  // (each shard refills at r/N: spread evenly, all come back to zero
  // together, when the whole bucket does).
  const std::int64_t t = ns(now);
  const int bi = static_cast<int>(b);
  const std::uint32_t own = shard_of(worker);
  const std::int64_t owe = cost_ns(s, amount);
  std::int64_t left = owe - take_up_to(s.tau(own), sc.shards[own].tat[bi], owe, t);
  for (std::uint32_t k = 1; k < shards_ && left > 0; ++k) {
    const std::uint32_t j = (own + k) % shards_;
    left -= take_up_to(s.tau(j), sc.shards[j].tat[bi], left, t);
  }
  if (left <= 0) return;
  for (std::uint32_t j = 0; j < shards_; ++j) {
    const std::int64_t share = left / shards_ + (j < left % shards_ ? 1 : 0);
    auto& tat = sc.shards[j].tat[bi];
    std::int64_t cur = tat.load(std::memory_order_relaxed);
    // A debt stops growing kFarNs ahead (no overflow, whatever is charged).
    while (!tat.compare_exchange_weak(cur, std::min(std::max(cur, t) + share, t + kFarNs), std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
    }
  }
}

double LocalLimiter::available(std::uint32_t scope, Bucket b, Instant now) const {
  const Scope& sc = at(scope);
  const Spec& s = sc.spec[static_cast<int>(b)];
  if (!s.enabled) return 0;
  return level(sc, static_cast<int>(b), ns(now));
}

BucketView LocalLimiter::view(std::uint32_t scope, Bucket b, Instant now) const {
  const Scope& sc = at(scope);
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope) return view(f, b, now);
  const Spec& s = sc.spec[static_cast<int>(b)];
  BucketView v;
  if (!s.enabled) return v;
  const std::int64_t t = ns(now);
  const int bi = static_cast<int>(b);
  std::int64_t have = 0;
  // Full again when its last shard is: each refills at r/N up to depth/N
  // and a full one gains nothing, so uneven shards take longer than
  // (depth - total) / r (up to N times).
  std::int64_t until_full_ns = 0;
  for (std::uint32_t j = 0; j < shards_; ++j) {
    have += shard_ns(sc, bi, j, t);
    until_full_ns = std::max(until_full_ns, sc.shards[j].tat[bi].load(std::memory_order_relaxed) - t);
  }
  const double total = level_of(s, have);
  v.limit = static_cast<std::uint64_t>(std::max(s.rate_per_min, s.depth));
  // Whole units a take could have now: the most u with cost_ns(u) <= have.
  std::uint64_t whole = total <= 0 ? 0 : static_cast<std::uint64_t>(std::floor(total));
  if (total > 0 && static_cast<double>(whole + 1) <= s.depth && cost_ns(s, static_cast<double>(whole + 1)) <= have)
    ++whole;
  v.remaining = whole;
  v.level = total;
  v.rate_per_min = s.rate_per_min;
  v.depth = s.depth;
  v.reset_ms = static_cast<std::uint64_t>((until_full_ns + 999'999) / 1'000'000);
  return v;
}

bool LocalLimiter::acquire_stream(std::uint32_t scope, std::uint32_t worker) {
  Scope& sc = at(scope);
  if (sc.max_streams == 0) return true;
  // A ticket of a scope carried since (a request admitted across a reload):
  // its slot counts where the scope's streams went.
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope) return acquire_inherited(f);
  const std::uint32_t own = shard_of(worker);
  for (std::uint32_t k = 0; k < shards_; ++k) {
    auto& free = sc.shards[(own + k) % shards_].free_streams;
    std::int64_t cur = free.load(std::memory_order_relaxed);
    while (cur > 0) {
      if (free.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
        // Streams of a scope carried here still run: they count too.
        if (sc.inherited.load(std::memory_order_acquire) > 0 &&
            free_streams_sum(sc) < sc.inherited.load(std::memory_order_acquire)) {
          release_stream(scope, worker);
          return false;
        }
        return true;
      }
    }
    if (cur <= -kDead / 2) return acquire_inherited(forward_of(sc));  // carried meanwhile
  }
  return false;
}

void LocalLimiter::release_stream(std::uint32_t scope, std::uint32_t worker) {
  Scope& sc = at(scope);
  if (sc.max_streams == 0) return;
  // Into a counter marked dead: the slot was carried with the scope's streams.
  if (sc.shards[shard_of(worker)].free_streams.fetch_add(1, std::memory_order_acq_rel) <= -kDead / 2)
    release_inherited(forward_of(sc));
}

std::uint64_t LocalLimiter::streams_in_use(std::uint32_t scope) const {
  const Scope& sc = at(scope);
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope) return streams_in_use(f);
  const std::int64_t own = sc.max_streams > 0 ? static_cast<std::int64_t>(sc.max_streams) - free_streams_sum(sc) : 0;
  return static_cast<std::uint64_t>(std::max<std::int64_t>(own + sc.inherited.load(std::memory_order_acquire), 0));
}

void LocalLimiter::roll(Scope& sc, Instant now) {
  if (sc.forward.load(std::memory_order_acquire) != kNoScope) return;  // carried: its counts are marked dead
  std::int64_t w = 0;
  if (sc.calendar != core::CalendarPeriod::none)
    w = core::calendar_window(sc.calendar, unix_ns(now), sc.utc_offset_s).index;
  else if (sc.period_ns > 0)
    w = unix_ns(now) / sc.period_ns;  // UTC-aligned, as budget.lua counts them
  else
    return;
  std::int64_t cur = sc.window.load(std::memory_order_acquire);
  // One winner rolls: the settled spend goes, the reservations of requests
  // in flight stay (committed - spent), so the new window counts them
  // against its limit and their settlement replaces them there. Both by
  // atomic adds: a concurrent reservation or settlement is never lost (one
  // that lands between them counts in the window it saw).
  if (w > cur && sc.window.compare_exchange_strong(cur, w, std::memory_order_acq_rel)) {
    const std::int64_t settled = sc.spent.exchange(0, std::memory_order_acq_rel);
    if (settled != 0) sc.committed.fetch_sub(settled, std::memory_order_acq_rel);
  }
}

TakeResult LocalLimiter::reserve_spend(std::uint32_t scope, std::int64_t nano_usd, Instant now) {
  Scope& sc = at(scope);
  // Reserved where the scope was carried; settled through the link (settle_spend).
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope) return reserve_spend(f, nano_usd, now);
  if (!sc.has_budget) return {};
  roll(sc, now);
  const std::int64_t limit = sc.budget_nano_usd;
  if (nano_usd > limit) return TakeResult{.ok = false, .never = true};
  std::int64_t cur = sc.committed.load(std::memory_order_relaxed);
  while (cur < limit && cur + nano_usd <= limit) {
    if (sc.committed.compare_exchange_weak(cur, cur + nano_usd, std::memory_order_acq_rel, std::memory_order_relaxed))
      return {};
  }
  if (cur >= kDeadSpend / 2) return reserve_spend(scope, nano_usd, now);  // carried meanwhile: the link is set
  return TakeResult{.ok = false, .retry_after_s = budget_retry_after(sc, nano_usd, now)};
}

std::int64_t LocalLimiter::budget_wait_ns(const Scope& sc, std::int64_t nano_usd, Instant now) const noexcept {
  const std::int64_t limit = sc.budget_nano_usd;
  if (limit <= 0) return -1;  // $0: nothing is ever admitted
  const std::int64_t settled = sc.spent.load(std::memory_order_acquire);
  if (settled < limit && settled + nano_usd <= limit) return 0;  // reservations in flight are in the way
  if (sc.calendar != core::CalendarPeriod::none)                 // until the next calendar window starts
    return core::calendar_window(sc.calendar, unix_ns(now), sc.utc_offset_s).end_ns - unix_ns(now);
  if (sc.period_ns <= 0) return -1;                   // never resets
  return sc.period_ns - unix_ns(now) % sc.period_ns;  // until the window rolls
}

std::uint32_t LocalLimiter::budget_retry_after(const Scope& sc, std::int64_t nano_usd, Instant now) const noexcept {
  const std::int64_t ns = budget_wait_ns(sc, nano_usd, now);
  return ns < 0 ? 0 : ns == 0 ? 1 : whole_seconds_up(ns);
}

std::uint32_t LocalLimiter::budget_retry_after_ms(std::uint32_t scope, std::int64_t nano_usd, Instant now) const {
  const Scope& sc = at(scope);
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope)
    return budget_retry_after_ms(f, nano_usd, now);
  if (!sc.has_budget) return 0;
  const std::int64_t ns = budget_wait_ns(sc, nano_usd, now);
  return ns > 0 ? whole_millis_up(ns) : 0;
}

void LocalLimiter::settle_spend(std::uint32_t scope, std::int64_t reserved, std::int64_t actual, Instant now) {
  Scope& sc = at(scope);
  // Carried: the reservation went with the scope's committed spend (retire()).
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope)
    return settle_spend(f, reserved, actual, now);
  if (!sc.has_budget) return;
  roll(sc, now);
  // A reservation from an earlier period was carried into this one (roll()):
  // the cost replaces it here.
  const std::int64_t delta = actual - reserved;
  if (delta != 0) add_committed(scope, delta);
  if (actual > 0) add_spent(scope, actual);
}

std::int64_t LocalLimiter::spent(std::uint32_t scope, Instant now) {
  Scope& sc = at(scope);
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope) return spent(f, now);
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
  if (const auto f = sc.forward.load(std::memory_order_acquire); f != kNoScope) return committed(f, now);
  roll(sc, now);
  return sc.committed.load(std::memory_order_acquire);
}

}  // namespace weir::admission
