#include "routing/attempts.hpp"

namespace weir::routing {

Attempts::Attempts(WorkerPool& pool, Rng& rng, Clock::time_point now)
    : pool_(pool), rng_(rng), endpoint_(pool.pick(now, rng)) {}

bool Attempts::on_connect_failure(http::UpstreamFailure /*f*/, Clock::time_point now) {
  ++connects_;
  pool_.report_connect_failure(endpoint_, now);
  if (connects_ >= pool_.size()) return false;
  // Another endpoint may take it: nothing has been sent anywhere. Each
  // endpoint is tried once per request, the ones not tried yet first.
  if (endpoint_ < 64) tried_ |= std::uint64_t{1} << endpoint_;
  ++retries_;
  endpoint_ = pool_.pick_excluding(now, rng_, tried_);
  return true;
}

void Attempts::on_connected() {
  ++connects_;
  pool_.report_success(endpoint_);
}

bool Attempts::on_exchange_failure(http::UpstreamFailure f, bool reused, std::size_t upstream_bytes,
                                   Clock::duration since_sent) {
  if (reused && !fresh_retry_used_ && f == http::UpstreamFailure::reset && upstream_bytes == 0 &&
      since_sent < kStaleWindow) {
    // The pooled connection failed at once, before any answer: the server
    // had closed it (the pool's peek missed it by a hair). A later failure
    // may be an upstream that started the generation: never run twice.
    fresh_retry_used_ = true;
    fresh_only_ = true;
    ++retries_;
    return true;
  }
  return false;
}

}  // namespace weir::routing
