// The per-request context: everything one request owns, and the only
// argument the phases share (gateway/pipeline.hpp). Reset, not reallocated,
// between requests on a connection: its strings keep their capacity, so a
// steady load allocates nothing here.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "admission/admission.hpp"
#include "admission/pricing.hpp"
#include "api/openai/resume.hpp"
#include "api/request.hpp"
#include "api/usage.hpp"
#include "auth/policy.hpp"
#include "core/async.hpp"
#include "core/attempt_id.hpp"
#include "core/buffer_budget.hpp"
#include "core/error.hpp"
#include "core/time.hpp"
#include "gateway/endpoints.hpp"
#include "gateway/stream_hooks.hpp"
#include "http/downstream.hpp"
#include "http/response_source.hpp"
#include "http/sse.hpp"
#include "requestlog/queue.hpp"
#include "routing/endpoint_set.hpp"
#include "routing/queue.hpp"
#include "routing/route_table.hpp"
#include "tracing/context.hpp"

namespace weir::gateway {

struct WorkerGeneration;
// A request's part in a trace (tracing:, docs/observability.md#traces):
// its ids, what it propagates upstream, and the times of the child spans
// it records when sampled. Fixed-size: recording allocates nothing.
struct TraceState {
  static constexpr std::size_t kMaxAttempts = 8;  // as RequestContext::kMaxAttemptRecords
  bool on = false;                                // tracing is configured: ids are made and traceparent goes upstream
  bool sampled = false;                           // the request's spans are recorded and exported
  tracing::TraceId trace_id;
  tracing::SpanId span_id;                 // the request's span
  tracing::SpanId parent_id;               // the caller's, from a valid traceparent; invalid = none
  std::string tracestate;                  // the caller's, checked (tracing::normalize_tracestate); sent upstream as is
  std::string user_agent;                  // the client's User-Agent (sampled requests only), at most 256 bytes
  tracing::TraceparentText traceparent{};  // what the current upstream attempt sends
  tracing::SpanId attempt_span;            // the span id in `traceparent`; invalid = none yet
  core::TimePoint auth_start{}, auth_end{}, admit_start{}, admit_end{}, batch_join{};
  bool auth_span = false, auth_error = false, admit_span = false, admit_error = false;
  // Per upstream attempt, index as RequestContext::attempt_log: the span id
  // it sent (invalid: it never sent one, e.g. a refused connect) and when it ended.
  std::array<tracing::SpanId, kMaxAttempts> attempt_ids{};
  std::array<core::TimePoint, kMaxAttempts> attempt_end{};
  // A micro-batch member (pools.X.batch, pools.X.coalesce): which attempts
  // were its batch's (bit i: attempt i), the span context the batch sent
  // upstream (its lead member's), and whether that was this request's own.
  std::uint8_t batch_attempts = 0;
  bool batch_lead = false;
  tracing::TraceId batch_sent_trace;
  tracing::SpanId batch_sent_span;

  std::string_view traceparent_view() const { return {traceparent.data(), traceparent.size()}; }
  void reset() {
    on = sampled = false;
    trace_id = {};
    span_id = parent_id = attempt_span = {};
    tracestate.clear();
    user_agent.clear();
    auth_start = auth_end = admit_start = admit_end = batch_join = {};
    auth_span = auth_error = admit_span = admit_error = false;
    batch_attempts = 0;
    batch_lead = false;
    batch_sent_trace = {};
    batch_sent_span = {};
  }
};

struct RequestContext {
  // The configuration generation the request runs on, from its read phase
  // to its log line (gateway/generation.hpp): every index below (pool,
  // endpoint, model slot) is into it.
  std::shared_ptr<WorkerGeneration> gen;

  // --- read: what the head says ---
  http::ReadFailure read_failure = http::ReadFailure::none;  // the head could not be read (the session says why)
  std::string request_id;                                    // x-request-id, received or generated
  // The x-request-id sent upstream, when it is not request_id: a client's
  // own id with "-" and a generated one after it (upstream_id()).
  std::string upstream_request_id;
  // Upstream requests sent so far, and the id of the latest when it is not
  // upstream_id(): a retry, a failover or a fallback after the first send
  // carries upstream_id() + "-" + its number (next_attempt_id()), so vLLM
  // never sees one id twice (an attempt Weir gave up on may still run
  // there until its abort is processed).
  core::AttemptIds attempts;
  bool sent_alone = false;  // an upstream request of its own went out (not only its micro-batch's)
  RouteKind route = RouteKind::other;
  std::string method;
  std::string path;  // without the query, at most 256 bytes

