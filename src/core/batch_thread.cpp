#include "core/batch_thread.hpp"

#include <pthread.h>
#include <sched.h>

namespace weir::core {

BatchThread::~BatchThread() {
  if (thread_.joinable()) stop(Clock::now());
}

void BatchThread::start(const char* name, Priority priority, std::size_t full, std::chrono::milliseconds idle,
                        std::function<std::size_t()> step, std::function<void(Clock::time_point)> drain) {
  {
    std::lock_guard lock(mu_);
    stop_ = false;
    done_ = false;
  }
  thread_ = std::thread([this, priority, full, idle, step = std::move(step), drain = std::move(drain)] {
    // Lowering a thread's own policy needs no privilege; if it fails anyway
    // (a seccomp filter), the thread runs at the default policy.
    if (priority == Priority::idle) {
      sched_param p{};
      p.sched_priority = 0;
      pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);
    }
    run(full, idle, step, drain);
  });
  pthread_setname_np(thread_.native_handle(), name);
}

void BatchThread::run(std::size_t full, std::chrono::milliseconds idle, const std::function<std::size_t()>& step,
                      const std::function<void(Clock::time_point)>& drain) {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stop_) break;
    }
    if (step() < full) sleep_for(idle);
  }
  Clock::time_point deadline;
  {
    std::lock_guard lock(mu_);
    deadline = deadline_;
  }
  drain(deadline);
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

void BatchThread::stop(Clock::time_point deadline) {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    deadline_ = deadline;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool BatchThread::stop_within(Clock::time_point deadline, Clock::time_point until) {
  {
    std::unique_lock lock(mu_);
    stop_ = true;
    deadline_ = deadline;
    cv_.notify_all();
    if (!cv_.wait_until(lock, until, [this] { return done_; })) {
      lock.unlock();
      thread_.detach();
      return false;
    }
  }
  if (thread_.joinable()) thread_.join();
  return true;
}

bool BatchThread::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, d, [this] { return stop_; });
}

}  // namespace weir::core
