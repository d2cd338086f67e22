// RedisLimiter's control plane: the sync loop (leases, stream slots,
// budgets in one pipelined round trip), refills, outages and shutdown.
#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "admission/redis_errors.hpp"
#include "admission/redis_limiter.hpp"
#include "admission/redis_limiter_state.hpp"
#include "admission/redis_scripts.hpp"
#include "core/keep_running.hpp"
#include "core/saturating.hpp"

namespace weir::admission {

namespace {

namespace asio = boost::asio;
using core::Timer;
using core::use_task;
using redis_detail::whole_up;

}  // namespace

// ---------------------------------------------------------------- control plane

void RedisLimiter::start() {
  if (loop_->running) return;
  loop_->running = true;
  loop_->finished = false;
  loop_->again = true;  // the first sync (every budget) at once
  loop_->done.expires_at(Timer::time_point::max());
  client_->start();
  // (Started again after an exception: with its wait first, never at once into the sync that threw.)
  asio::co_spawn(control_,
                 core::keep_running("the Redis limiter sync",
                                    [this, first = true]() mutable {
                                      if (!std::exchange(first, false)) loop_->again = false;
                                      return run();
                                    }),
                 asio::detached);
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
  bool streams = false;
  for (std::uint8_t k = 0; k < need.count && k < Shortfall::kMax; ++k) {
    const Need& n = need.needs[k];
    if (n.scope >= scope_count_) continue;
    woken_.push_back(n.scope);  // walked by the next sync, quiet or not
    if (n.what == Resource::streams) {
      at(n.scope).slots_ctl.waiting += std::max<std::int64_t>(1, whole_up(n.units));
      streams = streams || at(n.scope).max_streams > 0;
    } else if (n.what == Resource::budget) {
      at(n.scope).spend_ctl.waiting += n.units;
    } else {
      at(n.scope).lease_ctl[n.what == Resource::tokens ? 1 : 0].waiting += n.units;
    }
  }
  if (streams) {
    // A slot another replica holds idle comes back at its next renewal (it
    // sees this one's demand), a few renewals at most: wait that long.
    const auto busy_renew =
        std::max<std::chrono::milliseconds>(5 * config_.sync_interval, std::chrono::milliseconds(100));
    slot_waiters_.push_back(SlotWaiter{std::move(done), need, MonoClock::now() + 3 * busy_renew});
  } else {
    waiters_.push_back(std::move(done));
  }
  // A request's first wait starts a sync; a later one (it lost the units to
  // another request) waits for the next tick, every sync_interval.
  if (!need.again) wake();
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
    if (client_->connected() && client_->stats().connects != policy_checked_) co_await check_eviction();
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
  // What only this replica knows (spend not pushed yet, debt) is lost when
  // it exits: a client waiting to reconnect after an outage would fail the
  // final push at once, so it connects now (at most connect_timeout), and
  // the push has its command_timeout. report_unpushed() says what did not get there.
  co_await client_->reconnect_now();
  loop_->final_error.clear();
  loop_->final_maybe_sent = false;
  co_await sync_once(true);
  report_unpushed();
  client_->stop();
  auto waiters = std::move(waiters_);
  waiters_.clear();
  for (auto& w : waiters) w();
  auto slot_waiters = std::move(slot_waiters_);
  slot_waiters_.clear();
  for (auto& w : slot_waiters) w.done();
}

store::Task<void> RedisLimiter::check_eviction() {
  const std::uint64_t conn = client_->stats().connects;
  std::string policy;
  auto info = co_await client_->exec(store::Command{"INFO", "memory"});
  if (info && info->type == store::Reply::Type::string) {
    constexpr std::string_view kField = "maxmemory_policy:";
    if (const auto at = info->str.find(kField); at != std::string::npos) {
      const auto from = at + kField.size();
      policy = info->str.substr(from, info->str.find_first_of("\r\n", from) - from);
    }
  } else if (info || info.error().code == store::Errc::server) {
    // INFO refused (an ACL without it, a managed Redis that renames it): CONFIG GET, which may be refused too.
    auto cfg = co_await client_->exec(store::Command{"CONFIG", "GET", "maxmemory-policy"});
    if (cfg && cfg->type == store::Reply::Type::array && cfg->elements.size() == 2)
      policy = cfg->elements[1].str;
    else if (!cfg && cfg.error().code != store::Errc::server)
      co_return;  // no answer: asked again next tick
  } else {
    co_return;  // no answer: asked again next tick
  }
  policy_checked_ = conn;
  if (policy.empty()) co_return;  // Redis would not say: nothing to warn of
  const bool evicting = policy != "noeviction";
  evicting_.store(evicting, std::memory_order_relaxed);
  if (!evicting) {
    policy_warned_.clear();
    co_return;
  }
  if (policy == policy_warned_) co_return;
  policy_warned_ = policy;
  log_state(fmt::format(
      "Redis {} has maxmemory-policy {}: under memory pressure it evicts keys{}, silently: virtual keys "
      "vanish (their requests get 401), budgets' spend and rate buckets start over (limits are exceeded); set "
      "maxmemory-policy noeviction "
      "(docs/admission.md, \"Redis requirements\")",
      store::endpoint_text(config_.host, config_.port), policy,
      policy.starts_with("volatile") ? " that have a TTL" : ""));
}

store::Task<void> RedisLimiter::sync_once(bool final_sync) {
  // One round trip: the plan (leases, stream slots, budgets, the outage's probe), Redis's replies read for
  // errors (an outage, a key of bad data), then each reply applied to its scope.
  // Waiting requests retry on their worker after the sync; what they were
  // granted must not go back (as excess) before then.
  const auto grace = std::max<std::chrono::milliseconds>(5 * config_.sync_interval, std::chrono::milliseconds(100));
  const Instant now = MonoClock::now();
  const bool deg = degraded_.load(std::memory_order_relaxed);
  auto waiters = std::move(waiters_);
  waiters_.clear();
  auto slot_waiters = std::move(slot_waiters_);
  slot_waiters_.clear();
  plan_walk(final_sync || deg || now >= next_full_walk_, now);

  SyncPlan p{now, deg, final_sync, {}, {}};
  plan_leases(p);
  plan_slots(p);
  plan_budgets(p);
  plan_probe(p);
  const auto& ops = p.ops;
  // The next partial walk's scopes: those this one sent a command (its answer changes them) or did not find quiet.
  for (const Op& op : ops)
    if (op.kind != Op::Kind::probe) at(op.kind == Op::Kind::lease ? op.i / 2 : op.i).sent = walk_no_;
  busy_.clear();
  for (const std::uint32_t i : visit_)
    if (at(i).sent == walk_no_ || !quiet(i, now)) busy_.push_back(i);
  if (p.cmds.empty()) {
    for (auto& w : waiters) w();
    settle_slot_waiters(std::move(slot_waiters), final_sync, grace);
    co_return;
  }

  const Instant sent = MonoClock::now();
  syncing_ = true;
  auto results = co_await client_->exec(std::move(p.cmds));
  syncing_ = false;
  const Instant replied = MonoClock::now();

  bool answered = false;  // Redis replied with an error (it is up, but cannot do our work)
  const std::string outage = read_errors(p, results, answered);
  if (outage.empty()) {
    syncs_.fetch_add(1, std::memory_order_relaxed);
    const double rtt = std::chrono::duration<double>(replied - sent).count();
    loop_->rtt_s = rtt >= loop_->rtt_s ? rtt : loop_->rtt_s + (rtt - loop_->rtt_s) * 0.1;
    if (deg) next_full_walk_ = Instant{};  // after an outage, every scope at once (re-seeds, renewals)
    leave_degraded();
  } else {
    sync_failures_.fetch_add(1, std::memory_order_relaxed);
  }

  for (std::size_t k = 0; k < ops.size(); ++k) {
    const Op& op = ops[k];
    if (op.kind == Op::Kind::lease) apply_lease(op, results[k], replied, grace);
    if (op.kind == Op::Kind::slots) apply_slots(op, results[k], replied, grace, deg && !outage.empty());
    if (op.kind == Op::Kind::spend) apply_spend(op, results[k], replied, grace);
  }
  if (outage.empty()) {
    synced_.store(true, std::memory_order_release);
  } else if (!final_sync) {
    enter_degraded(outage, answered);
  }
  for (auto& w : waiters) w();
  settle_slot_waiters(std::move(slot_waiters), final_sync || !outage.empty(), grace);
}

// ---------------------------------------------------------------- sync_once's steps (plan_*: redis_plan.cpp)

const std::string& RedisLimiter::op_key(const SyncOp& op) const {
  // (The budget's base key: the script names the period's.)
  switch (op.kind) {
    case Op::Kind::lease:
      return at(op.i / 2).lease_ctl[op.i % 2].key;
    case Op::Kind::slots:
      return at(op.i).slots_ctl.key;
    case Op::Kind::spend:
      return at(op.i).spend_ctl.key;
    case Op::Kind::probe:
      break;
  }
  return config_.key_prefix;
}

std::string RedisLimiter::read_errors(const SyncPlan& p, const std::vector<store::Result<store::Reply>>& results,
                                      bool& answered) {
  const bool deg = p.deg;
  const bool final_sync = p.final_sync;
  const auto& ops = p.ops;
  std::string outage;
  for (std::size_t k = 0; k < results.size(); ++k) {
    if (results[k]) {
      // A key that failed before and works again is reported again if it fails again.
      if (!bad_keys_.empty() && k < ops.size() && ops[k].kind != Op::Kind::probe) {
        const auto& r = *results[k];
        const std::size_t flag = ops[k].kind == Op::Kind::lease ? 3 : ops[k].kind == Op::Kind::slots ? 4 : 6;
        if (r.elements.size() <= flag || r.elements[flag].str.empty()) bad_keys_.erase(op_key(ops[k]));
      }
      continue;
    }
    const store::Error& e = results[k].error();
    if (final_sync && loop_->final_error.empty()) {
      loop_->final_error = outage_reason(e);
      // Written, then no answer: Redis may still run it (a stopped one, resumed); a push counts once either way.
      loop_->final_maybe_sent = e.code == store::Errc::timeout || e.code == store::Errc::connection_lost;
    }
    if (e.code == store::Errc::server && ops[k].kind != Op::Kind::probe && key_data_error(e.message)) {
      // One scope's key holds data its script cannot use: that scope gets
      // nothing from this sync (its requests wait or are refused as on an
      // empty bucket); Redis works for every other scope.
      key_errors_.fetch_add(1, std::memory_order_relaxed);
      if (bad_keys_.insert(op_key(ops[k])).second)
        log(
            fmt::format("Redis key {} unusable ({}): its scope gets no shared state until it is fixed or deleted; "
                        "every other scope is unaffected",
                        op_key(ops[k]), outage_reason(e)));
      continue;
    }
    if (!outage.empty()) continue;
    outage = outage_reason(e);
    // Replies come in order: the commands before this one were answered, so a timeout here names the key
    // Redis was working on when the time ran out (or had not reached: a Redis that stopped answering).
    if (e.code == store::Errc::timeout && k < ops.size() && ops[k].kind != Op::Kind::probe)
      outage += fmt::format(" (the first unanswered command: the {} script on {})",
                            ops[k].kind == Op::Kind::lease   ? "lease"
                            : ops[k].kind == Op::Kind::slots ? "slots"
                                                             : "budget",
                            op_key(ops[k]));
    answered = e.code == store::Errc::server;
    // The probe of this outage replays the op that failed (or writes a key of ours).
    if (!deg) {
      const Op& op = ops[k];
      loop_->probe_kind = op.kind == Op::Kind::lease   ? Loop::Probe::lease
                          : op.kind == Op::Kind::slots ? Loop::Probe::slots
                          : op.kind == Op::Kind::spend ? Loop::Probe::spend
                                                       : Loop::Probe::key;
      loop_->probe_i = op.i;
    }
  }
  return outage;
}

void RedisLimiter::apply_lease(const SyncOp& op, const store::Result<store::Reply>& r, Instant replied,
                               std::chrono::milliseconds grace) {
  const bool ok = r && r->type == store::Reply::Type::array && r->elements.size() >= 2;

  Lease& l = at(op.i / 2).lease[op.i % 2];
  LeaseCtl& c = at(op.i / 2).lease_ctl[op.i % 2];
  c.taken += static_cast<double>(std::max<std::int64_t>(0, c.seen - l.units.load(std::memory_order_relaxed)));
  if (ok && r->elements.size() >= 4) note_reset(r->elements[3].str);
  if (ok && r->elements.size() >= 3) {
    const std::int64_t grant = r->elements[0].as_int();
    if (grant > 0) {
      l.units.fetch_add(grant, std::memory_order_acq_rel);
      units_granted_.fetch_add(static_cast<std::uint64_t>(grant), std::memory_order_relaxed);
    }
    if (op.for_waiters && grant > 0) c.keep_until = replied + grace;
    l.remote_avail.store(static_cast<double>(r->elements[1].as_int()), std::memory_order_relaxed);
    l.remote_at_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(replied - epoch_).count(),
                         std::memory_order_relaxed);
    leases_n_.fetch_add(1, std::memory_order_relaxed);
  } else {
    // Debt stays local (counted twice if it did reach Redis); units given
    // back stay lost unless they certainly never left: both on the safe side.
    if (op.c > 0) l.units.fetch_sub(op.c, std::memory_order_acq_rel);
    if (op.b > 0 && !r && r.error().not_sent()) l.units.fetch_add(op.b, std::memory_order_acq_rel);
  }
  c.seen = l.units.load(std::memory_order_relaxed);
  return;
}