  // --- authenticate ---
  auth::PrincipalPtr principal;  // who is asking; null without auth
  // Who a credential refused on policy names (401 expired key, 403 unknown
  // tenant): logged in place of the principal's identity. On the heap, made
  // on that path only: an open stream does not carry its ~100 bytes.
  std::unique_ptr<auth::RefusedIdentity> refused;
  // For the logs: the principal's tenant, key id and JWT subject, else the
  // refused credential's; empty when unknown.
  std::string_view log_tenant() const noexcept {
    return principal ? principal->tenant_name() : refused ? std::string_view(refused->tenant) : std::string_view();
  }
  std::string_view log_key_id() const noexcept {
    return principal ? principal->key_id() : refused ? std::string_view(refused->key_id) : std::string_view();
  }
  std::string_view log_subject() const noexcept {
    if (principal) return principal->kind == auth::CredentialKind::jwt ? std::string_view(principal->subject) : "";
    return refused ? std::string_view(refused->subject) : std::string_view();
  }

  // --- parse ---
  std::string model;             // as the client sent it (at most 256 bytes)
  std::uint32_t model_slot = 0;  // metrics label slot
  bool stream = false;
  api::RequestFields fields;  // the body's fields the gateway acts on (model moved out)

  // --- route ---
  routing::Route target;  // pool, canonical and upstream model name
  int pool = -1;          // config pool index, -1 = none
  int endpoint = -1;      // endpoint index within the pool, -1 = none

  // --- admit ---
  admission::Ticket ticket;                      // stream slots and budget reservations until settled (log)
  const admission::ModelPrice* price = nullptr;  // of the model that answers (a fallback's {model: M} moves it)
  // The budget reservation's price when a fallback model may answer at a higher one than the request's model:
  // the highest of each price over them (admit_checks); has_reserve_price false: the model's own.
  admission::ModelPrice reserve_price;
  bool has_reserve_price = false;
  std::uint64_t prompt_tokens_estimate = 0;  // charged when the upstream worked but reported no usage
  // The most completion tokens the request allows (max_tokens × n × prompts), 0 when it set no max_tokens:
  // what settle() charges at most for its content events when there is no usage.
  std::uint64_t completion_cap = 0;
  std::int64_t spend_nano_usd = 0;  // set by log's settle
  std::string rate_limit_lines;     // x-ratelimit-* header lines for every answer to this request
  // server.cors on: the CORS header lines for every answer to this request (gateway/cors.hpp; read sets
  // them), and whether its Origin is allowed. Empty with server.cors off.
  std::string cors_lines;
  bool cors_allowed = false;

