#include "routing/attempts.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <ctime>

#include "core/saturating.hpp"
#include "http/headers.hpp"

namespace weir::routing {

std::string_view retry_reason_label(RetryReason r) {
  switch (r) {
    case RetryReason::connect:
      return "connect";
    case RetryReason::stale:
      return "stale_connection";
    case RetryReason::reset:
      return "reset";
    case RetryReason::timeout:
      return "timeout";
    case RetryReason::protocol:
      return "protocol";
    case RetryReason::status:
    case RetryReason::count_:
      break;
  }
  return "status";
}

bool retryable_status(int status) {
  return status == 408 || status == 429 || status == 502 || status == 503 || status == 504 || status == 529;
}

Attempts::Attempts(WorkerPool& pool, Rng& rng, Clock::time_point now, const PickRequest& req)
    : pool_(pool), rng_(rng), req_(req), endpoint_(pool.pick(now, rng, WorkerPool::npos, req)) {
  if (endpoint_ != WorkerPool::npos) trial_ = pool_.begin_request(endpoint_, now);
}

Attempts::Attempts(WorkerPool& pool, Rng& rng, Clock::time_point now, const PickRequest& req, const EndpointSet& avoid)
    : pool_(pool), rng_(rng), req_(req), endpoint_(WorkerPool::npos), tried_(avoid), avoid_(avoid) {
  if (!enter_budget()) return;
  // (pick_excluding falls back to an excluded endpoint when none other is left: not for a resume.)
  const auto e = pool_.pick_excluding(now, rng_, avoid_, req_, avoid_);
  if (e == WorkerPool::npos || avoided(e)) return;
  endpoint_ = e;
  trial_ = pool_.begin_request(endpoint_, now);
}

Attempts::~Attempts() {
  if (in_budget_) pool_.retry_end();
  if (trial_) pool_.end_trial(endpoint_);
}

bool Attempts::on_connect_failure(http::UpstreamFailure f, Clock::time_point now) {
  if (f == http::UpstreamFailure::local_resources) {
    // Weir's own shortage: no verdict on the endpoint, and another would fare no better.
    if (trial_) pool_.end_trial(endpoint_);
    trial_ = false;
    return false;
  }
  ++connects_;
  pool_.report_connect_failure(endpoint_, now, trial_);
  trial_ = false;
  if (connects_ >= pool_.size()) return false;  // (failed connects: a good one to another endpoint is no bound)
  // Another endpoint may take it: nothing has been sent anywhere. Each
  // endpoint is tried once per request, the ones not tried yet first.
  tried_.insert(endpoint_);
  const auto next = pool_.pick_excluding(now, rng_, tried_, req_, avoid_);
  if (next == WorkerPool::npos || avoided(next)) return false;  // (breaker) every other endpoint is open
  ++retries_;
  endpoint_ = next;
  trial_ = pool_.begin_request(endpoint_, now);
  return true;
}

void Attempts::on_connected() { pool_.report_success(endpoint_); }

bool Attempts::on_answer(bool failed, Clock::time_point now, Clock::time_point sent, bool capped) {
  const bool trial = trial_;
  trial_ = false;
  return pool_.report_answer(endpoint_, failed, now, trial, sent, capped);
}

bool Attempts::defer_answer() {
  const bool trial = trial_;
  trial_ = false;
  return trial;
}

bool Attempts::take_retry(Clock::time_point now) {
  const auto& rc = pool_.config().retry;
  if (1 + budgeted_ >= rc.attempts) return false;
  if (!enter_budget()) return false;
  tried_.insert(endpoint_);
  const auto next = pool_.pick_excluding(now, rng_, tried_, req_, avoid_);
  if (next == WorkerPool::npos || avoided(next)) return false;  // (breaker) no endpoint may take it now
  if (trial_) pool_.end_trial(endpoint_);
  endpoint_ = next;
  trial_ = pool_.begin_request(endpoint_, now);
  fresh_only_ = false;
  ++budgeted_;
  ++retries_;
  return true;
}

bool Attempts::enter_budget() {
  if (in_budget_) return true;
  // Envoy's retry budget: retries in flight at most `budget` of the
  // requests in flight, never fewer than min_concurrent.
  const auto& rc = pool_.config().retry;
  const auto allowed = std::max<double>(rc.min_concurrent, rc.budget * pool_.in_flight());
  if (static_cast<double>(pool_.retries_in_flight()) >= allowed) {
    budget_refused_ = true;
    return false;
  }
  pool_.retry_begin();
  in_budget_ = true;
  return true;
}

std::chrono::milliseconds Attempts::backoff() {
  // Full jitter (AWS architecture blog, "Exponential Backoff And Jitter"):
  // uniform in [0, min(cap, base · 2^n)].
  const auto& rc = pool_.config().retry;
  const auto n = std::min<std::uint32_t>(backoffs_++, 16);
  const auto ceiling = std::min<std::int64_t>(rc.max_backoff.count(), rc.backoff.count() << n);
  if (ceiling <= 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(rng_.below(static_cast<std::uint32_t>(ceiling) + 1));
}

AttemptVerdict Attempts::judge(const AttemptEnd& e) {
  using http::UpstreamFailure;
  AttemptVerdict v;
  // First whether the server had closed the pooled connection: that decides
  // whether the endpoint is judged at all.
  v.stale = (e.failure == UpstreamFailure::none ? stale_408(e.status, e.closing_head_alone)
                                                : stale_reset(e.failure, e.upstream_bytes, e.answered - e.sent)) &&
            take_stale_resend(e.reused);
  if (v.stale) return v;  // (a trial slot held stays held: the resend to this endpoint is the trial)
  // An invalid HTTP response (a garbled head, one too large) is the endpoint's failure as a reset is: an
  // endpoint that answers only garbage looks idle to load-aware picks, and would take every request.
  // A 429 too: the endpoint (or its account) is out of capacity now, and a fast 429 looks idle the same
  // way (LiteLLM's router cools a deployment down on them); but within max_ejected_percent only, breaker
  // or not (capped): an upstream that limits per caller must not let one tenant's flood make the pool
  // unavailable to everyone. Any other 4xx is the client's request.
  v.failed = e.failure == UpstreamFailure::reset || e.failure == UpstreamFailure::timeout ||
             e.failure == UpstreamFailure::protocol ||
             (e.failure == UpstreamFailure::none && (e.status >= 500 || e.status == 429));
  if (e.failure != UpstreamFailure::none && !v.failed) return v;
  if (e.judged_later && !v.failed) {
    v.deferred = true;
    v.trial = defer_answer();
    return v;
  }
  v.ejected = on_answer(v.failed, e.answered, e.sent, e.failure == UpstreamFailure::none && e.status == 429);
  return v;
}

RetryDecision Attempts::on_exchange_failure(http::UpstreamFailure f, bool reused, std::size_t upstream_bytes,
                                            Clock::duration since_sent, Clock::time_point now) {
  // The pooled connection failed at once, before any answer: the server
  // had closed it (the pool's peek missed it by a hair).
  if (stale_reset(f, upstream_bytes, since_sent) && take_stale_resend(reused)) return kStaleResend;
  return on_failure(f, now);
}

RetryDecision Attempts::on_failure(http::UpstreamFailure f, Clock::time_point now) {
  RetryDecision d;
  if (f == http::UpstreamFailure::reset)
    d.reason = RetryReason::reset;
  else if (f == http::UpstreamFailure::timeout)
    d.reason = RetryReason::timeout;
  else if (f == http::UpstreamFailure::protocol)
    d.reason = RetryReason::protocol;  // an invalid response before the head: as a reset (another endpoint)
  else
    return d;  // cancelled: not retried
  if (!take_retry(now)) return d;
  d.retry = true;
  d.delay = backoff();
  return d;
}

RetryDecision Attempts::on_response_timeout(Clock::time_point now) {
  if (!pool_.config().retry.response_timeout) return {.reason = RetryReason::timeout};
  return on_failure(http::UpstreamFailure::timeout, now);
}

bool Attempts::take_stale_resend(bool reused) {
  if (!reused || fresh_retry_used_) return false;
  // Free: it does not count as an attempt (the request was never handled).
  fresh_retry_used_ = true;
  fresh_only_ = true;
  ++retries_;
  return true;
}

RetryDecision Attempts::on_stale_answer(int status, bool reused, bool closing_head_alone) {
  // Only a 408 that closes the connection with nothing else: an answer
  // with a body, or one that keeps the connection, was the server's
  // considered reply to this request (retry.attempts may still resend it).
  if (stale_408(status, closing_head_alone) && take_stale_resend(reused)) return kStaleResend;
  return {.reason = RetryReason::status};
}

std::optional<std::chrono::milliseconds> asked_delay(std::string_view retry_after_ms, std::string_view retry_after,
                                                     std::chrono::system_clock::time_point now) {
  auto ra = retry_after_ms.empty() ? std::nullopt : parse_retry_after_ms(retry_after_ms);
  if (!ra && !retry_after.empty()) ra = parse_retry_after(retry_after, now);
  return ra;
}

std::optional<std::chrono::milliseconds> asked_delay(const http::ResponseHead& head) {
  namespace bh = boost::beast::http;
  return asked_delay(http::first_field(head, "retry-after-ms"), http::first_field(head, bh::field::retry_after),
                     std::chrono::system_clock::now());
}

bool says_no_retry(const http::ResponseHead& head) { return http::first_field(head, "x-should-retry") == "false"; }

RetryDecision Attempts::on_status(int status, std::optional<std::chrono::milliseconds> asked, Clock::time_point now,
                                  bool told_no_retry) {
  RetryDecision d{.reason = RetryReason::status};
  if (!retryable_status(status) || told_no_retry) return d;
  const auto& rc = pool_.config().retry;
  auto wait = std::chrono::milliseconds(0);
  if (status == 429 || status == 503 || status == 529) {
    if (asked) {
      if (*asked > rc.retry_after_cap) return d;  // not worth waiting for here (a fallback may take it)
      wait = *asked;
    }
  }
  if (!take_retry(now)) return d;
  d.retry = true;
  d.delay = std::max(wait, backoff());
  return d;
}

}  // namespace weir::routing
