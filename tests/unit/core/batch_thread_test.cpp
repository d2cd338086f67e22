// core::BatchThread: the loop under the request-log writer and the OTLP exporter.
#include "core/batch_thread.hpp"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace weir::core {
namespace {

using namespace std::chrono_literals;

TEST(BatchThread, StopWithinLeavesAThreadStuckInItsSinkAndReturns) {
  // A sink call that never returns (a database that stopped answering) must not hold the process:
  // stop_within gives up at `until` and leaves the thread, which may still wake later.
  static BatchThread t;  // outlives its thread, as an owner of a left thread must
  static std::promise<void> release;
  static std::promise<void> drained;
  std::atomic<bool> in_step{false};
  auto released = release.get_future().share();
  t.start(
      "weir-test", BatchThread::Priority::normal, 1, 1ms,
      [&in_step, released] {
        in_step = true;
        released.wait();
        return std::size_t{0};
      },
      [](BatchThread::Clock::time_point) { drained.set_value(); });
  while (!in_step) std::this_thread::sleep_for(1ms);
  const auto t0 = BatchThread::Clock::now();
  EXPECT_FALSE(t.stop_within(t0, t0 + 100ms));
  EXPECT_LT(BatchThread::Clock::now() - t0, 5s);
  EXPECT_FALSE(t.running());  // detached
  // The call returns at last: the thread drains and ends on its own.
  release.set_value();
  EXPECT_EQ(drained.get_future().wait_for(10s), std::future_status::ready);
  std::this_thread::sleep_for(50ms);  // (its last lock and notify)
}

TEST(BatchThread, StopWithinJoinsAThreadThatEnds) {
  BatchThread t;
  std::atomic<int> drains{0};
  t.start(
      "weir-test", BatchThread::Priority::normal, 1, 1ms, [] { return std::size_t{0}; },
      [&](BatchThread::Clock::time_point) { ++drains; });
  const auto now = BatchThread::Clock::now();
  EXPECT_TRUE(t.stop_within(now, now + 10s));
  EXPECT_EQ(drains, 1);
  EXPECT_FALSE(t.running());
}

TEST(BatchThread, StepsUntilStoppedThenDrainsOnceWithTheDeadline) {
  BatchThread t;
  std::atomic<int> steps{0}, drains{0}, policy{-1};
  BatchThread::Clock::time_point seen{};
  t.start(
      "weir-test", BatchThread::Priority::idle, 4, 1ms,
      [&] {
        policy = sched_getscheduler(0);
        // Full batches at first (no wait between them), then short ones (a wait each).
        return ++steps < 10 ? std::size_t{4} : std::size_t{1};
      },
      [&](BatchThread::Clock::time_point d) {
        seen = d;
        ++drains;
      });
  EXPECT_TRUE(t.running());
  while (steps < 20) std::this_thread::sleep_for(1ms);
  const auto deadline = BatchThread::Clock::now() + 5s;
  t.stop(deadline);
  EXPECT_FALSE(t.running());
  EXPECT_EQ(drains, 1);
  EXPECT_EQ(seen, deadline);
  EXPECT_EQ(policy, SCHED_IDLE);  // never takes a core from a worker
  const int after = steps;
  std::this_thread::sleep_for(5ms);
  EXPECT_EQ(steps, after);
}

TEST(BatchThread, TheDrainRunsAtTheStoppingThreadsPolicyNeverBesideAStep) {
  // At shutdown no worker is left to protect: a drain at SCHED_IDLE would wait for every other process
  // on the host (seconds on a busy one), and an unprivileged thread cannot leave SCHED_IDLE. The drain
  // runs at the policy of the thread that stops (SCHED_OTHER here), and only once no step runs.
  // (Before the thread's owner: destroyed after it, whose destructor waits for the step that writes them.)
  std::atomic<int> step_policy{-1}, drain_policy{-1};
  std::atomic<bool> in_step{false}, overlap{false};
  BatchThread t;
  t.start(
      "weir-test", BatchThread::Priority::idle, 1, 1ms,
      [&] {
        step_policy = sched_getscheduler(0);
        in_step = true;
        std::this_thread::sleep_for(2ms);
        in_step = false;
        return std::size_t{0};
      },
      [&](BatchThread::Clock::time_point) {
        drain_policy = sched_getscheduler(0);
        if (in_step) overlap = true;
      });
  while (step_policy == -1) std::this_thread::sleep_for(1ms);
  // The stopping thread runs at SCHED_OTHER, even when the tests themselves run at SCHED_IDLE (chrt --idle:
  // beside other jobs); leaving it needs CAP_SYS_NICE or RLIMIT_NICE 20, without which there is nothing to tell.
  int stopper_policy = -1;
  bool stopped = false;
  std::thread stopper([&] {
    sched_param p{};
    pthread_setschedparam(pthread_self(), SCHED_OTHER, &p);
    stopper_policy = sched_getscheduler(0);
    const auto now = BatchThread::Clock::now();
    stopped = t.stop_within(now, now + 30s);
  });
  stopper.join();
  EXPECT_TRUE(stopped);
  EXPECT_EQ(step_policy, SCHED_IDLE);
  EXPECT_EQ(drain_policy, stopper_policy);
  EXPECT_FALSE(overlap);
  EXPECT_FALSE(t.running());
  if (stopper_policy != SCHED_OTHER) GTEST_SKIP() << "runs at SCHED_IDLE without the right to leave it";
}

TEST(BatchThread, StopWakesALongIdleWaitAndABackoff) {
  BatchThread t;
  std::atomic<bool> stopped_backoff{false};
  std::atomic<int> steps{0};
  t.start(
      "weir-test", BatchThread::Priority::idle, 1, 1h,
      [&] {
        if (++steps == 1) stopped_backoff = t.sleep_for(1h);  // a retry backoff, cut short by stop()
        return std::size_t{0};
      },
      [](BatchThread::Clock::time_point) {});
  while (steps < 1) std::this_thread::sleep_for(1ms);
  const auto t0 = BatchThread::Clock::now();
  t.stop(BatchThread::Clock::now());
  EXPECT_LT(BatchThread::Clock::now() - t0, 30s);  // not the hour of either wait
  EXPECT_TRUE(stopped_backoff);
}

TEST(BatchThread, NormalPriorityKeepsTheWorkersPolicy) {
  // The starting thread's policy (a worker's): SCHED_OTHER, or SCHED_IDLE when the process runs under chrt --idle.
  const int workers = sched_getscheduler(0);
  BatchThread t;
  std::atomic<int> policy{-1};
  t.start(
      "weir-test", BatchThread::Priority::normal, 1, 1ms,
      [&] {
        policy = sched_getscheduler(0);
        return std::size_t{0};
      },
      [](BatchThread::Clock::time_point) {});
  while (policy == -1) std::this_thread::sleep_for(1ms);
  t.stop(BatchThread::Clock::now());
  EXPECT_EQ(policy, workers);
}

TEST(BatchThread, SleepForWithoutAThreadWaitsItsTime) {
  BatchThread t;
  EXPECT_FALSE(t.sleep_for(1ms));
  EXPECT_FALSE(t.running());
}

}  // namespace
}  // namespace weir::core