  // --- proxy: the upstream request and its response ---
  std::string_view upstream_body;          // the client's body, or a spliced copy in upstream_body_buf / edit_buf
  std::string upstream_body_buf;           // lent by the worker while the request is sent
  std::string edit_buf;                    // second buffer for spliced bodies (lent)
  bool chat_translated = false;            // an Anthropic route: edit_buf holds its chat-completions translation
  bool chat_continuous = false;            // ... made with vLLM's extensions (pools.X.continuous_usage)
  bool anthropic_models = false;           // /v1/models(/...) with anthropic-version: answered in Anthropic's shapes
  bool anthropic_client = false;           // the request carried anthropic-version (an Anthropic SDK's)
  bool anthropic_ready = false;            // route: upstream_body_buf holds the Anthropic body for the first target
  std::uint64_t anthropic_max_tokens = 0;  // tokens: the max_tokens its last translation for Anthropic sent
  bool target_refused = false;             // attempt_pool: this target's API cannot carry the request (nothing sent)
  bool strip_usage = false;                // Weir asked for the usage chunk; the client did not
  http::ResponseSource* source = nullptr;  // the response being relayed (cancelled when the client leaves)
  int upstream_status = 0;                 // status of the upstream's response head; 0 = none arrived
  bool committed = false;                  // a byte of the response reached the client's queue: nothing can be retried
  bool drain_cut = false;                  // the drain deadline cut it off (GatewayPhases::cut_for_shutdown)
  // A micro-batch member cut off (its deadline) whose prompt the upstream still generates: its answer went out,
  // and its log line waits for that prompt's end (proxy_batched). Its stream slot stays held until then.
  bool answered_lingering = false;
  std::uint32_t retries = 0;
  // Fallbacks (models.X.fallbacks): steps taken along target.fallbacks, and
  // how many the request allows (x-weir-fallbacks; at most the chain's length).
  std::uint8_t fallback_step = 0;
  std::uint8_t fallback_limit = 0xff;
  std::int8_t priority_asked = -1;  // x-weir-priority (0..100), -1 when not sent: a queue's (enter_pool)
  // Whether fallback i (< 64) can take the request's body (GatewayPhases::
  // takes_request), once looked at: bit i of `judged`, and of `refused` when it cannot.
  mutable std::uint64_t fallbacks_judged = 0, fallbacks_refused = 0;
  bool hold_head = false;  // a stream whose head waits for its first content event (a fallback remains)
  bool fail_over = false;  // that stream failed before it: the proxy goes on to the next target
  // A held stream that failed before its first content with a reset or a
  // stall (what the pool's `retry` retries before a head: held_failure) goes
  // again on the same pool, to another endpoint, while the pool's attempts
  // last (pool_tries made on the current target), never to one whose stream
  // failed (pool_avoid), before a fallback takes it.
  http::UpstreamFailure held_failure = http::UpstreamFailure::none;
  // The current attempt's failure is in weir_upstream_failures_total already
  // (its 5xx head, kind status): a body that then breaks is the same failed
  // attempt, counted once by its first cause (count_upstream_failure).
  bool attempt_failure_counted = false;
  std::uint8_t pool_tries = 0;
  routing::EndpointSet pool_avoid;
  // Every endpoint of the current target that failed this request (a refused
  // connect, a 503, a stall, a reset: routing::Attempts::failed), which a
  // resume and a held stream's retry avoid too.
  routing::EndpointSet pool_failed;
  bool error_relayed = false;      // the upstream's in-band error event reached the client: fail() adds only the end
  bool upstream_refused = false;   // ... and it refused the request (a 4xx): not the endpoint's failure
  core::Timer* backoff = nullptr;  // the retry backoff or queue wait being waited, cancelled when the client leaves
  // Reliability (docs/reliability.md): the request's own deadline
  // (x-weir-timeout-ms; none = {}), its place in a pool's queue, and the verdict on a stream's answer that waits for
  // its first token (the endpoint's health, routing/health.hpp).
  core::TimePoint deadline{};
  std::uint32_t deadline_ms = 0;  // the header's value, for the error message
  int queue_pool = -1;            // the pool whose queue admitted it (PoolQueue::done() when it leaves), -1 = none
  bool verdict_pending = false;   // the answer's verdict waits for the stream's first token
  bool end_pending = false;       // the upstream body's end is still to come after the client's [DONE] (proxy.cpp)
  bool trial = false;             // ... and holds the endpoint's half-open trial slot
  bool judged_good = false;       // judged a good answer at its first token (an in-band error after it still fails it)
  // The upstream's 404 says the model the pool routes to it does not exist there (respond_buffered): the
  // answer's verdict is a failed one (judge_answer), though it passes to the client as it came.
  bool model_missing = false;
  // The answer was larger than server.max_response (raw or decoded): Weir's limit, which the request may
  // have asked past (max_tokens, logprobs), not the endpoint failing: no failed answer for its health.
  bool over_limit = false;
  // What cut the response off: its first token did not come by
  // first_token_by (pools.X.timeouts.first_token), a batched non-streamed
  // answer was not whole by response_by (pools.X.timeouts.response), or its
  // deadline passed.
  enum class Cutoff : std::uint8_t { none, first_token, response, deadline } cutoff = Cutoff::none;
  core::TimePoint first_token_by{};
  core::TimePoint response_by{};
  std::unique_ptr<core::Watchdog> cutoff_watch;  // made once per connection, when first needed (off the stream's state)
  // Every upstream attempt of the request, for the access log's `attempts`.
  struct AttemptRecord {
    std::int16_t pool = -1;
    std::int16_t endpoint = -1;
    std::int16_t status = 0;  // response status, 0 = none (failure says why)
    http::UpstreamFailure failure = http::UpstreamFailure::none;
    std::uint32_t us = 0;  // request sent (or connect started) → outcome, µs
    bool resume = false;   // a resume's attempt: it continued a stream that broke (pools.X.resume)
    // It met a pooled connection the upstream had closed (reset at once, or a bodiless 408 that closes it)
    // and was resent free on a fresh one (routing::RetryReason::stale): not a failure of the endpoint's,
    // so not `failure` reset (weir_upstream_failures_total does not count it either).
    bool stale = false;
    // The access log's and the trace's word for how it failed: "stale_connection" (as
    // weir_upstream_retries_total's reason), else `failure`'s name; "" for none.
    std::string_view failure_label() const {
      if (stale) return "stale_connection";
      return failure == http::UpstreamFailure::none ? std::string_view() : http::to_string(failure);
    }
  };
  // At most kMaxAttemptRecords are kept (fixed size: recording allocates
  // nothing): the first ones, and in the last slot always the latest, the
  // one whose answer the client got (or whose failure it got); those
  // between are counted in attempts_dropped. (A request may take more:
  // retry.attempts per pool, each fallback's pool, and a connect failover
  // to every endpoint of a pool.)
  static constexpr std::size_t kMaxAttemptRecords = 8;
  std::array<AttemptRecord, kMaxAttemptRecords> attempt_log{};
  std::uint8_t attempt_count = 0;
  std::uint32_t attempts_dropped = 0;  // attempts left out of attempt_log (between its last two)
  void record_attempt(const AttemptRecord& a) {
    if (attempt_count == kMaxAttemptRecords) {
      // Full: the latest takes the last slot; the one it held is dropped.
      --attempt_count;
      ++attempts_dropped;
    }
    if (trace_sampled()) {
      trace->attempt_ids[attempt_count] = trace->attempt_span;
      trace->attempt_end[attempt_count] = core::now();
      trace->attempt_span = {};                                                    // the next attempt sends a new one
      trace->batch_attempts &= static_cast<std::uint8_t>(~(1u << attempt_count));  // (batched_attempt marks)
    }
    attempt_log[attempt_count++] = a;
  }
  core::TimePoint attempt_since{};  // the last attempt's send (or connect) start; proxy's attempts set it
  // The last attempt failed after its head came (its body or stream broke or
  // timed out, or a held stream ended before content): `f`, and its time
  // runs to now, the outcome (docs/reliability.md: "ms").
  void attempt_failed_after_head(http::UpstreamFailure f) {
    if (attempt_count == 0) return;
    auto& a = attempt_log[attempt_count - 1];
    a.failure = f;
    if (attempt_since == core::TimePoint{}) return;
    const auto now = core::now();
    a.us = static_cast<std::uint32_t>(core::micros_between(attempt_since, now));
    if (trace_sampled()) trace->attempt_end[attempt_count - 1] = now;
  }
  // A micro-batch member (pools.X.batch): the batch's upstream request id,
  // members sent in it and this request's slot; for the access log.
  std::uint16_t batch_size = 0;
  std::uint16_t batch_slot = 0;
  bool coalesced = false;    // the batch is a coalesced generation (pools.X.coalesce)
  bool batch_split = false;  // the upstream refused the batch whole: the request was then sent alone
  StreamHooks hooks;
  http::SseReader sse{4u << 20};
  // Resume mid-stream (pools.X.resume, docs/upstreams.md#resume-mid-stream):
  // only a chat-completions stream on a pool with resume on touches it.
  struct Resume {
    bool on = false;                  // the stream being relayed may be resumed: its chunks are noted in `tracker`
    bool wanted = false;              // it broke after content reached the client (respond_stream)
    bool active = false;              // the current attempt is a resume: its body is `body`, its chunks are rewritten
    bool answered = false;            // that resume relayed a chunk of its own (past its dropped role chunk)
    bool role_due = false;            // the client has no role chunk yet (broken before it): the resume's goes out
    std::uint8_t count = 0;           // resumes made
    std::uint64_t tokens_before = 0;  // completion tokens the client had when the current resume started
    routing::EndpointSet broke;       // endpoints whose stream broke for this request
    std::string_view original;        // the upstream body of the first attempt (kept: commit does not give it back)
    // How begin_resume ends a broken stream whose generation was complete
    // instead: [DONE] only (its finish_reason went out), or a closing chunk
    // with finish_reason "length" first (max_tokens used up at the break).
    enum class Finish : std::uint8_t { none, done, length } finish = Finish::none;
    // What only a stream that may resume uses, made when the connection's
    // first one starts and kept for its next: every other stream carries a
    // pointer here, not ~200 bytes (memory per open stream).
    struct Buffers {
      std::string body;        // the continuation body being sent
      std::string chunk, raw;  // a rewritten chunk of the continuation, and its SSE event
      api::openai::ResumeTracker tracker;
    };
    std::unique_ptr<Buffers> buf;  // set whenever `on`
    void reset() {
      on = wanted = active = answered = role_due = false;
      count = 0;
      tokens_before = 0;
      broke.clear();
      original = {};
      if (buf) buf->body.clear();
      finish = Finish::none;
    }
  } resume;

