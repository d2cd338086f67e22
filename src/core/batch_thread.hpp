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
//
// SCHED_IDLE yields to every runnable thread on the host, not only to the
// workers, and an unprivileged thread cannot leave it (sched(7): it needs
// CAP_SYS_NICE or an RLIMIT_NICE of 20). So the drain at shutdown, when no
// worker is left to protect, runs on a thread of its own started by stop()
// at the stopping thread's policy: a busy host (any process wanting the
// core) delays it no more than it delays the rest of the shutdown. The loop
// thread only has to leave the step it is in, if any; it is then left to end
// on its own (it holds nothing of the owner's but the functions it was given).
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
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
  // After stop(), drain(deadline) is called once (never beside a step), on a
  // thread at the stopping thread's policy (see above).
  void start(const char* name, Priority priority, std::size_t full, std::chrono::milliseconds idle,
             std::function<std::size_t()> step, std::function<void(Clock::time_point)> drain);
  // Wakes the thread, waits for the step it is in, and returns once
  // drain(deadline) returned.
  void stop(Clock::time_point deadline);
  // The same, but waits only until `until` (past `deadline`: drain's own
  // grace): a sink blocked in a call with no timeout of its own (a database
  // that stopped answering) cannot hold the process. Returns true when the
  // drain ended; false when it did not (or the step never returned: the
  // loop thread then drains when it does): that thread is left running, and
  // the owner must then outlive the process (never be destroyed: it may wake).
  bool stop_within(Clock::time_point deadline, Clock::time_point until);
  // For a step's backoff: waits `d`, or less when stop() is called; true when stopping.
  bool sleep_for(std::chrono::milliseconds d);
  bool running() const { return thread_.joinable(); }

 private:
  // What the loop thread shares with the stopping one: held by both, so a
  // loop thread left to end on its own outlives this object safely.
  struct State {
    std::mutex mu;  // guards the rest between the stopping thread and the loop's, never a worker
    std::condition_variable cv;
    bool stop = false;
    bool stepping = false;   // the loop thread is in step()
    bool abandoned = false;  // stop_within gave up on a step: the loop thread drains when out of it
    bool drained = false;    // drain() returned
    Clock::time_point deadline{};
    std::function<void(Clock::time_point)> drain;
    bool wait_for(std::chrono::milliseconds d);  // sleep_for()
    void drain_once();                           // drain(deadline), then drained
  };
  static void run(const std::shared_ptr<State>& s, std::size_t full, std::chrono::milliseconds idle,
                  const std::function<std::size_t()>& step);
  // stop() and stop_within(): `until` empty waits without end.
  bool finish(Clock::time_point deadline, const Clock::time_point* until);

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::string name_;
  std::thread thread_;
};

}  // namespace weir::core
