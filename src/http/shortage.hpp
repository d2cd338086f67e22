// Weir's own socket shortages: accept(2), socket(2) or connect(2) failing
// because this process (or the host) is out of descriptors, socket buffers,
// memory or local ports. Never a verdict on a peer (docs/reliability.md,
// "Out of descriptors"): an endpoint is not marked unhealthy and no scrape
// failure is counted against it for a socket Weir could not open. Counted
// here process-wide (weir_accept_errors_total,
// weir_local_resource_failures_total) and told on stderr at a bounded rate.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <boost/system/error_code.hpp>

namespace weir::http {

// What ran short (the metrics' reason label).
enum class Shortage : std::uint8_t {
  fds,         // EMFILE: the process's RLIMIT_NOFILE
  system_fds,  // ENFILE: the host's file table (fs.file-max)
  memory,      // ENOBUFS, ENOMEM: socket buffers or kernel memory
  ports,       // EADDRNOTAVAIL on connect(2): no local port left
  other,       // any other accept(2) error (never from the test below)
  count_,
};
std::string_view to_string(Shortage s);

// The shortage `ec` reports, or Shortage::other when it is no shortage of Weir's.
Shortage shortage_of(const boost::system::error_code& ec);
// True when `ec` (from socket(2), connect(2) or accept(2)) says Weir is short
// of a resource of its own: EMFILE, ENFILE, ENOBUFS, ENOMEM, EADDRNOTAVAIL.
inline bool is_local_shortage(const boost::system::error_code& ec) { return ec && shortage_of(ec) != Shortage::other; }

// Where a failure was met (the metrics' listener and operation labels).
enum class ShortageSite : std::uint8_t {
  client_accept,  // a worker's accept(2) on the client port
  admin_accept,   // the control thread's accept(2) on admin.listen
  health_probe,   // a probe's socket (pools.X.health): the probe was not made
  load_scrape,    // a scrape's socket (pools.X.load_metrics): the scrape was not made
  count_,
};

// Counts one failure (any thread: relaxed atomics, process-wide).
void count_shortage(ShortageSite where, Shortage what);
// The count so far for `where` and `what`.
std::uint64_t shortages(ShortageSite where, Shortage what);
// Appends weir_accept_errors_total{listener,reason} and
// weir_local_resource_failures_total{operation,reason} (Prometheus text 0.0.4).
void append_shortage_metrics(std::string& out);

// The stderr lines for one recurring failure of one thread (an accept loop,
// a worker's probes): the first failure is told at once; while failures go
// on, at most one line per kEvery, with the failures since the last one;
// when a told run of failures ends (succeeded()), one line saying so. A
// limit that flaps (a descriptor freed and taken again: a run per accept)
// still gets at most one failure line per kEvery, and a recovery line only
// for a run that was told. An accept that fails 100 times a second writes
// one line per 10 s, not 100. One thread only.
class ShortageLog {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kEvery{10};

  // Each line is "weir: <subject>: ..."; `effect` (what the failure means
  // meanwhile) ends the first line. `out`: where the lines go.
  ShortageLog(std::string subject, std::string effect, std::FILE* out = stderr);

  // A failure (`ec`) at `now`, and a success: both cheap when nothing is written.
  void failed(const boost::system::error_code& ec, Clock::time_point now);
  void succeeded(Clock::time_point now) {
    if (failing_) recovered(now);
  }
  bool failing() const { return failing_; }

 private:
  void recovered(Clock::time_point now);
  void say(const std::string& line);  // one line to out_ (stderr: core::note_line, without waiting)

  std::string subject_;
  std::string effect_;
  std::FILE* out_;
  bool failing_ = false;           // in a run of failures (no success since its first)
  bool told_ = false;              // a failure line was written in this run
  std::uint64_t run_ = 0;          // failures in this run
  std::uint64_t untold_ = 0;       // failures in no line yet (this run's, and untold earlier runs')
  Clock::time_point run_start_{};  // the run's first failure
  Clock::time_point last_line_{};  // the last failure line (none: the epoch)
};

}  // namespace weir::http