void RedisLimiter::apply_slots(const SyncOp& op, const store::Result<store::Reply>& r, Instant replied,
                               std::chrono::milliseconds grace, bool frozen) {
  const bool ok = r && r->type == store::Reply::Type::array && r->elements.size() >= 2;
  const double replied_ns = ns(replied);

  // (During an outage that goes on the allowance is the local share.)
  if (ok && r->elements.size() >= 5) note_reset(r->elements[4].str);
  if (!ok || frozen) return;
  Slots& s = at(op.i).slots;
  SlotsCtl& c = at(op.i).slots_ctl;
  const std::int64_t grant = r->elements[0].as_int();
  const std::int64_t before = s.allowance.load(std::memory_order_relaxed);
  s.allowance.store(grant, std::memory_order_release);
  s.free.fetch_add(grant - before, std::memory_order_acq_rel);
  s.others.store(r->elements[1].as_int(), std::memory_order_relaxed);
  s.others_used.store(r->elements.size() >= 4 ? r->elements[3].as_int() : r->elements[1].as_int(),
                      std::memory_order_relaxed);
  s.reply_ns.store(replied_ns, std::memory_order_release);
  c.contended = r->elements.size() >= 3 && r->elements[2].as_int() > 0;
  c.told_want = op.a;
  c.told_demand = op.c;
  c.recorded = std::max(grant, op.b);
  c.last_renew = replied;
  if (op.for_waiters && grant > before) c.keep_until = replied + grace;
  c.seen_free = s.free.load(std::memory_order_relaxed);
  return;
}

