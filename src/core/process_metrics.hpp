// The process's own resource use in Prometheus' standard names (the
// "process collector" of the official client libraries: process_cpu_seconds_total,
// process_resident_memory_bytes, process_open_fds, ...), read from the
// kernel at scrape time, and weir_build_info. Linux (/proc) only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace weir::core {

struct ProcessStats {
  double cpu_seconds = 0;            // user + system CPU time of every thread (getrusage)
  std::uint64_t resident_bytes = 0;  // resident set size (/proc/self/statm)
  std::uint64_t virtual_bytes = 0;   // virtual memory size (/proc/self/statm)
  std::uint64_t open_fds = 0;        // descriptors open now, the one used to count them excluded (/proc/self/fd)
  std::uint64_t max_fds = 0;         // RLIMIT_NOFILE soft limit
  double start_time_seconds = 0;     // process start, seconds since the Unix epoch (/proc/self/stat + btime)
};

// Reads the stats of the calling process. A value the kernel does not give
// stays 0; out of descriptors (EMFILE: /proc cannot be opened), open_fds is
// max_fds (every descriptor under the limit is open) and the start time is
// the one read before. Cost: a few syscalls and a directory scan (~10 µs); scrape time only.
ProcessStats read_process_stats();

// Appends the process_* families of `s` in Prometheus text format 0.0.4.
void append_process_metrics(std::string& out, const ProcessStats& s);

// Build identity: the version (CMake's project version) and the git commit
// the binary was built from ("unknown" outside a git checkout), set by the
// build (src/core/build_info.cpp.in).
std::string_view build_version();
std::string_view build_commit();

// Appends weir_build_info{version,commit} 1.
void append_build_info(std::string& out);

}  // namespace weir::core
