// RedisLimiter's sync, what it sends: sync_once's planning steps (redis_sync.cpp runs the loop, sends the
// pipeline and applies the replies): each lease's top-up, return or debt (plan_leases), each scope's stream
// slots (plan_slots), each budget's push and allowance (plan_budgets), and the probe of an idle connection
// (plan_probe), as commands and the ops their replies apply to.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "admission/redis_errors.hpp"
#include "admission/redis_limiter.hpp"
#include "admission/redis_limiter_state.hpp"
#include "admission/redis_scripts.hpp"
#include "core/saturating.hpp"

namespace weir::admission {

namespace {

using redis_detail::whole_down;
using redis_detail::whole_up;

// Time over which a lease's demand is smoothed, seconds: a burst raises it
// within a few ticks, one quiet tick does not drop it.
constexpr double kDemandTau = 0.5;

// A number as a script's argument.
template <class T>
std::string str(T v) {
  return fmt::format("{}", v);
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

}  // namespace

void RedisLimiter::plan_leases(SyncPlan& p) {
  const Instant now = p.now;
  const bool deg = p.deg;
  const bool final_sync = p.final_sync;
  auto& cmds = p.cmds;
  auto& ops = p.ops;
  // Leases (frozen during an outage: takes go to the fallback then).
  // A top-up asked when a lease falls below half its target arrives within
  // `horizon` (the sync in flight, the next tick, its round trip): a lease
  // whose demand over that time is more than half the configured target
  // grows to twice that demand, up to its cap, so a steady rate does not
  // wait for Redis on every request when the round trip is long (a 600 RPM
  // scope's configured lease is one request).
  const double horizon = 2 * loop_->rtt_s + std::chrono::duration<double>(config_.sync_interval).count();
  if (!deg || final_sync) {
    for (std::uint32_t v = 0; v < visit_.size() * 2; ++v) {
      const std::uint32_t i = visit_[v / 2] * 2 + v % 2;
      const Spec& s = at(i / 2).spec[i % 2];
      if (!s.enabled) continue;
      Lease& l = at(i / 2).lease[i % 2];
      LeaseCtl& c = at(i / 2).lease_ctl[i % 2];
      const std::int64_t u = l.units.load(std::memory_order_acquire);
      const bool wanted = l.wanted.load(std::memory_order_relaxed) && l.wanted.exchange(false);
      const bool used = wanted || u != c.seen || c.waiting > 0;
      if (used) c.last_used = now;
      const bool active = now - c.last_used < config_.lease_idle;
      // Demand: units taken since the last tick (and while the last sync
      // was on its way: see the reply) plus those waiting requests need.
      c.taken += static_cast<double>(std::max<std::int64_t>(0, c.seen - u));
      const double dt = std::chrono::duration<double>(now - c.measured_at).count();
      if (c.measured_at != Instant{} && dt > 0)
        c.demand += ((c.taken + c.waiting) / dt - c.demand) * std::min(1.0, dt / kDemandTau);
      c.measured_at = now;
      c.taken = 0;
      if (!active) c.demand = 0;
      c.target = std::clamp<std::int64_t>(whole_up(2 * c.demand * horizon), c.base, c.cap);
      c.low = (c.target + 1) / 2;
      c.high = 2 * c.target;
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
      c.seen = l.units.load(std::memory_order_relaxed);  // takes until the reply count as demand
      const std::string keys[] = {c.key};
      const std::string args[] = {str(std::llround(s.rate_per_min)), str(std::llround(s.depth)), str(ask), str(put),
                                  str(owe)};
      cmds.push_back(store::Command::evalsha(lease_script(), keys, args));
      ops.push_back(Op{Op::Kind::lease, i, ask, put, owe, waiting});
    }
  }
}

void RedisLimiter::plan_slots(SyncPlan& p) {
  const Instant now = p.now;
  const bool deg = p.deg;
  const bool final_sync = p.final_sync;
  auto& cmds = p.cmds;
  auto& ops = p.ops;
  // Stream slots.
  const auto renew_every = config_.slot_ttl / 3;
  // A busy replica renews this often, so it learns within ~100 ms that
  // another replica is starved and shrinks to its fair share (slots.lua).
  const auto busy_renew =
      std::max<std::chrono::milliseconds>(5 * config_.sync_interval, std::chrono::milliseconds(100));
  for (const std::uint32_t i : visit_) {
    const std::int64_t limit = at(i).max_streams;
    if (limit == 0) continue;
    Slots& s = at(i).slots;
    SlotsCtl& c = at(i).slots_ctl;
    std::int64_t a = s.allowance.load(std::memory_order_relaxed);
    std::int64_t free = s.free.load(std::memory_order_acquire);
    std::int64_t inuse = std::max<std::int64_t>(0, a - free);
    const bool wanted = s.wanted.load(std::memory_order_relaxed) && s.wanted.exchange(false);
    const bool used = wanted || free != c.seen_free || c.waiting > 0;
    if (used) c.last_used = now;
    const bool superseded = s.superseded.load(std::memory_order_relaxed);
    const bool active = !superseded && now - c.last_used < config_.lease_idle;
    // Demand: requests waiting for a slot, or refused one, since the last
    // sync; it stays recorded while this replica is active and still short
    // of its headroom (a client refused here will ask again).
    const bool still_short = c.told_demand > 0 && active && a < inuse + c.headroom;
    const std::int64_t demand = c.waiting + (wanted || still_short ? 1 : 0);
    std::int64_t want = 0;
    const bool keep = !superseded && now < c.keep_until;
    // While another replica needs slots (contended) and none of this one's
    // requests does, it keeps no idle headroom: the spare slot goes to the
    // replica that is waiting for it (a cap smaller than the replicas).
    const std::int64_t spare = c.contended && demand == 0 ? 0 : c.headroom;
    if (!final_sync) want = std::min(limit, active ? inuse + spare + c.waiting : inuse);
    if (keep && !final_sync) want = std::max(want, std::min(a, limit));
    const bool holding = a > 0 || inuse > 0;
    const bool need = final_sync ? holding
                                 : (c.waiting > 0 || (deg && holding) || (active && free < c.low && want != a) ||
                                    (free > 2 * c.headroom && !keep) || (!active && a > inuse && !keep) ||
                                    (holding && now - c.last_renew >= renew_every) ||
                                    (active && holding && (c.contended || now - c.last_renew >= busy_renew)) ||
                                    (c.told_want > std::max(a, inuse) && want <= a) ||
                                    (c.told_demand > 0 && demand == 0) || (c.recorded > std::max(a, inuse) && !deg));
    const bool waiting = c.waiting > 0;
    c.waiting = 0;
    c.seen_free = free;
    if (!need) continue;
    if (want < a && !deg) {
      // Shrink here first, by the free slots only: then what Redis records
      // (`floor` below) covers every slot workers can take until the answer
      // arrives, and no other replica is granted a slot in use here.
      std::int64_t cur = s.free.load(std::memory_order_acquire);
      std::int64_t drop = 0;
      while (cur > 0) {
        drop = std::min(cur, a - want);
        if (s.free.compare_exchange_weak(cur, cur - drop, std::memory_order_acq_rel, std::memory_order_relaxed)) break;
        drop = 0;
      }
      if (drop > 0) {
        a -= drop;
        s.allowance.store(a, std::memory_order_release);
        free = s.free.load(std::memory_order_acquire);
        inuse = std::max<std::int64_t>(0, a - free);
        c.seen_free = free;
      }
    }
    // Redis records this replica at no less than the slots it may be using
    // until the answer: its allowance (workers take free slots meanwhile).
    const std::int64_t floor = std::max(a, inuse);
    const std::string keys[] = {c.key};
    const std::string args[] = {at(i).member, str(want),  str(floor), str(limit), str(config_.slot_ttl.count()),
                                str(inuse),   str(demand)};
    cmds.push_back(store::Command::evalsha(slots_script(), keys, args));
    ops.push_back(Op{Op::Kind::slots, i, want, floor, demand, waiting});
  }
}

void RedisLimiter::plan_budgets(SyncPlan& p) {
  const Instant now = p.now;
  const bool deg = p.deg;
  const bool final_sync = p.final_sync;
  auto& cmds = p.cmds;
  auto& ops = p.ops;
  // Budgets: push this replica's settled spend, renew its allowance for
  // reservations (top up below half the headroom, give back above twice it),
  // read the others' spend.
  for (const std::uint32_t i : visit_) {
    SpendCtl& c = at(i).spend_ctl;
    if (!c.enabled) continue;
    // A retired scope folds into its successor once drained, and is not synced after (fold_retired).
    // (Not in the final sync: its successor's push may be built already.)
    if (at(i).successor != ScopeState::kNoScope &&
        (deg || final_sync ? at(i).folded_into.load() != ScopeState::kNoScope : fold_retired(i)))
      continue;
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
    } else if (now - c.last_sync >= config_.budget_sync_interval && (touched || mine != c.pushed || !c.folds.empty())) {
      due = true;  // push the spend, read the others'
    } else if (c.allowance > 0 && now - c.last_sync >= config_.slot_ttl / 3) {
      due = true;  // renew before the allowance expires
    } else if (mine > 0 && (now - c.last_sync >= config_.slot_ttl / 3 || c.last_sync < loop_->recovered)) {
      // Re-seed, idle or not: a Redis that lost its data (a restart, a
      // failover to an empty replica) holds only the spend of replicas that
      // pushed since, and would grant the others' share again. Every replica
      // pushes its spend at once after an outage it saw, and every
      // slot_ttl / 3 in any case.
      due = true;
    }
    const bool waiting = c.waiting > 0;
    c.waiting = 0;
    c.seen_free = free;
    if (!due) continue;
    c.last_sync = now;
    const std::string keys[] = {c.key};
    // What the period's hash counts already of the carried spend is not pushed again (SpendCtl::skip).
    // Then the members of the retired scopes folded into this one (SpendCtl::folds), merged into its own.
    std::vector<std::string> args = {
        at(i).member,    str(c.period_ms), str(c.idx),   str(std::max<std::int64_t>(mine - c.skip, 0)),
        str(inuse),      str(want),        str(c.limit), str(config_.slot_ttl.count()),
        str(c.calendar), str(c.offset_ms)};
    if (c.idx >= 0) args.insert(args.end(), c.folds.begin(), c.folds.end());
    const auto folds = static_cast<std::int64_t>(c.idx >= 0 ? c.folds.size() : 0);
    cmds.push_back(store::Command::evalsha(budget_script(), keys, args));
    ops.push_back(Op{Op::Kind::spend, i, mine, inuse, folds, waiting});
  }
}

void RedisLimiter::plan_probe(SyncPlan& p) {
  const bool deg = p.deg;
  const bool final_sync = p.final_sync;
  auto& cmds = p.cmds;
  auto& ops = p.ops;
  if (deg && !final_sync) {
    // Probe: can Redis do our work again? Not a PING, which Redis answers
    // under OOM, READONLY, MISCONF or a NOPERM on EVALSHA alike: the lease
    // that failed, replayed without asking, putting or owing (it only
    // refills the bucket it writes), else a script that writes a key of
    // ours. Its reply is only checked for an error.
    // A slot or budget that failed is replayed too (as a renewal of what
    // this replica holds: its streams in flight, its allowance), so an
    // error only that key's script meets (a NOPERM on one key pattern) does
    // not end the outage here to start it again at the next sync.
    const std::uint32_t pi = loop_->probe_i;
    if (loop_->probe_kind == Loop::Probe::lease && pi < scope_count_ * 2 && at(pi / 2).spec[pi % 2].enabled) {
      const Spec& sp = at(pi / 2).spec[pi % 2];
      const std::string keys[] = {at(pi / 2).lease_ctl[pi % 2].key};
      const std::string args[] = {str(std::llround(sp.rate_per_min)), str(std::llround(sp.depth)), "0", "0", "0"};
      cmds.push_back(store::Command::evalsha(lease_script(), keys, args));
    } else if (loop_->probe_kind == Loop::Probe::slots && pi < scope_count_ && at(pi).max_streams > 0) {
      const Slots& sl = at(pi).slots;
      const std::int64_t inuse = std::max<std::int64_t>(
          0, sl.allowance.load(std::memory_order_relaxed) - sl.free.load(std::memory_order_acquire));
      const std::string keys[] = {at(pi).slots_ctl.key};
      const std::string args[] = {
          at(pi).member, "0", str(inuse), str(at(pi).max_streams), str(config_.slot_ttl.count()), str(inuse), "0"};
      cmds.push_back(store::Command::evalsha(slots_script(), keys, args));
    } else if (loop_->probe_kind == Loop::Probe::spend && pi < scope_count_ && at(pi).spend_ctl.enabled) {
      const SpendCtl& c = at(pi).spend_ctl;
      const std::int64_t inuse = std::max<std::int64_t>(0, at(pi).spend.in_use.load(std::memory_order_acquire));
      const std::string keys[] = {c.key};
      const std::string args[] = {at(pi).member,
                                  str(c.period_ms),
                                  "-1",
                                  "0",
                                  str(inuse),
                                  str(std::max(inuse, c.allowance)),
                                  str(c.limit),
                                  str(config_.slot_ttl.count()),
                                  str(c.calendar),
                                  str(c.offset_ms)};
      cmds.push_back(store::Command::evalsha(budget_script(), keys, args));
    } else {
      const std::string keys[] = {config_.key_prefix + "probe:" + replica_id_};
      const std::string args[] = {str(std::max<std::int64_t>(1000, config_.slot_ttl.count()))};
      cmds.push_back(store::Command::evalsha(probe_script(), keys, args));
    }
    ops.push_back(Op{Op::Kind::probe, 0});
  }
}

}  // namespace weir::admission
