// Which upstream attempt comes next for one request on one pool, and
// whether a failure may be retried: the policy half of the upstream phase
// (the gateway's proxy phase is the driver that connects, sends, reads and
// waits). Split as Pingora's fail_to_connect / error_while_proxy: policy
// decides, the driver loops. Nothing is retried once a byte has reached the
// client. Retries beyond connect failover and the stale-connection resend
// follow the pool's `retry` section (core::RetryConfig, docs/reliability.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

#include "http/forward.hpp"
#include "http/retry_after.hpp"
#include "http/upstream.hpp"
#include "routing/endpoint_set.hpp"
#include "routing/pool.hpp"

namespace weir::routing {

// Why an attempt was retried (the label of weir_upstream_retries_total).
enum class RetryReason : std::uint8_t { connect, stale, reset, timeout, status, protocol, count_ };
std::string_view retry_reason_label(RetryReason r);

// What to do after a failed attempt.
struct RetryDecision {
  bool retry = false;                  // send the request again on this pool, to endpoint()
  std::chrono::milliseconds delay{0};  // wait this long first (backoff, or the upstream's Retry-After)
  RetryReason reason = RetryReason::connect;
};

// The stale pooled connection resend (Attempts::judge): once, at once, on a fresh connection, free.
inline constexpr RetryDecision kStaleResend{.retry = true, .reason = RetryReason::stale};

// One attempt as its driver read it once the exchange's start() returned
// (the gateway's proxy phase, batching::Batch::send): what Attempts::judge takes.
struct AttemptEnd {
  http::UpstreamFailure failure = http::UpstreamFailure::none;  // none: a head came, with `status`
  int status = 0;
  bool reused = false;              // the connection came from the pool
  bool closing_head_alone = false;  // (a 408 head) http::ResponseSource::closing_head_alone
  // (a head not failed) its verdict waits: a stream's for its first token, a non-streamed 2xx's for its
  // body read whole and valid, a 404's for its body (a replica without the pool's model: model_missing)
  bool judged_later = false;
  std::size_t upstream_bytes = 0;                        // (a failure) bytes of an answer read before it
  std::chrono::steady_clock::time_point sent, answered;  // the request went out; the head (or failure) came
};

// What an attempt came to (Attempts::judge).
struct AttemptVerdict {
  // The server had closed the pooled connection (a reset at once, or a 408
  // crossing the request with its close): the request was never read. It is
  // sent again (kStaleResend), and is no verdict on the endpoint: its health
  // does not see it, weir_upstream_failures_total does not count it, the
  // attempt is logged `stale_connection`, the retry counted under that reason.
  bool stale = false;
  // A failed answer (a 5xx or 429 head, a reset, a timeout or an invalid HTTP response before one),
  // reported to the endpoint's health.
  bool failed = false;
  // (judged_later) The verdict waits: the caller reports it through
  // WorkerPool::report_answer, holding this half-open trial slot if true.
  bool deferred = false;
  bool trial = false;
  bool ejected = false;  // the report opened the endpoint (weir_upstream_outlier_ejections_total)
};

// A response status worth another attempt (RFC 9110: 408 Request Timeout,
// 429 Too Many Requests, 502/503/504; Anthropic's 529 overloaded_error):
// the upstream did not do the work.
bool retryable_status(int status);

// parse_retry_after, parse_retry_after_ms: http/retry_after.hpp (the trace
// exporter reads its collector's Retry-After by the same rule).
using http::parse_retry_after;
using http::parse_retry_after_ms;

// The delay an upstream's answer asks for: its `retry-after-ms` field when
// that parses (the OpenAI SDKs read it first), else its Retry-After;
// nullopt when neither does. Every reader of an upstream's wait goes
// through here, so no path reads one field and not the other.
std::optional<std::chrono::milliseconds> asked_delay(std::string_view retry_after_ms, std::string_view retry_after,
                                                     std::chrono::system_clock::time_point now);
// The same, of a response head's fields, now.
std::optional<std::chrono::milliseconds> asked_delay(const http::ResponseHead& head);

// The upstream's own `x-should-retry: false` (OpenAI's and Anthropic's APIs send it on an answer no retry
// helps, a spent quota; their SDKs obey it over their own rule, and compare it as written: "false").
bool says_no_retry(const http::ResponseHead& head);

class Attempts {
 public:
  using Clock = std::chrono::steady_clock;

