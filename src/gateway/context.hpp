// The per-request context: what the phases learn about one request and
// what the log phase reports. Reset, not reallocated, between requests on a
// connection (its strings keep their capacity).
#pragma once

#include <cstdint>
#include <string>

#include "api/usage.hpp"
#include "core/error.hpp"
#include "core/time.hpp"
#include "gateway/metrics.hpp"

namespace weir::gateway {

struct RequestContext {
  std::string request_id;          // x-request-id, received or generated
  RouteKind route = RouteKind::other;
  std::string method;
  std::string path;
  std::string model;               // as the client sent it
  std::uint32_t model_slot = 0;    // metrics label slot
  int pool = -1;                   // config pool index, -1 = none
  int endpoint = -1;               // endpoint index within the pool, -1 = none
  bool stream = false;
  int status = 0;                  // status sent to the client (499 = client left first)
  int upstream_status = 0;         // status of the upstream's response head; 0 = none arrived
  bool has_error = false;
  core::ErrorSource error_source = core::ErrorSource::internal;
  std::string error_code;          // OpenAI error.code or a Weir reason
  std::uint32_t retries = 0;
  bool has_usage = false;
  api::Usage usage;
  std::uint64_t bytes_in = 0;      // request body bytes
  std::uint64_t bytes_out = 0;     // response bytes written to the client
  std::uint32_t events = 0;        // SSE events relayed

  core::TimePoint t_start{};           // request head complete
  core::TimePoint t_upstream_sent{};   // request written upstream
  core::TimePoint t_first_byte{};      // upstream response head received
  core::TimePoint t_first_token{};     // first SSE data event handed to the client
  core::TimePoint t_upstream_done{};   // upstream response complete
  std::int64_t added_us = 0;           // time inside Weir (see weir_gateway_added_seconds)

  void reset() {
    request_id.clear();
    route = RouteKind::other;
    method.clear();
    path.clear();
    model.clear();
    model_slot = 0;
    pool = endpoint = -1;
    stream = false;
    status = upstream_status = 0;
    has_error = false;
    error_source = core::ErrorSource::internal;
    error_code.clear();
    retries = 0;
    has_usage = false;
    usage = {};
    bytes_in = bytes_out = 0;
    events = 0;
    t_start = t_upstream_sent = t_first_byte = t_first_token = t_upstream_done = {};
    added_us = 0;
  }

  void set_error(const core::Error& e) {
    has_error = true;
    error_source = e.source;
    error_code.assign(e.code.empty() ? e.type : e.code);
  }
};

}  // namespace weir::gateway
