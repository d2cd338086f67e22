// The `request_log:` section: where every request's record is stored, off
// the request path (requestlog/store.hpp), and how long it is kept.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <yaml-cpp/yaml.h>

#include "core/yaml.hpp"

namespace weir::requestlog {

struct RequestLogConfig {
  std::string url;   // as written: "sqlite:/var/lib/weir/requests.db"
  std::string path;  // the SQLite file (the URL's path; relative to the working directory)
  // Records each worker's queue holds before new ones are dropped (and counted).
  std::uint32_t queue = 4096;
  std::uint32_t batch = 256;                      // rows per insert transaction, at most
  std::chrono::milliseconds flush_interval{100};  // the writer wakes this often when the queues are short of a batch
  // Retention: rows older than max_age (0 = no age limit) and beyond the
  // newest max_rows (0 = no row limit) are deleted every `retention_interval`.
  std::chrono::milliseconds max_age{7LL * 24 * 3'600'000};
  std::uint64_t max_rows = 1'000'000;
  std::chrono::milliseconds retention_interval{60'000};
};

// Parses the top-level `request_log:` of `root`; nullopt when absent.
// Errors (core::ConfigError naming `file`, line and key): an unknown key, a
// URL that is not sqlite:PATH (postgres:// is named as not built yet), a
// directory that does not exist, queue or batch out of range.
core::ConfigResult<std::optional<RequestLogConfig>> parse_request_log_config(const YAML::Node& root,
                                                                             const std::string& file);

}  // namespace weir::requestlog