  // A reused connection that fails this soon after the request went out,
  // before any byte of an answer, was closed by the server before it could
  // read the request: safe to send again, once, on a fresh connection.
  static constexpr auto kStaleWindow = std::chrono::milliseconds(5);

  // Starts with the endpoint pool.pick() chooses at `now` for `req` (whose
  // views must outlive this object: later attempts pick with it again);
  // none when the pool is unavailable (unavailable(): every endpoint's
  // breaker is open).
  Attempts(WorkerPool& pool, Rng& rng, Clock::time_point now, const PickRequest& req = {});
  // A resume's attempts (pools.X.resume): as above, but never to an
  // endpoint in `avoid` (those whose stream broke for this request, and
  // those that failed it before), and holding a slot of the pool's retry budget from the
  // start (a resume is a retry). unavailable() when no other endpoint may
  // take it or the budget is spent (budget_refused()).
  Attempts(WorkerPool& pool, Rng& rng, Clock::time_point now, const PickRequest& req, const EndpointSet& avoid);
  // Gives back the retry-budget slot and the half-open trial slot this request holds, if any.
  ~Attempts();
  Attempts(const Attempts&) = delete;
  Attempts& operator=(const Attempts&) = delete;

  // No endpoint may take the request (a breaker is open on each): nothing
  // was picked, endpoint() is WorkerPool::npos. The caller fails over or
  // answers 503 (WorkerPool::unavailable_for says for how long).
  bool unavailable() const { return endpoint_ == WorkerPool::npos; }
  // The endpoint of the current attempt (index into the pool).
  std::uint32_t endpoint() const { return endpoint_; }
  // True when the current attempt must open a fresh connection (no pooled one).
  bool fresh_only() const { return fresh_only_; }
  // Attempts beyond the first so far.
  std::uint32_t retries() const { return retries_; }
  // A retry was refused because the pool's retry budget was spent.
  bool budget_refused() const { return budget_refused_; }

  // The connection to endpoint() could not be opened (refused or timed
  // out): ejects the endpoint. True when another endpoint may take the
  // request (nothing was sent anywhere), which becomes endpoint(). Every
  // endpoint is tried once per request; this costs no retry budget.
  // local_resources (Weir out of descriptors or ports) ejects nothing and
  // returns false.
  bool on_connect_failure(http::UpstreamFailure f, Clock::time_point now);
  // The connection was opened.
  void on_connected();
  // An attempt ended (its exchange's start() returned): decides first
  // whether it was a stale pooled connection (on_exchange_failure's and
  // on_stale_answer's rule; taking the free resend when so), then reports
  // the answer to the endpoint's health unless it was one (a stale
  // resend is no verdict: the upstream closed an idle connection, as
  // uvicorn does after 5 s; a half-open trial goes on with the resend) or
  // its verdict waits. A cancel or a failed TLS handshake (a connect
  // failure's own report): no verdict either. Both drivers call this, so the rule and its bookkeeping
  // are decided once. The retry that follows a verdict not stale is
  // on_status's (a head) or on_failure's.
  AttemptVerdict judge(const AttemptEnd& e);
  // The current attempt's answer, for the endpoint's health (WorkerPool::report_answer):
  // `failed` for a 5xx or 429 head, or a reset, timeout or invalid response before it. Ends its
  // half-open trial. Returns true when this ejected the endpoint.
  // `capped`: WorkerPool::report_answer's (a 429).
  bool on_answer(bool failed, Clock::time_point now, Clock::time_point sent = {}, bool capped = false);
  // The verdict on the current attempt's answer waits (a stream is judged
  // at its first token): the caller reports it through
  // WorkerPool::report_answer(endpoint(), failed, now, trial) and takes over
  // the half-open trial slot, if one is held (the return value).
  bool defer_answer();
  // Sending the request or reading the response head failed on a connection
  // that was `reused` from the pool, after `upstream_bytes` of an answer and
  // `since_sent` after the request went out. Retried: the stale pooled
  // connection case, once, at once, on a fresh connection to the same
  // endpoint; a reset, first-byte timeout or invalid HTTP response (protocol), while retry.attempts and the
  // retry budget allow, after a backoff, on another endpoint when there is one.
  RetryDecision on_exchange_failure(http::UpstreamFailure f, bool reused, std::size_t upstream_bytes,
                                    Clock::duration since_sent, Clock::time_point now);
  // The same for a failure known not to be a stale pooled connection (judge said so).
  RetryDecision on_failure(http::UpstreamFailure f, Clock::time_point now);
  // A non-streamed request was written whole and its answer's head did not
  // come within timeouts.response: a model server that answers such a
  // request only when its generation is done (vLLM) may still be generating.
  // Not retried (another attempt would start the generation again from
  // scratch) unless the pool's retry.response_timeout says so; then as
  // on_failure's timeout (reason timeout).
  RetryDecision on_response_timeout(Clock::time_point now);
  // The response head has status `status`, on a connection `reused` from
  // the pool; `closing_head_alone`: the head ends the connection
  // (Connection: close) and declares no body (none, or one to the close:
  // decided on the head alone, whatever segments it came in). A 408 so is the
  // server's idle timeout crossing the request on the wire (Node, Jetty: a
  // 408 on an idle keep-alive connection, then the close), the request
  // never read; RFC 9110 §15.5.9: a client MAY repeat it on a new
  // connection. Resent as a stale pooled connection is: once per request,
  // at once, on a fresh connection to the same endpoint, costing no attempt
  // nor budget (reason stale). No time window, unlike a reset's: a 408 says
  // itself that the request was not handled, and the crossing one comes a
  // round trip after the send, which to a distant upstream is more than
  // kStaleWindow. Anything else: no retry (on_status decides).
  RetryDecision on_stale_answer(int status, bool reused, bool closing_head_alone);
  // The response head has status `status` (retryable_status) and asks for
  // `asked` (asked_delay of its fields; read on 429, 503 and 529). Retried
  // while retry.attempts and the budget allow, after max(backoff, the asked
  // delay); a delay beyond retry.retry_after_cap is not waited for. Never when the upstream said
  // `x-should-retry: false` (`told_no_retry`, says_no_retry): another endpoint of the same provider answers
  // alike (a spent quota is the account's). A fallback to another pool still runs: the caller decides that,
  // and another pool's provider may well answer.
  RetryDecision on_status(int status, std::optional<std::chrono::milliseconds> asked, Clock::time_point now,
                          bool told_no_retry = false);

