#include "core/batch_thread.hpp"

#include <pthread.h>
#include <sched.h>

namespace weir::core {

BatchThread::~BatchThread() {
  if (thread_.joinable()) stop(Clock::now());
}

void BatchThread::start(const char* name, Priority priority, std::size_t full, std::chrono::milliseconds idle,
                        std::function<std::size_t()> step, std::function<void(Clock::time_point)> drain) {
  state_ = std::make_shared<State>();  // (a thread left by an earlier stop keeps its own)
  state_->drain = std::move(drain);
  name_ = name;
  thread_ = std::thread([s = state_, priority, full, idle, step = std::move(step)] {
    // Lowering a thread's own policy needs no privilege; if it fails anyway
    // (a seccomp filter), the thread runs at the default policy.
    if (priority == Priority::idle) {
      sched_param p{};
      p.sched_priority = 0;
      pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);
    }
    run(s, full, idle, step);
  });
  pthread_setname_np(thread_.native_handle(), name);
}

void BatchThread::run(const std::shared_ptr<State>& s, std::size_t full, std::chrono::milliseconds idle,
                      const std::function<std::size_t()>& step) {
  for (;;) {
    {
      std::lock_guard lock(s->mu);
      if (s->stop) {
        // The stopping thread drains, unless it gave up waiting for this
        // one's last step: then nobody else will.
        if (!s->abandoned) return;
        break;
      }
      s->stepping = true;
    }
    const std::size_t n = step();
    {
      std::lock_guard lock(s->mu);
      s->stepping = false;
    }
    s->cv.notify_all();
    if (n < full) s->wait_for(idle);
  }
  s->drain_once();
}

void BatchThread::State::drain_once() {
  Clock::time_point d;
  {
    std::lock_guard lock(mu);
    d = deadline;
  }
  drain(d);
  {
    std::lock_guard lock(mu);
    drained = true;
  }
  cv.notify_all();
}

bool BatchThread::finish(Clock::time_point deadline, const Clock::time_point* until) {
  const auto s = state_;
  if (!thread_.joinable()) return true;
  {
    std::unique_lock lock(s->mu);
    s->stop = true;
    s->deadline = deadline;
    s->cv.notify_all();
    // A step the loop thread is in ends first (step and drain share the sink).
    // Under SCHED_IDLE on a busy host that is the one wait left to chance;
    // between steps (most of its life) there is none.
    auto out_of_step = [&] { return !s->stepping; };
    if (until ? !s->cv.wait_until(lock, *until, out_of_step) : (s->cv.wait(lock, out_of_step), false)) {
      s->abandoned = true;
      lock.unlock();
      thread_.detach();
      return false;
    }
  }
  // It never steps again, and ends when it next runs: not waited for (at
  // SCHED_IDLE that could be seconds on a busy host), as it holds only `s`.
  thread_.detach();
  std::thread drainer([s] { s->drain_once(); });
  pthread_setname_np(drainer.native_handle(), name_.c_str());
  {
    std::unique_lock lock(s->mu);
    auto drained = [&] { return s->drained; };
    if (until ? !s->cv.wait_until(lock, *until, drained) : (s->cv.wait(lock, drained), false)) {
      lock.unlock();
      drainer.detach();
      return false;
    }
  }
  drainer.join();
  return true;
}

void BatchThread::stop(Clock::time_point deadline) { finish(deadline, nullptr); }

bool BatchThread::stop_within(Clock::time_point deadline, Clock::time_point until) { return finish(deadline, &until); }

bool BatchThread::sleep_for(std::chrono::milliseconds d) { return state_->wait_for(d); }

bool BatchThread::State::wait_for(std::chrono::milliseconds d) {
  std::unique_lock lock(mu);
  return cv.wait_for(lock, d, [this] { return stop; });
}

}  // namespace weir::core
