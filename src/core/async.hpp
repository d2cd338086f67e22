// Coroutines and deadlines on one worker thread: the concrete Asio types
// every module uses (the io_context's own executor type instead of the
// type-erased any_io_executor, whose copies show up in Beast profiles), a
// one-waiter wake-up (Event) and a cheap per-connection deadline (Watchdog,
// WatchdogSet).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace weir::core {

namespace asio = boost::asio;

using Executor = asio::io_context::executor_type;
template <class T = void>
using Task = asio::awaitable<T, Executor>;
using Timer =
    asio::basic_waitable_timer<std::chrono::steady_clock, asio::wait_traits<std::chrono::steady_clock>, Executor>;

// Completion token: `auto [ec, n] = co_await sock.async_read_some(buf, use_task);`
// Errors come back as values; nothing on the request path throws. A
// deferred operation, awaited at once: the coroutine's own frame holds the
// operation and its result while it waits (use_awaitable would start it
// from a coroutine of its own, a frame of ~220 bytes made and freed per
// wait, and held for as long as the wait lasts: memory per open stream).
inline constexpr auto use_task = asio::as_tuple(asio::deferred);

// A one-waiter wake-up for coroutines on one thread: notify() from a
// completion handler, co_await wait() in the coroutine. A notify() before
// wait() is remembered, so no wake-up is lost.
class Event {
 public:
  explicit Event(Executor ex) : timer_(ex) {}

  void notify() {
    signalled_ = true;
    timer_.cancel();
  }

  // Returns once notify() has been called since the last wait() returned.
  Task<void> wait() {
    while (!signalled_) {
      timer_.expires_at(std::chrono::steady_clock::time_point::max());
      co_await timer_.async_wait(use_task);
    }
    signalled_ = false;
  }

 private:
  Timer timer_;
  bool signalled_ = false;
};

// A one-waiter wake-up resumed in place: wake() runs the parked coroutine
// inside the call, up to its next suspension, instead of queueing its
// resumption through the scheduler as Event does (Asio 1.26 polls epoll once
// per queued completion: an epoll_wait(0) per wake-up). For a completion
// handler whose last act is the wake-up: the woken coroutine may destroy
// whatever the caller was working on, so wake() must be the caller's last
// use of it. A wake() while none is parked is remembered (take_wake()).
//
// The parked coroutine is owned by this object while it waits: destroy a
// Waiter only after its coroutine was woken (an io_context destroyed with a
// coroutine parked here leaks its frame).
class Waiter {
 public:
  void wake() {
    if (!parked_) {
      woken_ = true;
      return;
    }
    asio::any_completion_handler<void()> h;
    h.swap(parked_);
    std::move(h)();
  }

  // True when a wake() came while no coroutine was parked (since the last
  // take_wake()); consumes it. A wake() that resumed a parked coroutine is
  // not kept.
  bool take_wake() { return std::exchange(woken_, false); }

  // Completes at the next wake(). Awaited only when take_wake() is false:
  //   while (busy) if (!w.take_wake()) co_await w.park();
  // (a wake() that came before park() is not seen by it). A deferred
  // operation, never completed inside the call that starts it: the awaiting
  // frame holds it, and no coroutine frame is made for the wait.
  auto park() {
    return asio::async_initiate<decltype(asio::deferred), void()>(
        [this](auto h) {
          // swap, not move assignment: Boost 1.81's any_completion_handler
          // move-assigns through its converting constructor (it wraps itself).
          asio::any_completion_handler<void()> parked(std::move(h));
          parked_.swap(parked);
        },
        asio::deferred);
  }

 private:
  asio::any_completion_handler<void()> parked_;
  bool woken_ = false;
};

class WatchdogSet;

// A deadline for one connection's current I/O step.
//
// Setting a deadline is a store; the worker's one timer (WatchdogSet, one per
// io_context) is re-armed only when a deadline moves earlier than the
// earliest it waits for, and a deadline that moved later is looked at again
// when its old time comes (lazy re-arm). So "every I/O step has a timeout"
// costs no timer operation per read or write in steady state, and an open
// connection holds no timer, no heap state and no pending timer wait of its
// own (memory per open stream). When a deadline passes, the watchdog calls
// on_expired() once; the owner typically closes its socket there, which
// completes pending operations with an error.
//
// Not movable: the set holds its address while a deadline is pending. Made,
// used and destroyed on the thread that runs its io_context (one thread per
// io_context, as every worker's).
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // `on_expired` runs on the io_context's thread, from the set's timer
  // handler (never inside expires_*()); never after stop() or destruction.
  Watchdog(Executor ex, std::function<void()> on_expired);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() { stop(); }

  // Fires at `deadline` unless moved again before then.
  void expires_at(Clock::time_point deadline) {
    deadline_ = deadline;
    if (slot_ == kNoSlot || deadline < key_) schedule(deadline);
  }
  void expires_after(Clock::duration d) { expires_at(Clock::now() + d); }
  // No deadline until the next expires_*() (the set drops it lazily).
  void disarm() { deadline_ = Clock::time_point::max(); }
  // True once a deadline has passed (sticky until reset_expired()).
  bool expired() const { return expired_; }
  void reset_expired() { expired_ = false; }
  // Never fires again.
  void stop() {
    stopped_ = true;
    deadline_ = Clock::time_point::max();
    if (slot_ != kNoSlot) unschedule();
  }

 private:
  friend class WatchdogSet;
  static constexpr std::uint32_t kNoSlot = 0xffffffffu;
  void schedule(Clock::time_point at);
  void unschedule();

  WatchdogSet* set_;
  std::function<void()> on_expired_;
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point key_ = Clock::time_point::max();  // when the set looks at it next (while slot_ != kNoSlot)
  std::uint32_t slot_ = kNoSlot;                      // its index in the set's heap
  bool stopped_ = false;
  bool expired_ = false;
};

// The watchdogs of one io_context: a binary min-heap of their next times and
// one timer armed at the earliest (an io_context service, made with the
// context's first Watchdog). The heap holds each armed watchdog once:
// O(log n) to add one, move one earlier or drop one; moving one later is a
// store (Watchdog::expires_at).
class WatchdogSet : public asio::execution_context::service {
 public:
  using Clock = std::chrono::steady_clock;
  static asio::execution_context::id id;
  explicit WatchdogSet(asio::execution_context& ctx);

  // Watchdogs waiting for their time (for tests).
  std::size_t size() const { return heap_.size(); }

 private:
  friend class Watchdog;
  void shutdown() override;
  void schedule(Watchdog& w, Clock::time_point at);
  void remove(Watchdog& w);
  void place(std::uint32_t i, Watchdog* w) {
    heap_[i] = w;
    w->slot_ = i;
  }
  void sift_up(std::uint32_t i);
  void sift_down(std::uint32_t i);
  void rearm();
  void fire();

  std::vector<Watchdog*> heap_;
  Timer timer_;
  Clock::time_point armed_at_ = Clock::time_point::max();  // the timer's expiry while waiting_
  unsigned generation_ = 0;                                // the current wait's; older ones are ignored
  bool waiting_ = false;
  bool down_ = false;  // the io_context is shutting down: nothing is scheduled any more
};

}  // namespace weir::core