  // What only some requests have, made on first use (extra()) and kept for
  // the connection's next requests; null until then, so an open stream of
  // most routes does not carry it (memory per open stream). Cleared by reset().
  struct Extras {
    std::string responses_echo;  // /v1/responses: the request's members of the answer (api/responses/)
    std::string batch_id;        // a micro-batch member: the batch's upstream request id
  };
  std::unique_ptr<Extras> extras;
  Extras& extra() {
    if (!extras) extras = std::make_unique<Extras>();
    return *extras;
  }
  std::string_view responses_echo() const { return extras ? std::string_view(extras->responses_echo) : ""; }
  std::string_view batch_id() const { return extras ? std::string_view(extras->batch_id) : ""; }
  // The x-request-id the request's upstream requests carry, from which the
  // ids of a translated or batched answer are made (msg_X, resp_X, a batch
  // member's cmpl-X): unique per request, whatever id the client chose. vLLM
  // takes it as its engine's request id, which must not be running twice
  // (two clients, two tenants, sending the same x-request-id at once would
  // collide there, and one's disconnect abort the other's by id).
  std::string_view upstream_id() const { return upstream_request_id.empty() ? request_id : upstream_request_id; }
  // The x-request-id of the next upstream request: upstream_id() for the
  // first, upstream_id() + "-N" for the N+1th (valid until the next call).
  std::string_view next_attempt_id() { return attempts.next(upstream_id()); }

