// The `request_log:` section: where every request's record is stored, off
// the request path (requestlog/store.hpp), how long it is kept, and whose
// request and response bodies are stored with it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/batch_thread.hpp"
#include "core/yaml.hpp"

namespace weir::requestlog {

enum class StoreKind : std::uint8_t {
  sqlite,    // one file, WAL mode (the embedded default)
  postgres,  // a PostgreSQL server through libpq
};

// request_log.capture_bodies: request and response bodies stored with the
// records of chosen tenants, size-capped, secrets redacted (requestlog/redact.hpp).
struct CaptureConfig {
  std::vector<std::string> tenants;  // tenant names whose bodies are captured
  bool all = false;                  // tenants: ["*"]: every tenant's (requests without a principal never)
  std::uint64_t max_request_bytes = 16 * 1024;
  std::uint64_t max_response_bytes = 64 * 1024;
  bool captures(std::string_view tenant) const {
    if (all) return true;
    for (const auto& t : tenants)
      if (t == tenant) return true;
    return false;
  }

  bool operator==(const CaptureConfig&) const = default;
};

struct RequestLogConfig {
  std::string url;  // as written: "sqlite:/var/lib/weir/requests.db" or "postgres://user@host/db"
  StoreKind kind = StoreKind::sqlite;
  std::string path;     // SQLite: the file (the URL's path; relative to the working directory)
  std::string display;  // for messages: the SQLite path, or the PostgreSQL URL with its password redacted
  // Records each worker's queue holds before new ones are dropped (and counted).
  std::uint32_t queue = 4096;
  std::uint32_t batch = 256;                      // rows per insert transaction (SQLite) or COPY (PostgreSQL), at most
  std::chrono::milliseconds flush_interval{100};  // the writer wakes this often when the queues are short of a batch
  // Retention: rows older than max_age (0 = no age limit) and beyond the
  // newest max_rows (0 = no row limit) are deleted every `retention_interval`.
  std::chrono::milliseconds max_age{7LL * 24 * 3'600'000};
  std::uint64_t max_rows = 1'000'000;
  std::chrono::milliseconds retention_interval{60'000};
  std::optional<CaptureConfig> capture;  // capture_bodies:, when present
  // The writer thread's CPU priority: idle (SCHED_IDLE, the default) never
  // takes a core from a worker but drops records while the cores stay busy
  // (with anything: SCHED_IDLE yields to every process on the host);
  // normal (SCHED_OTHER) keeps them at some request throughput at saturation.
  core::BatchThread::Priority priority = core::BatchThread::Priority::idle;

  bool operator==(const RequestLogConfig&) const = default;
};

// Parses the top-level `request_log:` of `root`; nullopt when absent.
// Errors (core::ConfigError naming `file`, line and key): an unknown key, a
// URL that is neither sqlite:PATH nor postgres://… (postgresql:// too), a
// SQLite directory that does not exist, queue or batch out of range, a
// capture_bodies without tenants or with caps out of range. (Whether the
// named tenants exist is checked by gateway::load_config, which knows them.)
core::ConfigResult<std::optional<RequestLogConfig>> parse_request_log_config(const YAML::Node& root,
                                                                             const std::string& file);

}  // namespace weir::requestlog
