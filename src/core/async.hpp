// Coroutines and deadlines on one worker thread: the concrete Asio types
// every module uses (the io_context's own executor type instead of the
// type-erased any_io_executor, whose copies show up in Beast profiles), a
// one-waiter wake-up (Event) and a cheap per-connection deadline (Watchdog).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <utility>

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

// A deadline for one connection's current I/O step, cheap to move.
//
// Setting a deadline is a store; the underlying timer is re-armed only when
// the deadline moves earlier than the armed expiry or when it fires before
// the (since moved) deadline (lazy re-arm). So "every I/O step has a
// timeout" costs no timer operation per read or write in steady state. When a
// deadline passes, the watchdog calls on_expired() once; the owner typically
// closes its socket there, which completes pending operations with an error.
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // `on_expired` runs on the io_context's thread; never after stop().
  Watchdog(Executor ex, std::function<void()> on_expired) : s_(std::make_shared<State>(ex, std::move(on_expired))) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() { stop(); }

  // Fires at `deadline` unless moved again before then.
  void expires_at(Clock::time_point deadline) {
    s_->deadline = deadline;
    if (!s_->armed || deadline < s_->armed_at) arm(s_, deadline);
  }
  void expires_after(Clock::duration d) { expires_at(Clock::now() + d); }
  // No deadline until the next expires_*().
  void disarm() { s_->deadline = Clock::time_point::max(); }
  // True once a deadline has passed (sticky until reset_expired()).
  bool expired() const { return s_->expired; }
  void reset_expired() { s_->expired = false; }
  // Never fires again; a pending timer wait completes harmlessly later.
  void stop() {
    s_->stopped = true;
    s_->deadline = Clock::time_point::max();
    if (s_->armed) s_->timer.cancel();
  }

 private:
  struct State {
    State(Executor ex, std::function<void()> f) : timer(ex), on_expired(std::move(f)) {}
    Timer timer;
    std::function<void()> on_expired;
    Clock::time_point deadline = Clock::time_point::max();
    Clock::time_point armed_at = Clock::time_point::max();
    unsigned generation = 0;
    bool armed = false;
    bool stopped = false;
    bool expired = false;
  };

  static void arm(const std::shared_ptr<State>& s, Clock::time_point at) {
    if (s->stopped) return;
    s->armed = true;
    s->armed_at = at;
    const unsigned gen = ++s->generation;
    s->timer.expires_at(at);  // cancels a pending wait: it completes as aborted and is ignored
    s->timer.async_wait([s, gen](const boost::system::error_code& ec) { on_timer(s, ec, gen); });
  }

  static void on_timer(const std::shared_ptr<State>& s, const boost::system::error_code& ec, unsigned gen) {
    if (gen != s->generation) return;  // superseded by a later arm()
    s->armed = false;
    if (ec || s->stopped || s->deadline == Clock::time_point::max()) return;
    if (Clock::now() < s->deadline) {
      arm(s, s->deadline);
      return;
    }
    s->expired = true;
    s->deadline = Clock::time_point::max();
    s->on_expired();
  }

  std::shared_ptr<State> s_;
};

}  // namespace weir::core
