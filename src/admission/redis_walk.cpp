// RedisLimiter's walk of its scopes: which a sync visits (every scope on a
// full walk, about once a second; else the busy, the woken and the new ones),
// and when a scope is quiet enough to be left out (docs/admission.md).
#include <algorithm>

#include "admission/redis_limiter.hpp"
#include "admission/redis_limiter_state.hpp"

namespace weir::admission {

std::chrono::milliseconds RedisLimiter::full_walk_every() const noexcept {
  // Often enough that a quiet budget's spend is re-seeded every slot_ttl / 3 (twice over), and a want a
  // refused request left without a refill is seen within a second.
  return std::max(config_.sync_interval,
                  std::min<std::chrono::milliseconds>(std::chrono::seconds(1), config_.slot_ttl / 6));
}

void RedisLimiter::plan_walk(bool full, Instant now) {
  ++walk_no_;
  visit_.clear();
  const auto add = [this](std::uint32_t s) {
    if (s >= scope_count_ || at(s).visited == walk_no_) return;
    at(s).visited = walk_no_;
    visit_.push_back(s);
  };
  if (full) {
    for (std::uint32_t s = 0; s < scope_count_; ++s) add(s);
    next_full_walk_ = now + full_walk_every();
  } else {
    for (const std::uint32_t s : busy_) add(s);
    for (const std::uint32_t s : woken_) add(s);
    for (auto s = static_cast<std::uint32_t>(walked_); s < scope_count_; ++s) add(s);
  }
  woken_.clear();
  walked_ = scope_count_;
  walks_.fetch_add(1, std::memory_order_relaxed);
  scopes_walked_.fetch_add(visit_.size(), std::memory_order_relaxed);
}

bool RedisLimiter::quiet(std::uint32_t i, Instant now) const noexcept {
  const ScopeState& st = at(i);
  const auto idle = [&](Instant last_used) { return now - last_used >= config_.lease_idle; };
  constexpr auto rx = std::memory_order_relaxed;
  for (int b = 0; b < 2; ++b) {
    if (!st.spec[b].enabled) continue;
    const Lease& l = st.lease[b];
    const LeaseCtl& c = st.lease_ctl[b];
    if (l.units.load(rx) != 0 || c.seen != 0 || l.wanted.load(rx) || c.waiting > 0 || !idle(c.last_used) ||
        now < c.keep_until)
      return false;
  }
  if (st.max_streams > 0) {
    const Slots& s = st.slots;
    const SlotsCtl& c = st.slots_ctl;
    if (s.allowance.load(rx) != 0 || s.free.load(rx) != 0 || s.wanted.load(rx) || s.superseded.load(rx) ||
        c.waiting > 0 || c.told_want != 0 || c.told_demand != 0 || c.recorded != 0 || !idle(c.last_used) ||
        now < c.keep_until)
      return false;
  }
  if (st.spend_ctl.enabled && st.folded_into.load(rx) == ScopeState::kNoScope) {
    const Spend& sp = st.spend;
    const SpendCtl& c = st.spend_ctl;
    if (c.idx < 0 || c.allowance != 0 || sp.in_use.load(rx) > 0 || sp.wanted.load(rx) || sp.touched.load(rx) ||
        sp.mine.load(rx) != c.pushed || c.waiting > 0 || !c.folds.empty() || !idle(c.last_used) ||
        now >= c.period_end || now < c.keep_until)
      return false;
  }
  return true;
}

}  // namespace weir::admission
