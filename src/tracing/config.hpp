// The `tracing:` section: OpenTelemetry traces of every request, exported
// over OTLP/HTTP (JSON encoding) by a background thread (tracing/exporter.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/batch_thread.hpp"
#include "core/config.hpp"
#include "core/yaml.hpp"

namespace weir::tracing {

struct TracingConfig {
  // Where spans go: the OTLP/HTTP traces URL. A URL without a path (or "/")
  // gets the specification's /v1/traces (OTEL_EXPORTER_OTLP_ENDPOINT's
  // rule); one with a path is used as written (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT's).
  core::EndpointConfig endpoint;
  std::string target;         // the request target POSTed to (path and query)
  double sample_ratio = 1.0;  // 0..1: the share of new traces recorded (parent-based: a caller's decision wins)
  // true: a valid traceparent's sampled flag decides (OpenTelemetry's ParentBased);
  // false: sample_ratio decides for every request, so clients cannot make Weir
  // record (or skip) their requests; the trace is continued either way.
  bool parent_based = true;
  std::string service_name = "weir";
  // Resource attributes beside service.name, service.version and service.instance.id.
  std::vector<std::pair<std::string, std::string>> resource;
  // Extra request headers (an API key for a hosted backend), as given or
  // read from environment variables at load.
  std::vector<std::pair<std::string, std::string>> headers;
  std::uint32_t queue = 2048;                      // traces (one per request) each worker's queue holds
  std::uint32_t batch = 256;                       // traces per export request, at most
  std::chrono::milliseconds flush_interval{1000};  // the exporter wakes this often when short of a batch
  std::chrono::milliseconds timeout{10'000};       // one export: connect, send and answer
  std::string ca_file;                             // https:// endpoints: trusted CAs (PEM); empty = the system store
  // The exporter thread's CPU priority (as request_log.priority): idle by default.
  core::BatchThread::Priority priority = core::BatchThread::Priority::idle;

  bool operator==(const TracingConfig&) const = default;
};

using GetEnv = const char* (*)(const char*);

// Parses the top-level `tracing:` of `root`; nullopt when absent. Errors
// (core::ConfigError naming `file`, line and key): an unknown key, a URL
// that is not http(s)://, a ratio outside 0..1, a header name that is not an
// HTTP token or a value with a control character, an unset environment
// variable in headers_env, queue or batch out of range.
core::ConfigResult<std::optional<TracingConfig>> parse_tracing_config(const YAML::Node& root, const std::string& file,
                                                                      GetEnv getenv_fn = nullptr);

}  // namespace weir::tracing
