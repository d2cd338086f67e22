#include "core/process_metrics.hpp"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/metrics.hpp"

namespace weir::core {

namespace {

// Field 22 of /proc/self/stat (starttime, clock ticks after boot), per proc(5):
// counted after the ")" that ends the command name, which may hold spaces.
std::uint64_t start_ticks_after_boot() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(line.substr(close + 2));  // field 3 (state) on
  std::string field;
  for (int i = 3; i < 22; ++i) in >> field;
  std::uint64_t ticks = 0;
  in >> ticks;
  return ticks;
}

// btime of /proc/stat: the boot time, seconds since the Unix epoch.
std::uint64_t boot_time() {
  std::ifstream f("/proc/stat");
  std::string key;
  std::uint64_t v = 0;
  while (f >> key) {
    if (key == "btime") {
      f >> v;
      return v;
    }
    f.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace

ProcessStats read_process_stats() {
  ProcessStats s;
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    s.cpu_seconds = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                    static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long size = 0, resident = 0;
    if (std::fscanf(f, "%llu %llu", &size, &resident) == 2) {
      s.virtual_bytes = size * page;
      s.resident_bytes = resident * page;
    }
    std::fclose(f);
  }
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) s.max_fds = rl.rlim_cur;
  if (DIR* d = opendir("/proc/self/fd")) {
    std::uint64_t n = 0;
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
    s.open_fds = n > 0 ? n - 1 : 0;  // not the descriptor opendir used
  } else if (errno == EMFILE) {
    // No descriptor left to count them with: every one under the limit is
    // open (the moment this gauge matters most; 0 would say the opposite).
    s.open_fds = s.max_fds;
  }
  // Read once (it never changes), and again only while the files could not be opened (out of descriptors).
  static std::atomic<double> start_time{0};
  if (start_time.load(std::memory_order_relaxed) == 0) {
    const long hz = sysconf(_SC_CLK_TCK);
    if (const auto ticks = start_ticks_after_boot(); ticks > 0 && hz > 0)
      if (const auto boot = boot_time(); boot > 0)
        start_time.store(static_cast<double>(boot) + static_cast<double>(ticks) / static_cast<double>(hz),
                         std::memory_order_relaxed);
  }
  s.start_time_seconds = start_time.load(std::memory_order_relaxed);
  return s;
}

void append_process_metrics(std::string& out, const ProcessStats& s) {
  PromWriter w(out);
  w.header("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
  w.sample("process_cpu_seconds_total", "", s.cpu_seconds);
  // (Left out when /proc/self/statm could not be read, e.g. out of descriptors: 0 would be a wrong value.)
  if (s.resident_bytes != 0) {
    w.header("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    w.sample("process_resident_memory_bytes", "", static_cast<double>(s.resident_bytes));
    w.header("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
    w.sample("process_virtual_memory_bytes", "", static_cast<double>(s.virtual_bytes));
  }
  w.header("process_open_fds", "gauge", "Number of open file descriptors.");
  w.sample("process_open_fds", "", static_cast<double>(s.open_fds));
  if (s.max_fds) {
    w.header("process_max_fds", "gauge", "Maximum number of open file descriptors.");
    w.sample("process_max_fds", "", static_cast<double>(s.max_fds));
  }
  w.header("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.");
  w.sample("process_start_time_seconds", "", s.start_time_seconds);
}

void append_build_info(std::string& out) {
  PromWriter w(out);
  w.header("weir_build_info", "gauge", "Always 1; the labels say which build of Weir this is.");
  w.sample("weir_build_info",
           "version=\"" + escape_label(build_version()) + "\",commit=\"" + escape_label(build_commit()) + "\"", 1.0);
}

}  // namespace weir::core
