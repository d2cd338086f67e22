// RedisLimiter's succession of scopes (redis_limiter.hpp): what a reload or a key's new record carries from
// a scope to the one that replaces it (carry, carry_spend: the fallback's state, a period's spend, an
// outage's allowance, stream slots), a retired scope's budget folded into its successor's once drained
// (fold_retired, spend_home), and when a free scope may be reused (drained). Split from redis_limiter.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "admission/redis_limiter.hpp"
#include "admission/redis_limiter_state.hpp"

namespace weir::admission {

void RedisLimiter::carry(std::uint32_t from, std::uint32_t to, Instant now) {
  // The shared state is found by the scope's name, which both scopes share
  // (a tenant or key whose limits or budget changed): its buckets, stream
  // slots and spend go on in Redis as they are. The fallback's local state
  // is carried, and the spend when the budget's period changed; during an
  // outage, the budget's allowance too.
  if (from < scope_count_ && to < scope_count_) ledger().pin(from, to);  // (its tickets follow the links to `to`)
  fallback_->carry(from, to, now);
  carry_period_spend(from, to);
  carry_allowance(from, to);
  supersede_slots(from, to);
}

void RedisLimiter::carry_spend(std::uint32_t from, std::uint32_t to, Instant now) {
  if (from < scope_count_ && to < scope_count_) ledger().pin(from, to);
  fallback_->carry_spend(from, to, now);
  carry_period_spend(from, to);
  carry_allowance(from, to);
  supersede_slots(from, to);
}

void RedisLimiter::carry_allowance(std::uint32_t from, std::uint32_t to) {
  // With Redis up the new scope asks Redis for its own allowance (its first
  // reservation waits for that sync) and the old one gives its back. During
  // an outage nobody can ask: the old scope's unreserved allowance (what
  // Redis granted it, plus the outage's share of the spare) moves to the new
  // one, so a reload neither stops a budget nor hands it a fresh share; a
  // raised limit adds fail_open_share of the raise (budget nobody held).
  // Only within the same period (the same hash in Redis); at most the new
  // limit minus the spend known (settled and reserved): a lowered limit
  // shrinks it.
  if (!degraded_.load(std::memory_order_relaxed)) return;
  move_allowance(from, to);
}

void RedisLimiter::move_allowance(std::uint32_t from, std::uint32_t to) {
  if (from >= scope_count_ || to >= scope_count_ || from == to) return;
  SpendCtl& a = at(from).spend_ctl;
  SpendCtl& b = at(to).spend_ctl;
  // (The same budget: its name too, as a successor reused since for another budget is not: reset_scope.)
  if (!a.enabled || !b.enabled || a.key != b.key || a.period_ms != b.period_ms || a.calendar != b.calendar ||
      a.offset_ms != b.offset_ms)
    return;
  Spend& old = at(from).spend;
  Spend& sp = at(to).spend;
  // Nothing to carry from a budget Redis never answered for (it fails closed): the new one does too.
  if (old.period_idx.load(std::memory_order_acquire) < 0) return;
  // The old scope's requests still in flight settle there (their reservations are not in `free`).
  std::int64_t t = old.free.load(std::memory_order_acquire);
  while (t > 0 && !old.free.compare_exchange_weak(t, 0, std::memory_order_acq_rel, std::memory_order_acquire)) {
  }
  t = std::max<std::int64_t>(t, 0);
  // A raised limit is budget nobody held at the last reply: its fail_open share, as enter_degraded() gives.
  if (config_.fail_open && b.limit > a.limit)
    t += static_cast<std::int64_t>(std::floor(static_cast<double>(b.limit - a.limit) * config_.fail_open_share));
  const std::int64_t known = old.others.load(std::memory_order_acquire) + old.mine.load(std::memory_order_acquire) +
                             std::max<std::int64_t>(old.in_use.load(std::memory_order_acquire), 0);
  const std::int64_t room = std::max<std::int64_t>(0, b.limit - known);
  if (t > room) {
    old.free.fetch_add(t - room, std::memory_order_acq_rel);
    t = room;
  }
  a.allowance -= t;
  b.allowance += t;
  // What the old scope knew of the period: the others' spend (its own is the others' for the new member)
  // and the period's window. A known period is what makes the new scope's budget decidable (reserve_spend).
  sp.others.store(old.others.load(std::memory_order_acquire) + old.mine.load(std::memory_order_acquire),
                  std::memory_order_release);
  sp.period_end_ns.store(old.period_end_ns.load(std::memory_order_relaxed), std::memory_order_relaxed);
  sp.spare.store(0, std::memory_order_relaxed);
  sp.free.fetch_add(t, std::memory_order_acq_rel);
  sp.period_idx.store(old.period_idx.load(std::memory_order_relaxed), std::memory_order_release);
}

std::string RedisLimiter::period_hash(const SpendCtl& c, std::int64_t idx) {
  const char* tag = c.calendar == 1 ? "d" : c.calendar == 2 ? "w" : c.calendar == 3 ? "m" : "";
  return fmt::format("{}:{}{}", c.key, tag, idx);
}

bool RedisLimiter::holds_hash(const std::string& set, const std::string& hash) {
  for (std::size_t i = 0; i < set.size();) {
    const std::size_t end = set.find('\n', i);
    if (end == std::string::npos) break;
    if (set.compare(i, end - i, hash) == 0) return true;
    i = end + 1;
  }
  return false;
}

std::string RedisLimiter::with_hash(const std::string& set, const std::string& hash) {
  if (holds_hash(set, hash)) return set;
  std::vector<std::string> all{hash};
  for (std::size_t i = 0; i < set.size();) {
    const std::size_t end = set.find('\n', i);
    if (end == std::string::npos) break;
    all.push_back(set.substr(i, end - i));
    i = end + 1;
  }
  std::sort(all.begin(), all.end());
  std::string out;
  for (const auto& h : all) out.append(h).push_back('\n');
  return out;
}

void RedisLimiter::supersede_slots(std::uint32_t from, std::uint32_t to) {
  // The old scope's spare stream slots go back at once: at the sync the new
  // scope's first request waits for (its slots counted as the others').
  if (from >= scope_count_ || to >= scope_count_ || from == to || at(from).max_streams == 0) return;
  at(from).slots.superseded.store(true, std::memory_order_relaxed);
  at(from).superseded_by = to;
  at(to).slots.took_over.store(from, std::memory_order_release);
  if (loop_->running) wake();
}

void RedisLimiter::carry_period_spend(std::uint32_t from, std::uint32_t to) {
  if (from >= scope_count_ || to >= scope_count_ || from == to) return;
  const SpendCtl& a = at(from).spend_ctl;
  const SpendCtl& b = at(to).spend_ctl;
  if (!a.enabled || !b.enabled) return;
  // The same period: the same hash in Redis, whose total both scopes count.
  // The new scope remembers the old one: this replica's share of that hash
  // is under both members now.
  if (a.period_ms == b.period_ms && a.calendar == b.calendar && a.offset_ms == b.offset_ms) {
    at(to).continues.store(from, std::memory_order_release);
    at(from).successor = to;  // it folds into `to` once drained (fold_retired)
    return;
  }
  // Another period counts in another hash: this replica's settled spend of
  // the old period starts the new one (each replica carries its own share,
  // so the total carries once), and so do its reservations in flight, whose
  // tickets settle into the old scope's hash: their worst case is carried
  // (an overcount of reserved − actual, never an overspend). As unpushed
  // spend it takes room in the new scope's allowance until its first push
  // (sync_once). Its share is that of every scope `from` continues in the
  // same period (a key whose limits changed, then its period): each pushed
  // under its own member.
  // Each part is kept with the hashes that count it: the scopes' own spend with their period's hash,
  // what they carried in with the hashes it came with plus theirs (their pushes put it there); a later
  // carry back into one of those hashes does not push that part there again (day -> month -> day counted
  // the day's spend twice, a flip more each time).
  std::int64_t mine = 0;
  std::vector<std::pair<std::string, std::int64_t>> parts;
  const auto add = [&parts](std::string hash, std::int64_t v) {
    if (v <= 0) return;
    for (auto& [h, n] : parts)
      if (h == hash) {
        n += v;
        return;
      }
    parts.emplace_back(std::move(hash), v);
  };
  std::uint32_t s = from;
  for (int steps = 0; s < scope_count_ && steps < 64; ++steps) {
    const SpendCtl& cs = at(s).spend_ctl;
    const std::int64_t m = at(s).spend.mine.load(std::memory_order_acquire) +
                           std::max<std::int64_t>(at(s).spend.in_use.load(std::memory_order_acquire), 0);
    mine += m;
    // (A scope Redis never answered for has pushed nothing yet: its hash is not known.)
    const std::string own = cs.idx >= 0 ? period_hash(cs, cs.idx) : std::string();
    std::int64_t carried = 0;
    for (const auto& [set, n] : cs.carried) {
      add(own.empty() ? set : with_hash(set, own), std::min(n, m - carried));
      carried += n;
    }
    // Its own (in flight too: those tickets settle there).
    add(own.empty() ? std::string() : with_hash(std::string(), own), m - carried);
    // (A reused scope may continue one of a higher number: the links end at kNoScope, and a scope is
    // reused only once no live one continues it, so they form no cycle; 64 steps at most all the same.)
    const std::uint32_t prev = at(s).continues.load(std::memory_order_acquire);
    if (prev == s) break;
    s = prev;
  }
  if (mine <= 0) return;
  // Bounded: the oldest parts beyond kCarriedMax count as of no known hash (pushed: an overcount, never an overspend).
  while (parts.size() > SpendCtl::kCarriedMax) {
    const std::int64_t n = parts.front().second;
    parts.erase(parts.begin());
    add(std::string(), n);
  }
  merge_carried(at(to).spend_ctl.carried, std::move(parts));
  Spend& sp = at(to).spend;
  sp.mine.fetch_add(mine, std::memory_order_acq_rel);
  sp.free.fetch_sub(mine, std::memory_order_acq_rel);
  sp.touched.store(true, std::memory_order_relaxed);
}

void RedisLimiter::merge_carried(std::vector<std::pair<std::string, std::int64_t>>& into,
                                 std::vector<std::pair<std::string, std::int64_t>> parts) {
  for (auto& [h, n] : parts) {
    bool merged = false;
    for (auto& [h2, n2] : into)
      if (h2 == h) {
        n2 += n;
        merged = true;
      }
    if (!merged) into.emplace_back(std::move(h), n);
  }
  std::int64_t unknown = 0;
  while (into.size() > SpendCtl::kCarriedMax) {
    unknown += into.front().second;
    into.erase(into.begin());
  }
  if (unknown > 0) merge_carried(into, {{std::string(), unknown}});
}

std::uint32_t RedisLimiter::spend_home(std::uint32_t scope) const noexcept {
  for (int steps = 0; steps < 64; ++steps) {
    const std::uint32_t f = at(scope).folded_into.load(std::memory_order_acquire);
    if (f == ScopeState::kNoScope || f >= scope_count_) break;
    scope = f;
  }
  return scope;
}

bool RedisLimiter::fold_retired(std::uint32_t p) {
  ScopeState& ps = at(p);
  if (ps.folded_into.load(std::memory_order_relaxed) != ScopeState::kNoScope) return true;
  if (ps.successor == ScopeState::kNoScope || ps.successor >= scope_count_) return false;
  const std::uint32_t t = spend_home(ps.successor);
  if (t == p) return false;
  ScopeState& ts = at(t);
  SpendCtl& pc = ps.spend_ctl;
  SpendCtl& tc = ts.spend_ctl;
  // A successor reused since for another budget (reset_scope: another name, or another period's hash)
  // continues nothing of this one: it pushes its own member until drained, as a scope without one does.
  if (!tc.enabled || pc.key != tc.key || pc.period_ms != tc.period_ms || pc.calendar != tc.calendar ||
      pc.offset_ms != tc.offset_ms) {
    ps.successor = ScopeState::kNoScope;
    return false;
  }
  // The same hash in Redis (the same period, known to the successor; the retired scope's last push went
  // to it, or it never pushed), nothing in flight here (its reservations are covered by its allowance in
  // Redis until they settle), and room in the successor's list of folds to send.
  if (!pc.enabled || !tc.enabled || pc.period_ms != tc.period_ms || pc.calendar != tc.calendar ||
      pc.offset_ms != tc.offset_ms || tc.idx < 0 || (pc.idx >= 0 && pc.idx != tc.idx) ||
      tc.folds.size() + pc.folds.size() >= SpendCtl::kFoldsMax)
    return false;
  Spend& psp = ps.spend;
  Spend& tsp = ts.spend;
  if (psp.in_use.load(std::memory_order_seq_cst) > 0) return false;
  // From here a ticket of `p` reserves and settles at `t` (spend_home). One that reserved here after the
  // check above still settles here first (settle_spend), its cost charged to `t`.
  ps.folded_into.store(t, std::memory_order_seq_cst);
  const std::int64_t d = psp.mine.exchange(0, std::memory_order_acq_rel);
  const std::int64_t pushed = pc.idx >= 0 ? pc.pushed : 0;
  // `p` holds nothing now: free = allowance - in use - (mine - pushed) becomes -in use.
  psp.free.fetch_add(-pc.allowance + (d - pushed), std::memory_order_acq_rel);
  psp.others.store(0, std::memory_order_relaxed);
  // What the period's hash counts already of the spend `p` carried in (its skip, known at its first reply).
  std::int64_t skip = pc.skip;
  if (pc.idx < 0) {
    const std::string hash = period_hash(tc, tc.idx);
    for (const auto& [set, n] : pc.carried)
      if (holds_hash(set, hash)) skip += n;
  }
  tc.skip += skip;
  merge_carried(tc.carried, std::move(pc.carried));
  pc.carried.clear();
  pc.skip = 0;
  pc.allowance = 0;
  pc.pushed = 0;
  tc.pushed += pushed;  // Redis's s: of `t` holds it too once the fold is done (budget.lua)
  tsp.mine.fetch_add(d, std::memory_order_acq_rel);
  tsp.free.fetch_sub(d - pushed, std::memory_order_acq_rel);  // unpushed here now
  // The successor's `others` (total - its s: - its skip at its last reply) counted what `p` pushed, which
  // is its own now (until its next reply says so).
  std::int64_t o = tsp.others.load(std::memory_order_acquire);
  while (!tsp.others.compare_exchange_weak(o, std::max<std::int64_t>(o - pushed, 0), std::memory_order_acq_rel)) {
  }
  tsp.touched.store(true, std::memory_order_relaxed);
  // Its member's fields in Redis (and those of the scopes folded into it, not yet merged) merge at the
  // successor's next push: a member that never answered wrote none.
  for (auto& m : pc.folds) tc.folds.push_back(std::move(m));
  pc.folds.clear();
  if (pc.idx >= 0) tc.folds.push_back(ps.member);
  // `p` leaves the successor's chain (carry_period_spend walks it): its spend is the successor's now.
  if (ts.continues.load(std::memory_order_relaxed) == p)
    ts.continues.store(ps.continues.load(std::memory_order_relaxed), std::memory_order_release);
  woken_.push_back(t);
  return true;
}

bool RedisLimiter::drained(std::uint32_t i) const noexcept {
  // Free (no policy, ticket or carry holds it: Limiter::adopt asks only of those); what is left is what
  // this replica holds of Redis under its member, and what the sync loop still does for it. During an
  // outage nothing goes back: nothing is reused then.
  if (i >= scope_count_ || degraded_.load(std::memory_order_relaxed) || stopping_.load(std::memory_order_relaxed))
    return false;
  const ScopeState& st = at(i);
  constexpr auto rx = std::memory_order_relaxed;
  if (syncing_ && st.sent == walk_no_) return false;  // a reply on its way applies to it
  for (int b = 0; b < 2; ++b)
    if (st.spec[b].enabled && st.lease[b].units.load(rx) != 0) return false;  // units held, or debt to push
  if (st.max_streams > 0 && (st.slots.allowance.load(rx) != 0 || st.slots.free.load(rx) != 0 ||
                             st.slots_ctl.recorded != 0 || st.slots_ctl.told_demand != 0))
    return false;  // slots Redis counts as this replica's
  const SpendCtl& c = st.spend_ctl;
  if (c.enabled && st.folded_into.load(rx) == ScopeState::kNoScope) {
    if (st.successor != ScopeState::kNoScope) return false;  // it folds into its successor first
    const Spend& sp = st.spend;
    const std::int64_t mine = sp.mine.load(rx);
    if (sp.in_use.load(rx) != 0 || c.allowance != 0 || !c.folds.empty() || (c.idx >= 0 ? mine != c.pushed : mine != 0))
      return false;  // an allowance to give back, spend or folds to push
  }
  return true;
}

}  // namespace weir::admission
