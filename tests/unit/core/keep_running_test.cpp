// core::keep_running: a long-lived loop spawned detached outlives an exception (asio::detached alone drops
// it, and the loop ends silently: stop 59's keys-file watcher that never read the file again).
#include "core/keep_running.hpp"

#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

namespace weir::core {
namespace {

namespace asio = boost::asio;

struct Loop {
  int runs = 0;
  int throws_left = 0;
  bool done = false;
  Task<void> run() {
    ++runs;
    co_await asio::post(co_await asio::this_coro::executor, asio::deferred);  // (a loop waits first)
    if (throws_left > 0) {
      --throws_left;
      throw std::runtime_error("stoll");
    }
    done = true;
  }
};

TEST(KeepRunning, ALoopThatThrowsIsStartedAgainUntilItReturns) {
  asio::io_context io;
  Loop loop;
  loop.throws_left = 3;
  Loop* l = &loop;
  asio::co_spawn(io, keep_running("the test loop", [l] { return l->run(); }), asio::detached);
  io.run();
  EXPECT_TRUE(loop.done);
  EXPECT_EQ(loop.runs, 4);
}

TEST(KeepRunning, PlainDetachedDropsTheExceptionAndTheLoop) {
  // What keep_running is for: the same loop spawned with detached alone ends at its first exception, and
  // io_context::run() returns normally (nothing tells anyone).
  asio::io_context io;
  Loop loop;
  loop.throws_left = 1;
  asio::co_spawn(io, loop.run(), asio::detached);
  EXPECT_NO_THROW(io.run());
  EXPECT_FALSE(loop.done);
  EXPECT_EQ(loop.runs, 1);
}

TEST(KeepRunning, SaysWhatAnExceptionSays) {
  EXPECT_EQ(exception_text(std::make_exception_ptr(std::out_of_range("stoll"))), "stoll");
  EXPECT_EQ(exception_text(std::make_exception_ptr(42)), "an exception that is not a std::exception");
}

}  // namespace
}  // namespace weir::core
