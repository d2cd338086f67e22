// The trace exporter: one background thread that empties every worker's
// TraceQueue, encodes the spans as OTLP/HTTP JSON (tracing/otlp_json.hpp)
// and POSTs them in batches to tracing.otlp_endpoint, on one kept-alive
// connection (http:// or https://). The request path only fills a slot of
// its worker's queue and never waits: a full queue drops the trace, an
// export that fails (after retries for 429, 502, 503, 504 and connection
// errors, as the OTLP specification asks) drops its batch; both are
// counted (weir_tracing_spans_dropped_total) and said on stderr: the
// first drop within about a second (also while an export waits on a
// collector that holds it), then at most every 10 s.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/batch_thread.hpp"
#include "tracing/config.hpp"
#include "tracing/context.hpp"
#include "tracing/otlp_json.hpp"
#include "tracing/record.hpp"

namespace weir::tracing {

// Counters for /metrics (spans, not traces); readable from any thread.
struct ExporterStats {
  std::uint64_t exported = 0;            // spans the collector accepted
  std::uint64_t dropped_queue_full = 0;  // spans of traces a worker found no room for
  std::uint64_t dropped_export = 0;      // spans of batches that could not be delivered
  std::uint64_t dropped_rejected = 0;    // spans the collector refused (partialSuccess.rejectedSpans)
  std::uint64_t dropped_shutdown = 0;    // spans still queued when the shutdown drain ran out of time
  std::uint64_t export_requests = 0;     // POSTs answered 2xx
  std::uint64_t export_errors = 0;       // POSTs that failed (connection, timeout, non-2xx), retries included
  std::uint64_t queued = 0;              // traces in the queues now
  std::uint64_t in_flight = 0;           // spans of the export under way (neither exported nor dropped yet)
};

// The outcome of one POST.
struct PostResult {
  int status = 0;                           // HTTP status; 0 = no answer (`error` says why)
  std::string error;                        // empty on an answer
  std::chrono::milliseconds retry_after{};  // the answer's Retry-After, at most 5 s; 0 = none
  std::string body;                         // the answer's body (at most 64 KiB)
};

class OtlpClient;

class Exporter {
 public:
  // One queue of config.queue traces per worker; nothing starts yet.
  // `resource`: the process's resource attributes (service.name, ...).
  Exporter(TracingConfig config, unsigned workers, Resource resource);
  ~Exporter();  // stop(now) if still running
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  TraceQueue& queue(unsigned worker) { return *queues_[worker]; }
  const TracingConfig& config() const { return config_; }
  const Sampler& sampler() const { return sampler_; }

  void start();
  // After the workers stopped: exports what is queued until `deadline`,
  // counts the rest as dropped, closes the connection and joins the thread.
  // An export under way when stop() comes is not retried; one that is still
  // waiting on a collector that does not answer (up to tracing.timeout) is
  // not waited for past `deadline` + 1 s: false then, the thread is
  // detached, and the exporter must outlive the process (never destroyed).
  bool stop(std::chrono::steady_clock::time_point deadline);

  ExporterStats stats() const;
  // Says on stderr what became of the spans: exported, not exported by
  // reason, in an export under way, still queued. For the end of the
  // process, after stop() (whether or not the drain ended).
  void say_final() const;

  // --- the thread's step, public for tests; only while the thread is not running ---
  // Takes up to config.batch traces from the queues in turn, encodes and
  // POSTs them (retrying as above until `deadline`). Returns the traces taken.
  std::size_t export_batch(std::chrono::steady_clock::time_point deadline);
  // The last request body encoded (tests).
  const std::string& last_body() const { return body_; }

 private:
  // After stop(): exports what is queued until `deadline`, counts the rest as dropped.
  void drain(std::chrono::steady_clock::time_point deadline);
  void report(bool now_anyway = false);
  // A retry's backoff: waits `wait` (report()ing every second); true when stopping.
  bool backoff_for(std::chrono::milliseconds wait);

  TracingConfig config_;
  Sampler sampler_;
  std::string resource_json_;
  std::vector<std::unique_ptr<TraceQueue>> queues_;
  std::unique_ptr<OtlpClient> client_;
  std::vector<const TraceRecord*> taken_;
  std::string body_;
  std::size_t next_queue_ = 0;

  std::atomic<std::uint64_t> exported_{0}, dropped_export_{0}, dropped_rejected_{0}, dropped_shutdown_{0},
      export_requests_{0}, export_errors_{0}, in_flight_{0};
  // Rate-limited reporting (exporter thread).
  std::chrono::steady_clock::time_point last_report_{};
  // What the last line said, by reason of weir_tracing_spans_dropped_total
  // (shutdown's drops are said by drain()), and of failed exports.
  std::uint64_t reported_queue_full_ = 0, reported_failed_ = 0, reported_rejected_ = 0;
  std::uint64_t reported_errors_ = 0;
  std::string last_export_error_;  // the last failed POST: "{endpoint} answered 503", "{endpoint}: {why}"
  std::string last_rejection_;     // the last partialSuccess's errorMessage (may be empty)

  bool draining_ = false;   // drain() runs: the loop thread's own flag
  core::BatchThread loop_;  // last: joined before the members it uses go
};

}  // namespace weir::tracing