  // --- tracing (tracing:) ---
  // Made by begin_trace for the connection's first traced request and kept
  // for its next; null while tracing is off, so an open stream does not
  // carry its ~340 bytes (memory per open stream).
  std::unique_ptr<TraceState> trace;
  bool trace_on() const { return trace && trace->on; }            // ids made, traceparent goes upstream
  bool trace_sampled() const { return trace && trace->sampled; }  // spans recorded and exported

  // --- request_log.capture_bodies: this request's bodies, when its tenant opted in ---
  bool capture = false;
  // Made by begin_capture for the connection's first captured request and
  // kept for its next; null otherwise, so an open stream does not carry its
  // ~100 bytes (memory per open stream). Cleared by reset().
  struct Captured {
    requestlog::CapturedBody request, response;
  };
  std::unique_ptr<Captured> captured;

  // --- outcome (log) ---
  int status = 0;  // status sent to the client (499 = client left first)
  bool has_error = false;
  int error_status = 0;       // the status of the error Weir answered with (its own 502 may go out as a 499)
  bool empty_answer = false;  // a 2xx answer relayed with no body (a 204, an empty 200): no completion to charge
  bool sse_answer = false;    // the answer was relayed as SSE events (respond_stream), not as a whole body
  core::ErrorSource error_source = core::ErrorSource::internal;
  std::string error_code;  // OpenAI error.code or a Weir reason
  // The model was found but the principal may not use it (route): the client is answered as for an unknown
  // model (404 model_not_found), the log says why (model_not_allowed) and which allow-list refused it
  // (`refused_by`), as it does for a request without a model refused in admit (403 model_not_allowed).
  bool model_refused = false;
  auth::AllowList refused_by = auth::AllowList::none;
  bool has_usage = false;
  api::Usage usage;
  // The upstream sent a usage it cannot be billed by (api::extract_usage's
  // invalid: a count negative, fractional, not a number, or over
  // api::kMaxUsageTokens, or a generation's prompt or completion count left
  // out): charged as a request without usage is (settle(); the part said
  // of one with a count left out, as said: said_usage),
  // counted (weir_upstream_invalid_usage_total), logged `"usage_invalid":true`.
  bool usage_invalid = false;
  // With usage_invalid, of a whole answer (not relayed as SSE events: those are the stream hooks'
  // said_usage()): the parts of its usage the upstream said when it left its prompt or completion count
  // out (api::PartialUsage), charged as said, the rest at its estimate (unreported_usage()). Held in
  // `usage` while has_usage is false (said_prompt, said_completion say which parts): set_said_usage(),
  // said_usage().
  bool said_prompt = false;
  bool said_completion = false;
  void set_said_usage(const api::PartialUsage& said) {
    said_prompt = said.prompt;
    said_completion = said.completion;
    if (!said.prompt && !said.completion) return;
    usage = {};
    usage.prompt_tokens = said.counts.prompt_tokens;
    usage.completion_tokens = said.counts.completion_tokens;
    usage.cached_tokens = said.counts.cached_tokens;
    usage.cache_write_tokens = said.counts.cache_write_tokens;
    usage.cache_write_1h_tokens = said.counts.cache_write_1h_tokens;
  }
  api::PartialUsage said_usage() const {
    api::PartialUsage said;
    said.prompt = !has_usage && said_prompt;
    said.completion = !has_usage && said_completion;
    if (said.prompt || said.completion) said.counts = api::PartialUsage::Counts(usage);
    return said;
  }
  // A stream's per-choice usage (continuous_usage_stats: each chunk counts
  // its own choice) when no chunk gave the request's total: summed over its
  // choices (api::openai::UsageHook). settle() makes it the usage of a stream
  // that ended whole, and no more than a floor under the estimate of one cut short.
  bool has_choice_usage = false;
  api::Usage choice_usage;
  // With has_choice_usage: every prompt of the request said its count (UsageHook::every_prompt()), so
  // choice_usage's prompt_tokens is the upstream's count of the request's prompt, not a floor under it.
  bool choice_usage_every_prompt = false;
  // settle() charged a request that reported no usage the no-usage rule's estimate, held in `usage`
  // (has_usage stays false, so the log's token counts stay the upstream's, null): the log's `charged_tokens`.
  bool has_estimate = false;
  // Request body bytes (as received: before a Content-Encoding is decoded), the trace's
  // weir.request.body.size; the log's bytes_in is the connection's count (Downstream::bytes_in).
  std::uint64_t bytes_in = 0;
  bool body_deferred = false;  // the body is still on its way: read after authentication (read_body)
  bool body_decoded = false;   // the client's gzip/deflate body was decoded (read): its Content-Encoding stays here
  std::uint32_t events = 0;    // SSE data events relayed
  // The upstream's data events from the first token on ([DONE] aside; not
  // the role-only chunks before it): a stream's completion tokens when it
  // reported no usage (settle()).
  std::uint32_t token_events = 0;
  // The generated text those events (or a whole answer) carried, in decoded bytes
  // (api::event_text_bytes, api::answer_text_bytes): with token_events, what an answer without usage
  // is charged for (settle(), unreported_usage()).
  std::uint64_t completion_text_bytes = 0;
  // The bytes of a relayed event's data that are not its text, as the stream's last event counted whole had
  // them (api::event_text_bytes' `frame`; npos: none yet).
  std::size_t text_frame = std::string_view::npos;

