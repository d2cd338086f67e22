// The gateway's phases (gateway/pipeline.hpp), one file each under
// gateway/phases/: read, authenticate, parse and route, admit, respond
// (proxy: the upstream attempts, then respond_stream or respond_buffered;
// or Weir's own endpoints), fail and log. One object per connection; all
// per-request state is in the RequestContext.
#pragma once

#include <optional>
#include <span>
#include <string>

#include "batching/batch.hpp"
#include "core/metrics.hpp"
#include "gateway/failure.hpp"
#include "gateway/pipeline.hpp"
#include "http/downstream.hpp"
#include "http/exchange.hpp"
#include "http/headers.hpp"
#include "http/sse.hpp"
#include "requestlog/queue.hpp"
#include "routing/balance.hpp"
#include "tracing/record.hpp"

namespace weir::gateway {

class Worker;

// A sampled request's spans (phases/trace.cpp), for its worker's trace
// queue: `rec` filled from `ctx` (pool and endpoint names from `cfg`, new
// child span ids from `ids`), the request span ending at `end` (steady)
// = `wall` (Unix time), `bytes_out` the response bytes sent. Copies into
// `rec`'s strings only: no allocation once they have grown.
void fill_trace_record(tracing::TraceRecord& rec, const RequestContext& ctx, const core::Config& cfg,
                       tracing::IdGenerator& ids, core::TimePoint end, std::chrono::system_clock::time_point wall,
                       std::uint64_t bytes_out);
// The upstream's target: the client's, or the OpenAI-compatible path an
// Anthropic or Responses route is translated to; for an Anthropic pool,
// Anthropic's Messages path (the Anthropic routes keep the client's, with
// its query: the SDK's ?beta=true). Static text or a view of `client_target`.
std::string_view upstream_target(RouteKind r, bool anthropic_pool, std::string_view client_target);
// The spans fill_trace_record makes for `ctx` (what a full queue drops).
std::size_t trace_span_count(const RequestContext& ctx);
// The error shape (and SDK) of `ctx`'s route: Anthropic's on its routes, under /v1/messages/, on a
// /v1/models asked with anthropic-version, and on a path Weir does not serve asked with it (/v1/files);
// OpenAI's elsewhere (phases/fail_log.cpp). Anthropic's shape comes with a request-id field.
ErrorDialect dialect_of(const RequestContext& ctx);

class GatewayPhases final : public Phases {
 public:
  // `batching`: the session may join micro-batches (pools.X.batch); false = never batched (tests).
  GatewayPhases(Worker& w, http::Downstream& down, http::UpstreamExchange& exchange, bool batching = false);
  ~GatewayPhases() override;

  core::Task<Outcome> read(RequestContext& ctx) override;
  core::Task<Outcome> authenticate(RequestContext& ctx) override;
  bool authenticate_now(RequestContext& ctx, Outcome& o) override;
  Outcome parse(RequestContext& ctx) override;
  // A body the parse phase refused (`e`): the model it names kept for the log and the metrics' label.
  Outcome refused_body(RequestContext& ctx, core::Error e);
  Outcome route(RequestContext& ctx) override;
  core::Task<Outcome> admit(RequestContext& ctx) override;
  bool admit_now(RequestContext& ctx, Outcome& o) override;
  core::Task<Outcome> respond(RequestContext& ctx) override;
  core::Task<void> fail(RequestContext& ctx, const core::Error& e) override;
  void log(RequestContext& ctx) override;

  // The client closed while `ctx` was in flight (http::Downstream::Listener):
  // aborts the upstream request at once so the model server stops
  // generating — not once the response is complete or [DONE] went out (the
  // responder then takes the body's end if it has arrived, so the connection
  // goes back to the pool, or closes it: respond_stream).
  void on_client_gone(RequestContext& ctx);
  // The drain deadline passed with `ctx` in flight, and the connection is
  // about to close: an answer not yet begun gets its 503 (drain_cut()), a
  // stream its in-band error and end, sent as far as the socket takes them
  // now; the log line then says Weir cut it. Once per request.
  void cut_for_shutdown(RequestContext& ctx);
  // Why the client connection ended under a request: server.write_timeout
  // cut it (a client that stopped reading), or the client closed it.
  ClientGone why_gone() const { return down_.timed_out() ? ClientGone::write_timeout : ClientGone::closed; }
  // After the request was logged (Session::serve): a stream that ended for
  // the client at its [DONE] before the upstream's body did (ctx.end_pending)
  // waits a short grace for the body's end (http::UpstreamExchange::await_end),
  // then its connection goes back to the pool, or is closed without it. The
  // log line and the client's response never wait for this.
  core::Task<void> take_upstream_end(RequestContext& ctx);

