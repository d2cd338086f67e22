// core::Watchdog and core::WatchdogSet (core/async.hpp): per-connection
// deadlines kept in one min-heap per io_context under one timer.
#include "core/async.hpp"

namespace weir::core {

asio::execution_context::id WatchdogSet::id;

Watchdog::Watchdog(Executor ex, std::function<void()> on_expired)
    : set_(&asio::use_service<WatchdogSet>(ex.context())), on_expired_(std::move(on_expired)) {}

void Watchdog::schedule(Clock::time_point at) {
  if (!stopped_) set_->schedule(*this, at);
}

void Watchdog::unschedule() { set_->remove(*this); }

WatchdogSet::WatchdogSet(asio::execution_context& ctx)
    : asio::execution_context::service(ctx), timer_(static_cast<asio::io_context&>(ctx).get_executor()) {}

void WatchdogSet::shutdown() {
  // The context's pending handlers are destroyed after this (coroutine
  // frames with them, and the watchdogs in them): those find themselves out
  // of the heap, and nothing arms the timer again.
  down_ = true;
  for (Watchdog* w : heap_) w->slot_ = Watchdog::kNoSlot;
  heap_.clear();
}

void WatchdogSet::schedule(Watchdog& w, Clock::time_point at) {
  if (down_) return;
  if (w.slot_ == Watchdog::kNoSlot) {
    w.key_ = at;
    heap_.push_back(&w);
    w.slot_ = static_cast<std::uint32_t>(heap_.size() - 1);
    sift_up(w.slot_);
  } else if (at < w.key_) {
    w.key_ = at;
    sift_up(w.slot_);
  }
  if (w.slot_ == 0) rearm();
}

void WatchdogSet::remove(Watchdog& w) {
  const std::uint32_t i = w.slot_;
  w.slot_ = Watchdog::kNoSlot;
  Watchdog* last = heap_.back();
  heap_.pop_back();
  if (last == &w) return;
  place(i, last);
  sift_up(i);
  sift_down(last->slot_);
  // The timer may now wake for nothing (its earliest left): fire() looks and re-arms.
}

void WatchdogSet::sift_up(std::uint32_t i) {
  Watchdog* w = heap_[i];
  while (i > 0) {
    const std::uint32_t parent = (i - 1) / 2;
    if (!(w->key_ < heap_[parent]->key_)) break;
    place(i, heap_[parent]);
    i = parent;
  }
  place(i, w);
}

void WatchdogSet::sift_down(std::uint32_t i) {
  Watchdog* w = heap_[i];
  const auto n = static_cast<std::uint32_t>(heap_.size());
  for (;;) {
    std::uint32_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && heap_[child + 1]->key_ < heap_[child]->key_) ++child;
    if (!(heap_[child]->key_ < w->key_)) break;
    place(i, heap_[child]);
    i = child;
  }
  place(i, w);
}

void WatchdogSet::rearm() {
  if (heap_.empty() || down_) return;
  const Clock::time_point at = heap_.front()->key_;
  if (waiting_ && !(at < armed_at_)) return;
  waiting_ = true;
  armed_at_ = at;
  const unsigned gen = ++generation_;
  timer_.expires_at(at);  // cancels the wait before it, which completes as aborted and is ignored
  timer_.async_wait([this, gen](const boost::system::error_code&) {
    if (gen == generation_) fire();
  });
}

void WatchdogSet::fire() {
  waiting_ = false;
  armed_at_ = Clock::time_point::max();
  const Clock::time_point now = Clock::now();
  while (!heap_.empty() && !(now < heap_.front()->key_)) {
    Watchdog& w = *heap_.front();
    remove(w);
    if (w.stopped_ || w.deadline_ == Clock::time_point::max()) continue;  // disarmed since
    if (now < w.deadline_) {
      schedule(w, w.deadline_);  // moved later since: looked at again then
      continue;
    }
    w.expired_ = true;
    w.deadline_ = Clock::time_point::max();
    // Last use of `w` here: the owner may re-arm it, or destroy it, and
    // any other watchdog; the loop reads the heap afresh.
    w.on_expired_();
  }
  rearm();
}

}  // namespace weir::core
