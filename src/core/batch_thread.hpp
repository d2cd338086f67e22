#pragma once
// The loop of a background thread that moves records from the workers'
// queues to a sink in batches: the request-log writer (requestlog/store.hpp)
// and the OTLP exporter (tracing/exporter.hpp).
//
// By default the thread runs under SCHED_IDLE (sched(7)): it gets a core
// only when no worker wants it, and a worker that wakes preempts it at once.
// A batch of SQLite inserts or an OTLP POST therefore never delays a request;
// when the cores stay busy for longer than the queues can hold, the queues
// drop, and the owner counts the drops (the request path never waits either
// way). Priority::normal (SCHED_OTHER, the workers' own policy) trades some
// request throughput at saturation for fewer drops.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>

namespace weir::core {

class BatchThread {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Priority { idle, normal };  // SCHED_IDLE, or SCHED_OTHER like the workers

  BatchThread() = default;
  ~BatchThread();  // stop(now) if still running
  BatchThread(const BatchThread&) = delete;
  BatchThread& operator=(const BatchThread&) = delete;

  // Starts thread `name` (at most 15 characters, for top/ps) at `priority`.
  // It calls step() until stop(); when a step returns fewer than `full`
  // records taken, it first waits `idle` (or less, if stop() is called).
  // After stop() it calls drain(deadline) once and ends.
  void start(const char* name, Priority priority, std::size_t full, std::chrono::milliseconds idle,
             std::function<std::size_t()> step, std::function<void(Clock::time_point)> drain);
  // Wakes the thread, and joins it once drain(deadline) returned.
  void stop(Clock::time_point deadline);
  // The same, but waits only until `until` (past `deadline`: drain's own
  // grace): a sink blocked in a call with no timeout of its own (a database
  // that stopped answering) cannot hold the process. Returns true when the
  // thread ended; false when it did not: it is detached, and the owner must
  // then outlive the process (never be destroyed: the thread may wake).
  bool stop_within(Clock::time_point deadline, Clock::time_point until);
  // For a step's backoff: waits `d`, or less when stop() is called; true when stopping.
  bool sleep_for(std::chrono::milliseconds d);
  bool running() const { return thread_.joinable(); }

 private:
  void run(std::size_t full, std::chrono::milliseconds idle, const std::function<std::size_t()>& step,
           const std::function<void(Clock::time_point)>& drain);

  std::mutex mu_;  // guards stop_ and deadline_ between the stopping thread and this one, never a worker
  std::condition_variable cv_;
  bool stop_ = false;
  bool done_ = false;  // run() returned
  Clock::time_point deadline_{};
  std::thread thread_;
};

}  // namespace weir::core