 private:
  // True for requests that go upstream: the API routes, and GET /v1/models
  // in quick mode (the upstream knows its models).
  bool proxied(const RequestContext& ctx) const;
  // The read phase's second half: the body within server.max_body and
  // server.body_timeout (after "100 Continue" for a client that expects it),
  // as it came (decode_body() decodes it). next(), or the failure (413, 408,
  // 400, 499).
  core::Task<Outcome> read_body(RequestContext& ctx);
  // Whether the request's host (Host, or an absolute-form target's
  // authority) is one this listener serves for its route:
  // server.allowed_hosts, or its default (client_host_rule).
  bool host_check(const RequestContext& ctx) const;
  // The 421 host_not_allowed for a request host_check() refused.
  core::Error misdirected(const RequestContext& ctx) const;
  // A CORS preflight (server.cors on, gateway/cors.hpp) on a route Weir
  // serves: 204 with the Access-Control-Allow-* fields for an allowed
  // origin, else 403 origin_not_allowed; before authentication.
  core::Task<Outcome> preflight(RequestContext& ctx);
  // A gzip or deflate body decoded in place (within server.max_body; 415 for
  // another coding, 400 for one that does not decode). After authentication
  // (parse() calls it): a request without a valid credential gets its 401
  // whatever its body holds, and Weir inflates no anonymous body.
  Outcome decode_body(RequestContext& ctx);
  // After the parse: the body's top-level string `request_id` (ctx.fields) as
  // the request's id, on the routes where vLLM reads it (chat, completions),
  // when the client sent no x-request-id field; taken as a client's
  // x-request-id is (valid_request_id, "<id>-<generated>" upstream), else the
  // generated id stays.
  void take_body_request_id(RequestContext& ctx);
  // authenticate()'s check of the credentials in the head: next() with
  // ctx.principal set (or no authentication for the route), or 401/403/503.
  // After credentials_now() returned nullopt (credentials_pending_), it goes
  // on from there: the key-set refetch or key lookup, then the final answer.
  core::Task<Outcome> check_credentials(RequestContext& ctx);
  // The check without waiting: the answer, or nullopt when it needs a
  // key-set refetch or a key lookup first (the authenticator holds which).
  std::optional<Outcome> credentials_now(RequestContext& ctx);
  // The answer for an authenticate() result (sets ctx.principal).
  Outcome accept_credentials(RequestContext& ctx, tl::expected<auth::PrincipalPtr, core::Error> p);
  // admit()'s steps before and after the limits: the token estimate (set in
  // `estimate`), the model and price checks (an answer, or nullopt to go on
  // with the limits), and the x-ratelimit-* lines and the ticket from
  // admission's result.
  std::optional<Outcome> admit_checks(RequestContext& ctx, admission::TokenEstimate& estimate);
  Outcome admit_result(RequestContext& ctx, tl::expected<admission::Ticket, core::Error> t,
                       std::chrono::steady_clock::time_point now);
  // OpenAI's x-ratelimit-* lines for the principal's limits as they stand
  // (admission's view; nothing is charged), into ctx.rate_limit_lines: set
  // by admit, and by send_own for an answer given before admission (a 400,
  // 403 or 404 of a known principal, GET /v1/models).
  void note_rate_limits(RequestContext& ctx, std::chrono::steady_clock::time_point now);
  core::Task<Outcome> serve_own(RequestContext& ctx);
  core::Task<Outcome> proxy(RequestContext& ctx);
  // The pool's admission queue (pools.X.queue): next() once the request may
  // go on (ctx.queue_pool holds its place), or the failure that sheds it
  // (429/503 overloaded, 504 deadline, 499; fail_over when a fallback is
  // left to take it instead). 400 for a bad x-weir-priority. A batchable
  // request passes its `batch_key` (and whether it would coalesce): it is
  // then also let out, without a place, when a batch it can join opens
  // (next() with no ctx.queue_pool, `stay->let_out` set). next() with no
  // place and no let_out: every endpoint's breaker is open, the attempts
  // answer at once (a fallback, or 503). `stay` carries a batching request's
  // stay across the waits proxy_batch makes: a waiter let out to a batch that
  // closed before it joined waits again within its first wait's
  // queue.timeout, not a new one.
  struct QueueStay {
    core::TimePoint since{};  // the first wait's start; {} before it
    bool let_out = false;     // the last wait ended for a batch to join
  };
  core::Task<Outcome> enter_pool(RequestContext& ctx, std::string_view batch_key = {}, bool coalesce = false,
                                 QueueStay* stay = nullptr);
  // Gives back the queue place ctx.queue_pool holds, if any, and lets the next waiter in.
  void leave_queue(RequestContext& ctx);
  // Before relaying: arms ctx.cutoff_watch at the stream's first-token
  // timeout or the request's deadline, whichever comes first. True when armed.
  // The first token is due timeouts.first_token after the request's send
  // (ctx.t_upstream_sent: a batch member's is its batch's); `first_token`
  // false arms the deadline alone (a batch member before its batch's head:
  // the window is Weir's wait, not the upstream's). `response_by`: when a
  // micro-batch member's non-streamed answer must be whole (its batch's send
  // plus timeouts.response; {} = none).
  bool arm_cutoff(RequestContext& ctx, bool first_token = true, core::TimePoint response_by = {});
  // The cutoff fired: cancels the response source when the first token is
  // late, the answer is not whole by its response timeout, or the deadline
  // passed (ctx.cutoff says which), else re-arms.
  void on_cutoff(RequestContext& ctx);
  // After the relay of an armed request: the deadline's own error for `o`, and the counts.
  Outcome after_cutoff(RequestContext& ctx, Outcome o);
  // The verdict on an answer for its endpoint's health, when it waited (ctx.verdict_pending): a
  // stream's once its first token came or it ended (`o`), and its TTFT (outlier.ttft_factor); a
  // non-streamed answer's once its body was read (`o`: responded, or failed by the upstream).
  void judge_answer(RequestContext& ctx, const Outcome& o);
  void judge_first_token(RequestContext& ctx);
  static bool stream_answered(const RequestContext& ctx);
  // The attempts on ctx.target's pool (policy: routing::Attempts) until one
  // has a response head (next()), or they fail (502/504, 499). Sets
  // ctx.fail_over when it failed in a way a fallback may take over
  // (proxy() then moves to the next target of models.X.fallbacks).
  core::Task<Outcome> attempt_pool(RequestContext& ctx);
  // Whether the request is batchable (api/openai/batch.hpp) in its pool
  // (pools.X.batch or pools.X.coalesce): true with the member's key set and
  // `plan` filled; false, having done nothing, when it is not.
  struct BatchPlan {
    std::optional<std::string_view> prompt;  // a micro-batch's member (its prompt); else a coalesced one
    bool include_usage = false;
    bool continuous_usage = false;
    bool strip_credentials = false;
  };
  bool plan_batch(RequestContext& ctx, BatchPlan& plan);
  // The request joins its micro-batch or coalesced generation (plan_batch
  // said it may); the member is then the response source. A batch or
  // generation it opens takes the queue place ctx.queue_pool holds (it is
  // one upstream request: it holds the place until its response ends).
  void join_batch(RequestContext& ctx, const BatchPlan& plan);
  // A batch member's wait for its batch's response head, then its response,
  // within the request's deadline (x-weir-timeout-ms) as an unbatched one.
  core::Task<Outcome> proxy_batched(RequestContext& ctx);
  // proxy()'s batch path, in a frame of its own (an open stream's proxy() frame does not carry its locals and
  // awaits: memory per open stream): the queue, then the batch or generation it joins. Its outcome, or nullopt
  // when the request goes on unbatched (its batch split: the same target; a failure with a fallback left: the next).
  core::Task<std::optional<Outcome>> proxy_batch(RequestContext& ctx, const BatchPlan& plan);
  core::Task<Outcome> batched_attempt(RequestContext& ctx);
  // The response from ctx.source: a stream or a buffered body.
  core::Task<Outcome> relay(RequestContext& ctx, const http::ResponseSource& src);
  // Resume mid-stream (pools.X.resume, docs/upstreams.md#resume-mid-stream).
  // Whether the stream about to be relayed (unbatched, on ctx.target's
  // pool) may be resumed: a chat-completions stream with n = 1, no
  // logprobs, an OpenAI-compatible pool with resume on. Then its chunks are
  // noted (ctx.resume.buf->tracker) and commit() keeps the request.
  bool resume_eligible(const RequestContext& ctx) const;
  // After a relay that failed (`o`): what a stream that broke after content
  // reached the client becomes. Resume: ctx.resume.buf->body is the continuation,
  // ctx.resume.active, and true is returned (proxy() runs the attempts again,
  // on another endpoint). Finish: the generation was complete or its
  // max_tokens used up, so ctx.resume.finish says how to end the stream
  // (finish_stream); true. Else false: `o` stands (the in-band error).
  bool begin_resume(RequestContext& ctx, const Outcome& o);
  // Ends a broken stream whose generation was complete: a closing chunk
  // (finish_reason "length") when `length`, then [DONE], as an unbroken stream would end.
  core::Task<Outcome> finish_stream(RequestContext& ctx, bool length);
  // One data event (not [DONE]) of a stream with resume on: a resume's
  // chunk rewritten in place (`ev` then views ctx.resume's buffers), then
  // noted. False when the event does not reach the client: the resume's
  // role chunk, or an in-band error after content (then `failure` is set).
  bool resume_note(RequestContext& ctx, http::SseEvent& ev, bool holding, http::UpstreamFailure& failure);
  // The resume's response head: a 200 event stream to continue the client's
  // stream with (else the resume failed: its attempt is ended here).
  bool resumed_stream_ok(RequestContext& ctx);
  // Waits a retry backoff `d`; returns early when the client leaves.
  core::Task<void> wait_backoff(RequestContext& ctx, std::chrono::milliseconds d);
  // A fallback target is left for this request (and the client is still there):
  // one its principal may use (may_take) whose API can carry the request (takes_request).
  bool fallback_left(const RequestContext& ctx) const;
  // Whether fallback `step` can take the request: a route its pool's API
  // serves, and a body its translation (Anthropic ↔ OpenAI) can express, as
  // prepare_upstream_body will find for it. Tried once per step and request
  // (a translation into scratch storage; only across API types).
  bool takes_request(const RequestContext& ctx, std::size_t step) const;
  // The index of the next fallback at or after `step` that may take the
  // request (both checks above); `chain` if none.
  std::size_t next_allowed(const RequestContext& ctx, std::size_t step, std::size_t chain) const;
  // Moves ctx.target to the next fallback target, and the request's price
  // (ctx.price, the ticket's) to that target's model's.
  void next_target(RequestContext& ctx);
  // ctx.reserve_price: each price the highest of the request's model's and
  // those of the {model: M} fallbacks that may answer it (within
  // x-weir-fallbacks, allowed to its principal); has_reserve_price false
  // when none is dearer. `prices` is the request's generation's.
  void reserve_for_fallbacks(RequestContext& ctx, const admission::Pricing& prices) const;
  // Completion tokens per sequence reserved for a request that gives no max_tokens (admit_checks): the most
  // any of its targets (the first and its fallbacks within x-weir-fallbacks) may generate: an Anthropic
  // pool's max_tokens sent for a chat or Responses request (its translation's, or default_answer_cap), else
  // the model's default_max_tokens or the request's min_tokens, whichever is more.
  std::uint64_t default_completion(const RequestContext& ctx) const;
  // A held stream's reset or stall before its first content, with the
  // pool's attempts left: true when the request goes again on the same pool
  // (another endpoint: ctx.pool_avoid), counted as a retry.
  bool retry_held_on_pool(RequestContext& ctx);
  // The upstream request body for ctx.target: the client's bytes with at
  // most two members spliced, or its translation for the target's API (an
  // Anthropic pool: api/anthropic/upstream_request.hpp; an Anthropic route
  // to an OpenAI-compatible pool whose chat translation parse left to do).
  // Returns why this target cannot take the request (a 400: a route or a
  // field its API does not have), nullopt when the body is ready.
  std::optional<core::Error> prepare_upstream_body(RequestContext& ctx);
  // The target's pool speaks Anthropic's Messages API (pools.X.type: anthropic).
  bool anthropic_pool(const RequestContext& ctx) const;
  // The 400 for a route an Anthropic pool does not serve (completions, embeddings, vLLM's routes, audio).
  core::Error not_served_by_anthropic(const RequestContext& ctx) const;
  // Chat completions (the client's body, or a Responses request's chat
  // translation) → the Anthropic Messages body for ctx.target, in
  // ctx.upstream_body_buf. Returns the 400 for what Anthropic cannot express.
  // ctx.anthropic_max_tokens is the max_tokens it sent.
  std::optional<core::Error> translate_for_anthropic(RequestContext& ctx);
  // The same translation for pool `pool` (its anthropic.max_tokens) and
  // model name `upstream_model` (empty: the client's), into `out`; the 400
  // names the Responses request's fields for a Responses client. `max_tokens_sent` (when not null): the
  // max_tokens the translation sent.
  std::optional<core::Error> chat_to_anthropic(const RequestContext& ctx, std::size_t pool,
                                               std::string_view upstream_model, std::string& out,
                                               std::uint64_t* max_tokens_sent = nullptr) const;
  // An Anthropic route's request (Messages or count_tokens) → its chat
  // translation for an OpenAI-compatible pool, into `out`; the 400 for what
  // the translation cannot express.
  std::optional<core::Error> anthropic_to_chat(const RequestContext& ctx, std::string& out,
                                               bool continuous_usage = false) const;
  // A Responses request → its chat translation for an OpenAI-compatible pool whose continuous_usage is
  // `vllm` (self-hosted or hosted: api/responses/request.hpp), into `out`; the 400 for what it cannot carry
  // there (a reasoning effort vLLM does not take).
  std::optional<core::Error> responses_to_chat(std::string& out, bool vllm) const;
  // The stream hooks for the stream about to be relayed: the client's
  // dialect (route) and the upstream's (ctx.target's pool).
  void reset_stream_hooks(RequestContext& ctx);
  void prepare_audio_body(RequestContext& ctx);
  // What the pool's endpoint choice may see of the request (views into
  // ctx.upstream_body and the request head): the session header's value
  // when pc.session_header is set; the model and the prompt's JSON text
  // (`messages`, `prompt`) for balance: prefix_affinity. Nothing is copied.
  routing::PickRequest pick_request(const RequestContext& ctx, const core::PoolConfig& pc) const;
  core::Task<Outcome> respond_stream(RequestContext& ctx);
  // What a stream being relayed keeps from one upstream read to the next.
  // (respond_stream's frame lives as long as the stream and a GCC 12 frame
  // holds every local of the coroutine: the work between two reads is done
  // in plain functions, whose locals are on the stack.)
  struct StreamRelay {
    http::ResponseSource* src = nullptr;  // ctx.source as the stream began
    http::Exchange* direct = nullptr;     // src, when it is a direct exchange: read in steps (respond_stream)
    std::span<char> into;                 // the worker's body buffer each read lands in
    std::string* events = nullptr;        // the worker's buffer for one read's events
    core::Histogram* itl = nullptr;       // the model's inter-token latency
    core::TimePoint last_event{};         // the previous data event relayed (none yet: epoch)
    core::TimePoint wait_from{};          // the current read's wait for the upstream began (none: epoch)
    http::UpstreamFailure failure = http::UpstreamFailure::none;
    bool holding = false;   // the head waits for the first content event
    bool last_sent = true;  // the reader's last event went to the client (SseEvent::lf_carried)
    bool cut_off = false;   // the client did not keep up (server.max_stream_buffer)
    // Over server.max_stream_buffer: the bytes the client had taken when it last took some, and since when.
    std::uint64_t out_when_over = ~std::uint64_t{0};
    core::TimePoint over_since{};
    bool error_relayed = false;    // the upstream's in-band error event went into this read's events
    bool refused = false;          // that error refuses the client's request (api::openai::refuses_request)
    bool event_too_large = false;  // an upstream event passed server.max_event
    bool utf8_held = false;        // the reader holds bytes of a read that had a non-ASCII byte
    // The client is behind by more than server.max_stream_buffer: the next upstream read waits (catch_up,
    // in read_rest's task: respond_stream's frame, which every open stream holds, has no await of its own
    // for it).
    bool behind = false;
  };
  // The error a stream that broke ends with (before its head went out, or after: `mid_stream`).
  core::Error stream_failure(const RequestContext& ctx, const StreamRelay& s, http::UpstreamFailure failure,
                             bool incomplete, bool mid_stream) const;
  // The stream ends at the upstream's in-band error event, which the client has (relay_read).
  static void error_relayed(StreamRelay& s);
  // Counts the stream and sends the client's head unless it is held.
  StreamRelay begin_stream(RequestContext& ctx);
  // A read respond_stream does not step through: s.src's own read(), or
  // the direct exchange's from `step` (a TLS read, a yield); a client
  // behind (s.behind): read_caught_up.
  core::Task<http::BodyRead> read_rest(RequestContext& ctx, StreamRelay& s, http::Exchange::Step step);
  // catch_up, then the direct exchange's read; nothing read (an empty BodyRead) when catch_up said no.
  core::Task<http::BodyRead> read_caught_up(RequestContext& ctx, StreamRelay& s);
  // The client's head (the commit point): status, `src`'s fields, ours.
  void send_stream_head(RequestContext& ctx, http::ResponseSource& src);
  // Relays read `r`'s events; returns false when the stream ends here (its
  // end or its [DONE], a failure in s.failure, a slow client in s.cut_off,
  // a client gone).
  bool relay_read(RequestContext& ctx, StreamRelay& s, const http::BodyRead& r);
  // A stream of the session's own upstream whose client is behind (s.behind): reads nothing more from the
  // upstream until the client's backlog is back within server.max_stream_buffer, so TCP holds the model
  // server back instead of Weir's memory filling at the upstream's pace. True to read on (also when the
  // request's cutoff cancelled the source: the read says so); false when the client left, or took nothing
  // for server.write_timeout (the stall watch's cut: s.cut_off, a slow client). Its wait is the client's
  // time (Downstream::client_waited()), and no inter-token latency. (A coroutine of its own: its timer is
  // in no stream's frame.)
  core::Task<bool> catch_up(RequestContext& ctx, StreamRelay& s);
  // Whether a batch member's client, over the bound, has taken nothing for kSlowClientGrace
  // (s.out_when_over and s.over_since follow its progress; one getsockopt).
  bool over_client_bound(StreamRelay& s);
  // After the last read: the outcome, or next() when the stream ended well
  // and only the upstream's end (after a [DONE]) and the client's queue are left.
  Outcome end_stream(RequestContext& ctx, StreamRelay& s);
  // The stream being relayed is complete only at the upstream's `data: [DONE]`:
  // an OpenAI chat or completions stream passed through (not translated).
  bool done_expected(const RequestContext& ctx) const;
  core::Task<Outcome> respond_buffered(RequestContext& ctx);
  // The commit point: the first byte of the response goes to the client's
  // queue. Nothing can be retried after it, so the request body goes back to
  // the worker here.
  void commit(RequestContext& ctx);
  // A whole response Weir built: `extra_lines` are whole header lines.
  struct OwnResponse {
    int status = 200;
    std::string_view content_type;
    std::string_view body;
    std::string_view extra_lines;
  };
  // Writes `r` (HEAD: without the body); a failed write makes the request a 499.
  // (The response goes by reference: GCC 12 miscopies coroutine parameters
  // passed on the stack.)
  core::Task<void> send_own(RequestContext& ctx, const OwnResponse& r);
  // On an answer in Anthropic's shape (dialect_of: /v1/messages, count_tokens, the model list asked with
  // anthropic-version, ...): appends "request-id: <ctx.request_id>" to ctx.head, the header the anthropic SDK
  // reads for a message's or an error's request id (an Anthropic pool's own
  // is dropped: http::append_response_fields).
  void append_anthropic_request_id(RequestContext& ctx);
  void settle(RequestContext& ctx);
  // What a request is charged when its upstream reported no usage of the whole request (settle(): the rule
  // in words there): the prompt as estimated (an Anthropic stream's message_start count when it came), one
  // completion token per content event relayed (at most completion_cap), each raised to the choices' own
  // counts when the stream carried some (RequestContext::choice_usage); the prompt is the choices' count
  // itself once every prompt of the request said it (RequestContext::choice_usage_every_prompt).
  api::Usage unreported_usage(const RequestContext& ctx) const;
  // The same with `choice_usage` (null: none) for the choices' counts and `every_prompt` for whether they
  // said every prompt's: a stream's, read before end_stream() copied them into the context.
  api::Usage unreported_usage(const RequestContext& ctx, const api::Usage* choice_usage, bool every_prompt) const;
  // What settle() makes the usage of a stream whose upstream's usage came only on its choices' chunks, if it
  // fails now: charged (and logged) as a stream cut short, or nothing (nullopt). A Responses stream's
  // response.failed says it (api::responses::FailedUsage).
  std::optional<api::Usage> failed_charge(const RequestContext& ctx) const;
  // Who failed upstream, for error messages (gateway/failure.hpp).
  UpstreamSubject subject(const RequestContext& ctx) const;
  // upstream_error(f) for the request's pool, not mid-stream: a non-streamed request's timeout (`f` timeout,
  // the request sent whole) on a pool whose retry.response_timeout is false is sent with `x-should-retry:
  // false`: the generation may still be running, and the client's SDK would start it over as a retry here would.
  core::Error attempt_error(const RequestContext& ctx, http::UpstreamFailure f) const;
  // The Host sent to the request's current endpoint (http::append_response_fields), empty without one.
  std::string_view upstream_host(const RequestContext& ctx) const;
  // weir_upstream_failures_total for the request's current endpoint.
  void count_upstream_failure(RequestContext& ctx, http::UpstreamFailure f);
  // A 2xx answer Weir cannot read (no whole object, a coding it cannot
  // decode, a translation that fails): counted as an invalid response on the
  // attempt and the endpoint, failed over while a fallback is left, else
  // Weir's own 502 `e`, with no usage.
  Outcome no_answer(RequestContext& ctx, core::Error e);
  // no_answer() with upstream_untranslatable: the answer is not `expected`.
  Outcome untranslatable(RequestContext& ctx, std::string_view expected) {
    return no_answer(ctx, upstream_untranslatable(subject(ctx), expected));
  }
  // The access-log line (when the access log is on) and the request-log
  // store's record (request_log:), one formatting for both. Returns the
  // request's end, which it reads (request_end()) as it reaches its timing fields.
  core::TimePoint write_access_log(RequestContext& ctx);
  // The request's end (one clock read), and ctx.added_us as of then.
  core::TimePoint request_end(RequestContext& ctx);
  // Tracing (phases/trace.cpp). Whether requests of route `r` are traced
  // (not /metrics, /health, /ready).
  static bool traced(RouteKind r);
  // The request's trace context: the caller's traceparent (continued when
  // valid, ignored otherwise) and tracestate, or a new trace; the sampling
  // decision (parent-based, else tracing.sample_ratio).
  void begin_trace(RequestContext& ctx);
  // A new span id for the upstream attempt about to start, and the
  // traceparent it sends (ctx.trace->traceparent).
  void begin_attempt_trace(RequestContext& ctx);
  // A sampled request's spans into the worker's trace queue (or counted
  // dropped when it is full); `end` is the end of the request span.
  void push_trace(RequestContext& ctx, core::TimePoint end);
  // Body capture (phases/capture.cpp, request_log.capture_bodies): after
  // authentication, for a tenant that opted in, the request body's first
  // bytes (its credential redacted) and ctx.capture on; then each piece of
  // the response as it goes to the client (nothing without ctx.capture);
  // at the end, the credential redacted from the response too (a model that
  // repeats a key it was shown).
  void begin_capture(RequestContext& ctx);
  void capture_response(RequestContext& ctx, std::string_view bytes);
  void end_capture(RequestContext& ctx);
  // Copies the record into the worker's queue, or counts it dropped when full.
  // `budget`: the captured bytes the queue may hold (null: no capture).
  static void push_record(requestlog::RecordQueue& q, requestlog::BodyBudget* budget, const RequestContext& ctx,
                          std::chrono::system_clock::time_point wall, std::string_view line);

  Worker& w_;
  http::Downstream& down_;
  http::UpstreamExchange& exchange_;
  // take_upstream_end(): where the exchange's connection goes back to.
  std::shared_ptr<WorkerGeneration> end_gen_;
  std::uint32_t end_pool_ = 0;
  std::uint32_t end_ep_ = 0;
  bool batching_;
  // credentials_now() stopped at a wait that check_credentials() takes on.
  bool credentials_pending_ = false;
  // The session's micro-batch seat, made when its first request reaches a
  // batching pool: other sessions carry a null pointer, not ~570 bytes.
  std::unique_ptr<batching::BatchMember> member_;
  // The request's failed_charge() for its Responses stream translator (StreamHooks::Setup::failed_usage).
  struct FailedCharge final : api::responses::FailedUsage {
    const GatewayPhases* phases = nullptr;
    const RequestContext* ctx = nullptr;
    std::optional<api::Usage> failed_usage() const override { return phases->failed_charge(*ctx); }
  };
  FailedCharge failed_charge_;
};

}  // namespace weir::gateway