  core::TimePoint t_start{};          // arrival: the request head's first bytes were here
  core::TimePoint t_upstream_sent{};  // request head built for upstream (the last attempt's)
  core::TimePoint t_first_byte{};     // upstream response head received
  core::TimePoint t_first_token{};    // first SSE data event handed to the client
  core::TimePoint t_upstream_done{};  // upstream response complete
  // Time spent waiting on model servers, not Weir's own: connects, each
  // attempt's wait from its request written to its response head, retry
  // backoffs, a buffered body's reads after its head, a stream's waits for
  // its next bytes, a micro-batch member's wait for its batch's head once
  // sent. The log phase takes it (and the client's waits,
  // Downstream::client_waited()) out of the request's time: added_us.
  core::Clock::duration upstream_wait{};
  std::int64_t added_us = 0;  // Weir's own time, µs: set by the log phase (docs/observability.md)

  // --- working storage, reused ---
  std::string head;     // a response or upstream request head being built
  std::string body;     // a buffered upstream body, or an error body
  std::string scratch;  // decode, framing and splice scratch
  // What `body` holds of the process's buffer budget (server.max_buffered): grown as a buffered answer is
  // read (respond_buffered), given back when the request ends (trim, reset).
  core::BufferCharge answer_charge;

  // Between requests: frees the working storage that grew past `max_bytes`
  // (a large body, a decoded answer), so an idle kept-alive connection does
  // not hold it; what stays small is kept for the next request.
  void trim(std::size_t max_bytes);

  // Records `e` as this request's error (the access log's `error`).
  void set_error(const core::Error& e) {
    has_error = true;
    error_status = e.status;
    error_source = e.source;
    if (model_refused && e.code == "model_not_found")
      error_code.assign("model_not_allowed");
    else
      error_code.assign(e.code.empty() ? e.type : e.code);
  }

  // Forgets the request; keeps every buffer's capacity. The ticket must have
  // been settled (the log phase does it).
  void reset();
};

}  // namespace weir::gateway