void RedisLimiter::apply_spend(const SyncOp& op, const store::Result<store::Reply>& r, Instant replied,
                               std::chrono::milliseconds grace) {
  const bool ok = r && r->type == store::Reply::Type::array && r->elements.size() >= 2;

  if (ok && r->elements.size() >= 7) note_reset(r->elements[6].str);
  if (!ok || r->elements.size() < 6) return;
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
  // The members it named are merged into this one's (later folds wait for the next push).
  c.folds.erase(c.folds.begin(),
                c.folds.begin() + std::min<std::int64_t>(op.c, static_cast<std::int64_t>(c.folds.size())));
  sp.free.fetch_add(grant - c.allowance + just_pushed, std::memory_order_acq_rel);
  c.allowance = grant;
  if (c.idx >= 0 && idx != c.idx) {
    // The period rolled over: what was pushed belongs to the old one.
    sp.mine.fetch_sub(op.a, std::memory_order_acq_rel);
    c.pushed = 0;
    c.carried.clear();  // (it was that period's)
    c.skip = 0;
  } else if (c.idx >= 0) {
    c.pushed = op.a;
  }
  if (c.idx < 0 && !c.carried.empty()) {
    // The period is known: what its hash counts already of the spend carried in.
    const std::string hash = period_hash(c, idx);
    for (const auto& [set, n] : c.carried)
      if (holds_hash(set, hash)) c.skip += n;
  }
  c.idx = idx;
  // That part of `mine` is in `total` under another member, not in this one's `s:`.
  sp.others.store(std::max<std::int64_t>(total - mine_remote - c.skip, 0), std::memory_order_release);
  c.remaining = c.limit - total - others_alloc;
  sp.spare.store(std::max<std::int64_t>(0, c.remaining - grant), std::memory_order_relaxed);
  if (op.for_waiters && grant > 0) c.keep_until = replied + grace;
  c.seen_free = sp.free.load(std::memory_order_relaxed);
  // The key's PTTL is Redis's to say: a huge one is a period that never ends, not an overflow.
  c.period_end = left < 0 ? Instant::max() : core::saturating_add(replied, std::chrono::milliseconds(left));
  const std::chrono::duration<double, std::nano> end(ns(c.period_end));
  sp.period_end_ns.store(left < 0 ? -1 : core::saturating_cast<std::chrono::nanoseconds>(end).count(),
                         std::memory_order_relaxed);
  sp.period_idx.store(idx, std::memory_order_relaxed);
  return;
}

