// RedisLimiter's outages and exit: entering and leaving the degraded state
// (fail_open's local limits, or 503), the keys reset for holding data Weir
// cannot use, and what an exiting replica could not push.
#include <fmt/format.h>

#include "admission/redis_limiter.hpp"
#include "admission/redis_limiter_state.hpp"

namespace weir::admission {

void RedisLimiter::report_unpushed() {
  // Lines that are never rate limited: money and limits nobody else will count.
  const bool maybe = loop_->final_maybe_sent;
  const std::string why = loop_->final_error.empty() ? std::string("not sent") : loop_->final_error;
  for (std::uint32_t i = 0; i < scope_count_; ++i) {
    const SpendCtl& c = at(i).spend_ctl;
    if (c.enabled) {
      const std::int64_t left = at(i).spend.mine.load(std::memory_order_acquire) - (c.idx >= 0 ? c.pushed : 0);
      if (left > 0 && c.idx < 0)
        log_state(
            fmt::format("exiting with spend Redis does not count: ${:.9f} ({} nano-USD) settled here for {} "
                        "was not pushed (Redis never answered this replica); the shared budget can admit "
                        "that much again",
                        static_cast<double>(left) / 1e9, left, c.key));
      else if (left > 0)
        log_state(fmt::format(
            "exiting with spend Redis does not count: ${:.9f} ({} nano-USD) settled here for {} "
            "{} ({}); {}the shared budget can admit that much again",
            static_cast<double>(left) / 1e9, left, c.key, maybe ? "may not have reached Redis" : "was not pushed", why,
            maybe ? "unless Redis still runs the push it was sent, " : ""));
    }
    for (int b = 0; b < 2; ++b) {
      if (!at(i).spec[b].enabled) continue;
      const std::int64_t u = at(i).lease[b].units.load(std::memory_order_acquire);
      if (u < 0)
        log_state(fmt::format("exiting with debt Redis does not count: {} {} used above the estimate for {} {} ({})",
                              -u, b == 0 ? "requests" : "tokens", at(i).lease_ctl[b].key,
                              maybe ? "may not have reached Redis" : "were not pushed", why));
    }
  }
}

void RedisLimiter::note_reset(const std::string& what) {
  if (what.empty()) return;
  key_resets_.fetch_add(1, std::memory_order_relaxed);
  log(
      fmt::format("Redis key {}: reset (taken as missing; its scope's shared state starts again from "
                  "what the replicas push)",
                  what));
}

void RedisLimiter::enter_degraded(const std::string& why, bool answered) {
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
    // the outage bound). The next sync after the outage re-bases it. A
    // budget without a reply has no such spare (its `spare` is the whole
    // limit only for `pending`): a process (re)started during an outage, or
    // a budget new since, gets none, so restarts cannot mint budget.
    for (std::uint32_t i = 0; i < scope_count_; ++i) {
      SpendCtl& c = at(i).spend_ctl;
      if (!c.enabled) continue;
      const std::int64_t spare = at(i).spend.spare.exchange(0);
      if (c.idx < 0) continue;
      const auto extra = static_cast<std::int64_t>(std::floor(static_cast<double>(spare) * config_.fail_open_share));
      if (extra <= 0) continue;
      c.allowance += extra;
      at(i).spend.free.fetch_add(extra, std::memory_order_acq_rel);
    }
    // A reload made while Redis was already gone but before a sync said so (SIGSTOP, a cut link: the
    // outage is found at the next sync's command_timeout) gave a budget a successor scope Redis never
    // answered for, and the old one's allowance stayed where it was: carried now, as a reload during the
    // outage carries it (carry_allowance), so the budget does not fail closed (503) for want of a reply.
    for (std::uint32_t p = 0; p < scope_count_; ++p) {
      std::uint32_t cur = p;
      for (int steps = 0; steps < 64; ++steps) {
        const std::uint32_t next = at(cur).successor;
        if (next == ScopeState::kNoScope || next >= scope_count_) break;
        if (at(cur).spend.period_idx.load(std::memory_order_acquire) < 0 ||
            at(next).spend.period_idx.load(std::memory_order_acquire) >= 0)
          break;
        move_allowance(cur, next);
        cur = next;
      }
    }
  }
  degraded_.store(true, std::memory_order_release);
  if (!config_.fail_open) refusing_.store(true, std::memory_order_relaxed);
  // "unusable": Redis answers, with errors (OOM, READONLY, MISCONF, NOPERM...).
  const std::string addr = store::endpoint_text(config_.host, config_.port);
  const char* state = answered ? "unusable" : "unreachable";
  if (config_.fail_open)
    log_state(
        fmt::format("Redis {} {} ({}): fail_open is on, limiting per replica from local state "
                    "(each limit x {}) until it is back",
                    addr, state, why, config_.fail_open_share));
  else
    log_state(fmt::format("Redis {} {} ({}): fail_open is off, refusing requests with 503 until it is back", addr,
                          state, why));
}

void RedisLimiter::leave_degraded() {
  if (!degraded_.load(std::memory_order_relaxed)) return;
  refusing_.store(false, std::memory_order_relaxed);
  degraded_.store(false, std::memory_order_release);
  loop_->recovered = MonoClock::now();  // every budget's spend is pushed again (sync_once)
  const double secs = std::chrono::duration<double>(MonoClock::now() - loop_->outage_start).count();
  log_state(fmt::format("Redis {} reachable again after {:.1f} s: distributed limits resumed",
                        store::endpoint_text(config_.host, config_.port), secs));
}

}  // namespace weir::admission
