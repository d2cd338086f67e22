// One weir-bench worker thread: its own io_context, pacer, connection pool
// and statistics (shared-nothing; the main thread merges the Stats at the end).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/ip/tcp.hpp>

#include "bench/lib/stats.hpp"

namespace weir::bench {

// Read-only run description shared by all workers.
struct Plan {
  boost::asio::ip::tcp::endpoint endpoint;
  std::vector<std::string> requests;  // complete HTTP requests, used round-robin
  bool open_loop = true;
  bool poisson = false;
  double rate = 0;                // req/s over all workers (open loop)
  std::uint32_t concurrency = 0;  // over all workers (closed loop)
  std::uint32_t threads = 1;
  std::uint64_t connections = 0;      // cap over all workers
  std::int64_t start_ns = 0;          // absolute steady_clock ns: first intended send
  std::int64_t measure_start_ns = 0;  // start + warm-up
  std::int64_t end_ns = 0;            // measure_start + duration: no sends intended after
  std::int64_t timeout_ns = 0;        // per request, from its write
  std::int64_t stall_ns = 0;          // ITL gap that marks a stream stalled (0: off)
  std::uint64_t seed = 1;
  // --leave: this fraction (0..1) of requests, drawn per request from the
  // seed, close their connection once their stream has `leave_after` events
  // (a client that goes away mid-stream); outcome `left`.
  double leave_fraction = 0;
  std::uint32_t leave_after = 8;
};

// Counters the main thread reads for the progress line (relaxed; written by
// the owning worker only).
struct Live {
  std::atomic<std::uint64_t> sent{0};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<std::uint64_t> ok{0};
  std::atomic<std::uint64_t> inflight{0};
  std::atomic<std::uint64_t> open_connections{0};
  std::atomic<std::uint64_t> tokens{0};
  std::atomic<bool> finished{false};
};

// Set by SIGINT: workers stop issuing and cancel what is in flight.
extern std::atomic<bool> g_stop;

// Current steady_clock time in ns (the clock of every *_ns field).
std::int64_t now_ns();

class Worker {
 public:
  Worker(const Plan& plan, std::uint32_t index);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Runs the worker's share of the plan on the calling thread; returns when
  // every request it issued has finished.
  void run();

  Stats& stats();
  Live& live();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weir::bench
