// Which upstream attempt comes next for one request, and whether a failure
// may be retried: the policy half of the upstream phase (the gateway's
// proxy phase is the driver that connects, sends and reads). Split as
// Pingora's fail_to_connect / error_while_proxy: policy decides, the driver
// loops. Nothing is retried once a byte has reached the client, and a
// request an upstream may have started is never sent twice.
#pragma once

#include <chrono>
#include <cstdint>

#include "http/upstream.hpp"
#include "routing/pool.hpp"

namespace weir::routing {

class Attempts {
 public:
  using Clock = std::chrono::steady_clock;

  // A reused connection that fails this soon after the request went out,
  // before any byte of an answer, was closed by the server before it could
  // read the request: safe to send again, once, on a fresh connection.
  static constexpr auto kStaleWindow = std::chrono::milliseconds(5);

  // Starts with the endpoint pool.pick() chooses at `now`.
  Attempts(WorkerPool& pool, Rng& rng, Clock::time_point now);

  // The endpoint of the current attempt (index into the pool).
  std::uint32_t endpoint() const { return endpoint_; }
  // True when the current attempt must open a fresh connection (no pooled one).
  bool fresh_only() const { return fresh_only_; }
  // Attempts beyond the first so far.
  std::uint32_t retries() const { return retries_; }

  // The connection to endpoint() could not be opened (refused or timed
  // out): ejects the endpoint. True when another endpoint may take the
  // request (nothing was sent anywhere), which becomes endpoint().
  bool on_connect_failure(http::UpstreamFailure f, Clock::time_point now);
  // The connection was opened.
  void on_connected();
  // Sending the request or reading the response head failed on a connection
  // that was `reused` from the pool, after `upstream_bytes` of an answer and
  // `since_sent` after the request went out. True when the request may be
  // sent again (on a fresh connection to the same endpoint: the stale
  // pooled connection case, once).
  bool on_exchange_failure(http::UpstreamFailure f, bool reused, std::size_t upstream_bytes,
                           Clock::duration since_sent);

 private:
  WorkerPool& pool_;
  Rng& rng_;
  std::uint32_t endpoint_;
  std::uint32_t connects_ = 0;
  std::uint64_t tried_ = 0;  // endpoints that refused this request (bit i = endpoint i)
  std::uint32_t retries_ = 0;
  bool fresh_only_ = false;
  bool fresh_retry_used_ = false;
};

}  // namespace weir::routing
