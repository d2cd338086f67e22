// A one-waiter wake-up for coroutines on one thread: notify() from a
// completion handler, co_await wait() in the coroutine. A notify() before
// wait() is remembered, so no wake-up is lost.
#pragma once

#include <chrono>

#include "http/io.hpp"

namespace weir::http {

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

}  // namespace weir::http
