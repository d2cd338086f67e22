// core::Watchdog (a lazily re-armed per-connection deadline) and
// core::Event (a one-waiter wake-up) on an io_context run in the test
// thread. Times are only ever checked as lower bounds (a deadline never
// fires early; the steady clock cannot run backwards) or as generous upper
// bounds, never as exact durations.
#include "core/async.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

namespace weir::core {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kLimit = 10s;  // only a broken watchdog waits this long

// Runs `io` until `done()` or kLimit.
template <class Pred>
bool run_until(asio::io_context& io, Pred done) {
  const auto deadline = Clock::now() + kLimit;
  while (!done() && Clock::now() < deadline) {
    io.restart();
    if (io.run_for(2ms) == 0 && io.stopped()) std::this_thread::sleep_for(200us);
  }
  return done();
}

// Runs `io` for at least `d` (a window in which nothing must happen).
void run_for_at_least(asio::io_context& io, Clock::duration d) {
  Timer t(io.get_executor());
  t.expires_after(d);
  bool fired = false;
  t.async_wait([&](auto) { fired = true; });
  run_until(io, [&] { return fired; });
}

struct Fires {
  std::vector<Clock::time_point> at;
  std::function<void()> fn() {
    return [this] { at.push_back(Clock::now()); };
  }
};

TEST(CoreWatchdog, FiresOnceAfterTheDeadline) {
  asio::io_context io;
  Fires f;
  Watchdog w(io.get_executor(), f.fn());
  const auto deadline = Clock::now() + 30ms;
  w.expires_at(deadline);
  EXPECT_FALSE(w.expired());
  ASSERT_TRUE(run_until(io, [&] { return !f.at.empty(); }));
  EXPECT_GE(f.at[0], deadline);
  EXPECT_TRUE(w.expired());
  run_for_at_least(io, 100ms);
  EXPECT_EQ(f.at.size(), 1u);
}

TEST(CoreWatchdog, MovingTheDeadlineLaterDoesNotFireEarly) {
  asio::io_context io;
  Fires f;
  Watchdog w(io.get_executor(), f.fn());
  w.expires_after(20ms);
  // Pushed back several times before it passes, as every I/O step does.
  Clock::time_point last{};
  for (int i = 1; i <= 5; ++i) {
    last = Clock::now() + 20ms + i * 30ms;
    w.expires_at(last);
  }
  ASSERT_TRUE(run_until(io, [&] { return !f.at.empty(); }));
  EXPECT_GE(f.at[0], last);
  run_for_at_least(io, 100ms);
  EXPECT_EQ(f.at.size(), 1u);
}

TEST(CoreWatchdog, MovingTheDeadlineLaterWhileTheTimerRunsDoesNotFireEarly) {
  asio::io_context io;
  Fires f;
  Watchdog w(io.get_executor(), f.fn());
  w.expires_after(30ms);
  // Keep pushing the deadline forward from inside the loop, past the first expiry.
  const auto stop_pushing = Clock::now() + 200ms;
  Clock::time_point last{};
  Timer tick(io.get_executor());
  std::function<void()> push = [&] {
    if (Clock::now() >= stop_pushing) return;
    last = Clock::now() + 30ms;
    w.expires_at(last);
    tick.expires_after(5ms);
    tick.async_wait([&](auto) { push(); });
  };
  push();
  ASSERT_TRUE(run_until(io, [&] { return !f.at.empty(); }));
  EXPECT_GE(f.at[0], last);
  EXPECT_GE(f.at[0], stop_pushing);
  EXPECT_EQ(f.at.size(), 1u);
}

TEST(CoreWatchdog, AnEarlierDeadlineReArms) {
  asio::io_context io;
  Fires f;
  Watchdog w(io.get_executor(), f.fn());
  const auto t0 = Clock::now();
  w.expires_after(1h);
  w.expires_after(30ms);
  ASSERT_TRUE(run_until(io, [&] { return !f.at.empty(); }));  // well before the hour
  EXPECT_GE(f.at[0], t0 + 30ms);
  EXPECT_LT(f.at[0], t0 + kLimit);
}

TEST(CoreWatchdog, DisarmPreventsFiring) {
  asio::io_context io;
  Fires f;
  Watchdog w(io.get_executor(), f.fn());
  w.expires_after(20ms);
  w.disarm();
  run_for_at_least(io, 150ms);
  EXPECT_TRUE(f.at.empty());
  EXPECT_FALSE(w.expired());
  // Armed again later, it fires.
  const auto deadline = Clock::now() + 20ms;
  w.expires_at(deadline);
  ASSERT_TRUE(run_until(io, [&] { return !f.at.empty(); }));
  EXPECT_GE(f.at[0], deadline);
}

TEST(CoreWatchdog, DisarmAfterMovingLaterPreventsFiring) {
  asio::io_context io;
  Fires f;
  Watchdog w(io.get_executor(), f.fn());
  w.expires_after(20ms);
  w.expires_after(60ms);  // stored only; the timer still wakes at 20 ms
  w.disarm();
  run_for_at_least(io, 200ms);
  EXPECT_TRUE(f.at.empty());
}

TEST(CoreWatchdog, StopNeverFires) {
  asio::io_context io;
  Fires f;
  Watchdog w(io.get_executor(), f.fn());
  w.expires_after(20ms);
  w.stop();
  run_for_at_least(io, 150ms);
  EXPECT_TRUE(f.at.empty());
  w.expires_after(10ms);  // after stop(): still never
  run_for_at_least(io, 100ms);
  EXPECT_TRUE(f.at.empty());
}

TEST(CoreWatchdog, DestroyedWithATimerPendingNeverFires) {
  asio::io_context io;
  Fires f;
  auto w = std::make_unique<Watchdog>(io.get_executor(), f.fn());
  w->expires_after(20ms);
  w.reset();
  run_for_at_least(io, 150ms);
  EXPECT_TRUE(f.at.empty());
}

TEST(CoreWatchdog, ReArmsAfterFiringAndExpiredIsStickyUntilReset) {
  asio::io_context io;
  Fires f;
  Watchdog w(io.get_executor(), f.fn());
  w.expires_after(10ms);
  ASSERT_TRUE(run_until(io, [&] { return f.at.size() == 1; }));
  EXPECT_TRUE(w.expired());
  w.expires_after(10ms);
  EXPECT_TRUE(w.expired());  // sticky
  ASSERT_TRUE(run_until(io, [&] { return f.at.size() == 2; }));
  w.reset_expired();
  EXPECT_FALSE(w.expired());
  run_for_at_least(io, 50ms);
  EXPECT_EQ(f.at.size(), 2u);
}

TEST(CoreWatchdog, ExpiryCallbackMayReArm) {
  asio::io_context io;
  int fired = 0;
  std::optional<Watchdog> w;
  w.emplace(io.get_executor(), [&] {
    if (++fired < 3) w->expires_after(5ms);
  });
  w->expires_after(5ms);
  ASSERT_TRUE(run_until(io, [&] { return fired == 3; }));
  run_for_at_least(io, 50ms);
  EXPECT_EQ(fired, 3);
}

TEST(CoreWatchdog, ADeadlineAlreadyPastFiresSoon) {
  asio::io_context io;
  Fires f;
  Watchdog w(io.get_executor(), f.fn());
  w.expires_at(Clock::now() - 1s);
  ASSERT_TRUE(run_until(io, [&] { return !f.at.empty(); }));
  EXPECT_EQ(f.at.size(), 1u);
}

TEST(CoreWatchdog, ManyFireInTheOrderOfTheirDeadlines) {
  asio::io_context io;
  constexpr int kN = 40;
  std::vector<int> order;
  std::vector<std::unique_ptr<Watchdog>> ws;
  std::vector<Clock::time_point> deadline(kN);
  const auto t0 = Clock::now();
  for (int i = 0; i < kN; ++i) {
    ws.push_back(std::make_unique<Watchdog>(io.get_executor(), [&order, i] { order.push_back(i); }));
    deadline[i] = t0 + 5ms + std::chrono::milliseconds((i * 17) % kN);  // a permutation of 5..44 ms
  }
  for (int i = 0; i < kN; ++i) ws[i]->expires_at(deadline[i]);
  ws[7]->expires_at(deadline[7] + 1s);  // moved later: not among these
  ws[7]->disarm();
  ws[11]->stop();  // leaves the heap at once
  EXPECT_EQ(asio::use_service<WatchdogSet>(io).size(), static_cast<std::size_t>(kN - 1));
  ASSERT_TRUE(run_until(io, [&] { return order.size() == kN - 2; }));
  for (std::size_t k = 1; k < order.size(); ++k) EXPECT_LE(deadline[order[k - 1]], deadline[order[k]]);
  run_for_at_least(io, 30ms);
  EXPECT_EQ(order.size(), static_cast<std::size_t>(kN - 2));
  EXPECT_EQ(asio::use_service<WatchdogSet>(io).size(), 0u);  // the disarmed one was dropped at its old time
}

TEST(CoreWatchdog, ACallbackMayDestroyAnotherThatIsDue) {
  asio::io_context io;
  int first = 0, second = 0;
  auto b = std::make_unique<Watchdog>(io.get_executor(), [&] { ++second; });
  Watchdog a(io.get_executor(), [&] {
    ++first;
    b.reset();  // due at the same time, not yet fired
  });
  const auto at = Clock::now() + 10ms;
  a.expires_at(at);
  b->expires_at(at + 1us);
  ASSERT_TRUE(run_until(io, [&] { return first == 1; }));
  run_for_at_least(io, 30ms);
  EXPECT_EQ(second, 0);
}

TEST(CoreWatchdog, MayOutliveItsIoContext) {
  // A connection's watchdog destroyed after its io_context (pending ones
  // included): the set gave every watchdog up at shutdown.
  std::optional<asio::io_context> io(std::in_place);
  Fires f;
  Watchdog pending(io->get_executor(), f.fn());
  Watchdog idle(io->get_executor(), f.fn());
  pending.expires_after(1h);
  io.reset();
  EXPECT_TRUE(f.at.empty());
}

// --- Event ---

TEST(CoreEvent, NotifyBeforeWaitIsNotLost) {
  asio::io_context io;
  Event e(io.get_executor());
  e.notify();
  bool woke = false;
  asio::co_spawn(
      io.get_executor(),
      [&]() -> Task<void> {
        co_await e.wait();
        woke = true;
      },
      [](std::exception_ptr p) {
        if (p) std::rethrow_exception(p);
      });
  ASSERT_TRUE(run_until(io, [&] { return woke; }));
}

TEST(CoreEvent, WaitThenNotifyWakes) {
  asio::io_context io;
  Event e(io.get_executor());
  bool woke = false;
  asio::co_spawn(
      io.get_executor(),
      [&]() -> Task<void> {
        co_await e.wait();
        woke = true;
      },
      [](std::exception_ptr p) {
        if (p) std::rethrow_exception(p);
      });
  io.poll();
  EXPECT_FALSE(woke);
  asio::post(io, [&] { e.notify(); });  // from a completion handler, as the transports do
  ASSERT_TRUE(run_until(io, [&] { return woke; }));
}

TEST(CoreEvent, ANotifyIsConsumedByOneWait) {
  asio::io_context io;
  Event e(io.get_executor());
  int wakes = 0;
  e.notify();
  e.notify();  // two before a wait are one wake-up
  asio::co_spawn(
      io.get_executor(),
      [&]() -> Task<void> {
        for (;;) {
          co_await e.wait();
          ++wakes;
        }
      },
      [](std::exception_ptr p) {
        if (p) std::rethrow_exception(p);
      });
  ASSERT_TRUE(run_until(io, [&] { return wakes == 1; }));
  run_for_at_least(io, 50ms);
  EXPECT_EQ(wakes, 1);
  e.notify();
  ASSERT_TRUE(run_until(io, [&] { return wakes == 2; }));
  run_for_at_least(io, 50ms);
  EXPECT_EQ(wakes, 2);
  io.stop();
}

// core::Waiter: wake() resumes the parked coroutine inside the call; a
// wake() while none is parked is kept for take_wake(), once.
TEST(CoreWaiter, WakeResumesTheParkedCoroutineInPlace) {
  asio::io_context io;
  Waiter w;
  int stage = 0;
  asio::co_spawn(
      io,
      [&]() -> Task<void> {
        stage = 1;
        co_await w.park();
        stage = 2;
        co_await w.park();
        stage = 3;
      },
      asio::detached);
  io.poll();
  EXPECT_EQ(stage, 1);
  w.wake();  // runs the coroutine to its next park before returning
  EXPECT_EQ(stage, 2);
  EXPECT_FALSE(w.take_wake());  // a wake-up that resumed a coroutine is not kept
  w.wake();
  EXPECT_EQ(stage, 3);
}

TEST(CoreWaiter, AWakeWhileNoneIsParkedIsKeptOnce) {
  Waiter w;
  EXPECT_FALSE(w.take_wake());
  w.wake();
  w.wake();  // a flag, not a count
  EXPECT_TRUE(w.take_wake());
  EXPECT_FALSE(w.take_wake());
}

TEST(CoreWaiter, TheBusyLoopSeesEveryWake) {
  // The call sites' loop: wake-ups that come while the coroutine runs and
  // while it is parked, interleaved; it ends when the work is done.
  asio::io_context io;
  Waiter w;
  int busy = 3;
  bool ended = false;
  asio::co_spawn(
      io,
      [&]() -> Task<void> {
        while (busy > 0) {
          if (!w.take_wake()) co_await w.park();
        }
        ended = true;
      },
      asio::detached);
  --busy;
  w.wake();  // before the coroutine first runs: kept
  io.poll();
  EXPECT_FALSE(ended);  // busy is 2: it parked
  --busy;
  w.wake();  // resumes it; busy is 1: parks again
  EXPECT_FALSE(ended);
  --busy;
  w.wake();
  EXPECT_TRUE(ended);
}

}  // namespace
}  // namespace weir::core