  // The endpoints that failed this request so far, with those it was told to avoid.
  const EndpointSet& failed() const { return tried_; }

 private:
  // Another attempt on this pool after `reason`, if attempts and budget allow; moves to another endpoint.
  bool take_retry(Clock::time_point now);
  // The free resend on a fresh connection, when the connection was `reused` from the pool and it was not
  // used yet for this request.
  bool take_stale_resend(bool reused);
  // The two shapes of a stale pooled connection (on_exchange_failure, on_stale_answer): a reset before any
  // byte of an answer, within kStaleWindow of the send; a 408 whose head closes the connection alone.
  static bool stale_reset(http::UpstreamFailure f, std::size_t upstream_bytes, Clock::duration since_sent) {
    return f == http::UpstreamFailure::reset && upstream_bytes == 0 && since_sent < kStaleWindow;
  }
  static bool stale_408(int status, bool closing_head_alone) { return status == 408 && closing_head_alone; }
  // Takes a slot of the pool's retry budget (once per request); false when it is spent.
  bool enter_budget();
  bool avoided(std::uint32_t i) const { return avoid_.contains(i); }
  std::chrono::milliseconds backoff();

  WorkerPool& pool_;
  Rng& rng_;
  PickRequest req_;
  std::uint32_t endpoint_;
  std::uint32_t connects_ = 0;  // connects that failed (connect failover tries each endpoint once)
  std::uint32_t budgeted_ = 0;  // retries that count against retry.attempts (not connect failover nor the stale resend)
  EndpointSet tried_;           // endpoints that failed this request
  EndpointSet avoid_;           // endpoints never to pick (a resume's: their stream broke)
  std::uint32_t retries_ = 0;
  std::uint32_t backoffs_ = 0;
  bool fresh_only_ = false;
  bool fresh_retry_used_ = false;
  bool in_budget_ = false;  // holds one of the pool's retry-budget slots
  bool trial_ = false;      // holds a half-open trial slot of endpoint_
  bool budget_refused_ = false;
};

}  // namespace weir::routing
