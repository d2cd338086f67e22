// One worker's admission queue for one pool (pools.X.queue,
// docs/reliability.md#overload): a gate (fewer than max_concurrent
// requests of this worker on the pool, and the pool not saturated) and,
// behind it, a bounded list of waiting requests ordered by priority (higher
// first) and, among equals, fairly between flows (tenants): start-time fair
// queuing, each waiter's tag one past its flow's last waiting one at its
// priority, or the queue's clock (the last admitted tag) when its flow has
// none waiting, so a tenant with 60 waiting and one with 1 alternate rather
// than the second waiting behind all 60; arrival order among equal tags.
// When the list is full the last in that order (of the waiting ones and the
// newcomer) is shed: the lowest priority, the newest request of the flow
// with the most waiting.
//
// Per worker, as every pool state is (shared-nothing): with N workers a
// pool sees up to N x max_concurrent requests and N x size waiting. The
// waiters are linked in place (their request contexts): no allocation, O(1)
// for the common case of one flow and equal priorities (O(waiting) worst
// case to insert).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/async.hpp"
#include "core/config.hpp"

namespace weir::routing {

// Why a request was shed (weir_requests_shed_total{reason}).
enum class ShedReason : std::uint8_t {
  queue_full,     // the gate was shut by queue.max_concurrent and the queue had no room for its priority
  saturated,      // the pool was saturated (its endpoints' waiting requests or KV cache) and the queue had no room
  queue_timeout,  // it waited queue.timeout in the queue
  count_,
};
std::string_view shed_reason_label(ShedReason r);

// A request waiting for its pool, linked in place (it lives in the
// request's context for as long as it waits).
struct QueueWaiter {
  enum class Verdict : std::uint8_t {
    none,      // not queued
    waiting,   // in the list
    admitted,  // let through: it now counts as active (PoolQueue::done() when it leaves the pool)
    shed,      // displaced by a higher-priority newcomer while the list was full
    joined,    // let out to join a micro-batch or coalesced generation that opened (release_joiners): not active
  };
  int priority = 0;  // higher goes first (0..100)
  // Its flow (the tenant's name; empty without auth): waiters of one priority are served in turn between flows.
  // Viewed, not owned: the request's principal keeps it alive while it waits.
  std::string_view flow;
  std::uint64_t tag = 0;  // its start tag (set by push): the order among waiters of one priority
  // A batchable request's compatibility key (batching::BatchMember::key),
  // and whether it would coalesce; empty: not batchable.
  std::string_view batch_key;
  bool coalesce = false;
  Verdict verdict = Verdict::none;
  // Admitted by a saturation gate with limited room: counts against the
  // pool's room until it resumes (WorkerPool::admitted_resumed).
  bool holds_room = false;
  core::Timer* timer = nullptr;  // its wait: cancelled to wake it when the verdict changes (null in tests)
  QueueWaiter* prev = nullptr;   // toward the head (higher priority / earlier)
  QueueWaiter* next = nullptr;
};

class PoolQueue {
 public:
  explicit PoolQueue(const core::QueueConfig& cfg) : cfg_(&cfg) {}

  // A new request may go on at once (and is then active) when nobody is
  // waiting, fewer than max_concurrent are active, and the pool is not
  // `saturated`. False: it should wait (push()) or be shed.
  bool try_enter(bool saturated) {
    if (head_ || saturated || !has_room()) return false;
    ++active_;
    return true;
  }
  // Queues `w` behind every waiter of a higher priority and, at its own,
  // behind those of a tag at most its own (its tag: one past its flow's last
  // waiter's at this priority, at least the queue's clock). When `size` are
  // waiting already, the last waiter (lowest priority, highest tag) is shed
  // for `w` when `w` would go before it, and returned (its verdict shed, its
  // timer cancelled); otherwise `w` is not queued (verdict stays none) and
  // false is returned. `displaced` is set to the shed waiter or null.
  bool push(QueueWaiter& w, QueueWaiter*& displaced);
  // Unlinks a waiter that gives up (its timeout or deadline passed, its client left).
  void leave(QueueWaiter& w);
  // Lets the first waiter through when the gate is open (highest priority,
  // lowest tag): its verdict becomes admitted (it is active), its timer is
  // cancelled, and its tag is the queue's clock.
  // Returns it, or null when nobody waits or the gate is shut.
  QueueWaiter* admit_next(bool saturated);
  // A micro-batch or coalesced generation with `key` opened (it holds its
  // own place): up to `max` waiters with that key are let out to join it
  // (verdict joined, timers cancelled), highest priority first. Returns how many.
  std::uint32_t release_joiners(std::string_view key, bool coalesce, std::uint32_t max);
  // An active request left the pool.
  void done() {
    if (active_ > 0) --active_;
  }

  std::uint32_t waiting() const { return waiting_; }
  std::uint32_t active() const { return active_; }
  const core::QueueConfig& config() const { return *cfg_; }

 private:
  bool has_room() const { return cfg_->max_concurrent == 0 || active_ < cfg_->max_concurrent; }
  void unlink(QueueWaiter& w);
  static void wake(QueueWaiter& w, QueueWaiter::Verdict v);

  const core::QueueConfig* cfg_;
  QueueWaiter* head_ = nullptr;
  QueueWaiter* tail_ = nullptr;
  std::uint32_t waiting_ = 0;
  std::uint32_t active_ = 0;
  std::uint64_t clock_ = 0;  // the fair-queuing clock: the highest tag admitted so far
};

}  // namespace weir::routing
