// Per-thread run statistics of weir-bench and the report built from them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>

#include "bench/lib/histogram.hpp"

namespace weir::bench {

// How a measured request ended; exactly one per request.
enum class Outcome : std::uint8_t {
  ok,            // 2xx, complete body; for SSE the end marker was seen
  connect,       // the TCP connection could not be opened (refused, timeout, EMFILE)
  status,        // a non-2xx status (the code is counted in status_codes)
  timeout,       // no complete response within --timeout of the write
  truncated,     // SSE body ended (or the connection closed) without [DONE]
  stall,         // complete SSE stream, but some inter-token gap exceeded --stall-ms
  stream_error,  // the stream carried an error event / {"error": ...} payload
  io,            // connection reset or closed mid-response (not SSE)
  protocol,      // unparseable HTTP response
  cancelled,     // the run was interrupted (SIGINT) while the request was in flight
  left,          // the client left mid-stream on purpose (--leave): closed its connection after --leave-after events
};
inline constexpr std::size_t kOutcomes = 11;
std::string_view outcome_name(Outcome o);

// One of a run's slowest hops (Stats::slowest): when it was sent and what
// it took, so the tail can be set against the gateway's own clock (its access
// log, a profile) rather than read as a percentile alone.
struct HopSample {
  std::int64_t sent_ns = 0;  // actual send, steady_clock ns since the measured window began
  std::int64_t hop_ns = 0;   // the hop (see Stats::hop)
};

struct Stats {
  // The slowest hops kept per run, most first (stats.cpp: kSlowestKept).
  static constexpr std::size_t kSlowestKept = 16;
  // Measured requests (intended send time at or after the end of warm-up).
  std::uint64_t scheduled = 0;           // released by the pacer / started (closed loop)
  std::uint64_t sent = 0;                // written to a connection
  std::uint64_t released_in_window = 0;  // released by the generator inside the window
  std::uint64_t completed = 0;           // finished, any outcome
  std::array<std::uint64_t, kOutcomes> outcomes{};
  // Connect attempts that failed on the generator's own limits (EMFILE, ENFILE,
  // EADDRNOTAVAIL, ENOBUFS, ENOMEM): counted per attempt, also in outcomes[connect].
  std::uint64_t connect_generator = 0;
  std::array<std::uint64_t, 600> status_codes{};  // non-2xx responses by code
  std::uint64_t tokens = 0;                       // token events (see sse.hpp)
  std::uint64_t events = 0;                       // SSE events of measured requests (all kinds)
  std::uint64_t usage_completion_tokens = 0;      // sum of usage.completion_tokens
  std::uint64_t usage_prompt_tokens = 0;          // sum of usage.prompt_tokens
  std::uint64_t with_usage = 0;                   // responses that carried usage
  std::uint64_t bytes_received = 0;               // response bytes incl. headers, all requests

  // Generator-side facts (all requests, warm-up included).
  std::uint64_t warmup_requests = 0;     // sent during warm-up, not measured
  std::uint64_t connections_opened = 0;  // successful TCP connects
  std::uint64_t max_open_connections = 0;
  std::uint64_t max_busy = 0;           // peak requests in flight on connections (concurrent streams)
  std::uint64_t requests_total = 0;     // requests issued, warm-up included (for CPU per request)
  std::uint64_t events_total = 0;       // SSE events received, warm-up included (for CPU per event)
  std::uint64_t reconnects = 0;         // requests re-sent once because a reused keep-alive connection was closed
  std::uint64_t pool_cap_waits = 0;     // requests that waited because --connections was reached
  double cpu_seconds = 0;               // worker thread CPU time
  double max_thread_cpu_util = 0;       // highest worker CPU time / wall time
  double runqueue_wait_seconds = 0;     // worker time runnable but not running (other processes had the CPU)
  double max_thread_runqueue_wait = 0;  // highest worker runqueue wait / wall time

  Histogram e2e;         // intended send -> last byte, ok and stall outcomes
  Histogram ttft;        // intended send -> first token event, any outcome
  Histogram itl;         // gaps between consecutive token events, any outcome
  Histogram sender_lag;  // intended send -> release by the pacer (open loop)
  Histogram connect;     // TCP connect duration
  // The hop, per request, where the upstream stamps its own time (weir-mock --stamp: "mock_ns"): actual send ->
  // first token (a stream) or last byte (not), less the upstream's time from the request read to that write.
  // What the path between client and model server (loopback, or the gateway and its two connections) took, free
  // of the mock's timer jitter and the generator's lateness; ok and stall outcomes.
  Histogram hop;
  std::vector<HopSample> slowest;  // the kSlowestKept largest hops, a min-heap on hop_ns until reported

  // Records a hop into `hop` and, when among the largest, into `slowest`.
  void record_hop(std::int64_t sent_rel_ns, std::int64_t hop_ns);
  std::uint64_t errors() const;  // completed - ok - cancelled - left
  void merge(const Stats& other);
};

// What the run was asked to do and how long it took.
struct RunInfo {
  std::string url;
  bool open_loop = true;
  bool poisson = false;
  double rate = 0;                // offered req/s (open loop)
  std::uint32_t concurrency = 0;  // closed loop
  std::uint32_t threads = 1;
  std::uint64_t connections = 0;  // cap over all threads
  double duration_s = 0;
  double warmup_s = 0;
  double elapsed_s = 0;             // wall time of the whole run
  double measure_start_unix_s = 0;  // the measured window's start, Unix time (HopSample::sent_ns counts from it)
  std::int64_t max_lag_ns = 0;      // --max-lag: sender lag p99 above this = saturated
  bool interrupted = false;
};

// Whether the numbers describe the target or the load generator.
struct Verdict {
  bool generator_saturated = false;
  std::vector<std::string> reasons;  // human-readable, one per failed check
};
// Checks: open loop sends inside the window < 99 % of those scheduled; sender
// lag p99 > max_lag; --connections cap reached; EMFILE on connect; a worker
// thread busy > 90 % of wall time in a closed loop (the target was not the limit);
// a worker thread runnable but off-CPU > 10 % of wall time (a starved machine).
Verdict assess(const RunInfo& run, const Stats& s);

// The report: JSON (every duration in microseconds), CSV (one row per
// histogram) and text for a terminal.
boost::json::object to_json(const RunInfo& run, const Stats& s, const Verdict& v);
std::string to_csv(const Stats& s);
std::string to_text(const RunInfo& run, const Stats& s, const Verdict& v);

}  // namespace weir::bench