void RedisLimiter::settle_slot_waiters(std::vector<SlotWaiter> waiters, bool all, std::chrono::milliseconds grace) {
  // A request waiting for a stream slot retries (its answer final) when a
  // slot came, when the cap is full of streams in flight (the others' and
  // this replica's: waiting cannot help), or at its deadline. Otherwise a
  // slot is held idle by another replica, which gives it back at its next
  // renewal now that this one's demand is recorded: ask again next sync.
  const Instant now = MonoClock::now();
  for (auto& w : waiters) {
    bool wait = !all && now < w.until && !degraded_.load(std::memory_order_relaxed) && loop_->running;
    for (std::uint8_t k = 0; wait && k < w.need.count && k < Shortfall::kMax; ++k) {
      const Need& n = w.need.needs[k];
      if (n.what != Resource::streams || n.scope >= scope_count_ || at(n.scope).max_streams == 0) continue;
      const Slots& s = at(n.scope).slots;
      const std::int64_t free = s.free.load(std::memory_order_acquire);
      const std::int64_t mine = std::max<std::int64_t>(0, s.allowance.load(std::memory_order_relaxed) - free);
      if (free > 0 || s.others_used.load(std::memory_order_relaxed) + mine >= at(n.scope).max_streams) wait = false;
    }
    if (!wait) {
      w.done();
      continue;
    }
    // Ask again; what the other needs of the request were granted stays for its retry.
    for (std::uint8_t k = 0; k < w.need.count && k < Shortfall::kMax; ++k) {
      const Need& n = w.need.needs[k];
      if (n.scope >= scope_count_) continue;
      woken_.push_back(n.scope);
      if (n.what == Resource::streams) {
        at(n.scope).slots_ctl.waiting += std::max<std::int64_t>(1, whole_up(n.units));
      } else if (n.what == Resource::budget) {
        at(n.scope).spend_ctl.keep_until = std::max(at(n.scope).spend_ctl.keep_until, now + grace);
      } else {
        LeaseCtl& c = at(n.scope).lease_ctl[n.what == Resource::tokens ? 1 : 0];
        c.keep_until = std::max(c.keep_until, now + grace);
      }
    }
    slot_waiters_.push_back(std::move(w));
  }
}

}  // namespace weir::admission
