// The respond phase for proxied requests: the upstream request
// (upstream_body.cpp), the attempt loop over the pool's endpoints (policy in
// routing::Attempts), then the response as a stream or a buffered body. Nothing is retried once a byte reached the
// client (the commit point). The pool's admission queue is queue.cpp's; the fallback chain, fallback.cpp's; the
// first-token and deadline cutoff, cutoff.cpp's; an answer's verdict for its endpoint's health, verdict.cpp's.
#include <algorithm>
#include <optional>
#include <utility>

#include <boost/beast/http/field.hpp>
#include <boost/beast/http/verb.hpp>

#include <ctime>

#include <fmt/format.h>

#include "api/json_scan.hpp"
#include "core/json_text.hpp"
#include "core/text.hpp"
#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"
#include "http/sse.hpp"
#include "routing/attempts.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;

namespace {
// Time left before `deadline` (none: `d` unchanged): `d` or less, never below 1 ms.
std::chrono::milliseconds within(std::chrono::milliseconds d, core::TimePoint deadline, core::TimePoint now) {
  if (deadline == core::TimePoint{}) return d;
  // Rounded up: a timeout the deadline capped fires at or past it, so it is seen as the deadline's.
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
  return std::max(std::chrono::milliseconds(1), std::min(d, left));
}
}  // namespace

// Not a coroutine: the task it returns is the phase's, so a stream holds
// no frame for this dispatch.
core::Task<Outcome> GatewayPhases::respond(RequestContext& ctx) { return proxied(ctx) ? proxy(ctx) : serve_own(ctx); }

void GatewayPhases::reset_stream_hooks(RequestContext& ctx) {
  const bool anthropic = anthropic_pool(ctx);
  failed_charge_ = {};
  failed_charge_.phases = this;
  failed_charge_.ctx = &ctx;
  ctx.hooks.reset(StreamHooks::Setup{
      .strip_usage = ctx.strip_usage,
      .choices_per_prompt = ctx.fields.n,
      .prompts = ctx.fields.prompt_count,
      .client = is_anthropic(ctx.route)   ? Translation::anthropic
                : is_responses(ctx.route) ? Translation::responses
                                          : Translation::none,
      .upstream = anthropic ? UpstreamDialect::anthropic : UpstreamDialect::openai,
      .include_usage = ctx.fields.usage_asked,
      .created = anthropic ? static_cast<std::int64_t>(std::time(nullptr)) : 0,
      .echo = ctx.responses_echo(),
      .request_id = ctx.upstream_id(),
      .model = ctx.model,
      .held_limit = static_cast<std::size_t>(ctx.gen->config().server.max_response_bytes),
      .thinking = ctx.fields.thinking,
      .failed_usage = &failed_charge_,
  });
}

void GatewayPhases::on_client_gone(RequestContext& ctx) {
  if (ctx.source && !ctx.source->done() && !ctx.hooks.done_relayed()) ctx.source->cancel();
  if (ctx.backoff) ctx.backoff->cancel();
}

void GatewayPhases::commit(RequestContext& ctx) {
  if (ctx.committed) return;
  ctx.committed = true;
  if (ctx.resume.on) {
    // A stream that may resume keeps its request: a continuation is built
    // from the body it sent and goes with the client's head fields.
    ctx.resume.original = ctx.upstream_body;
    return;
  }
  // The request cannot be sent again: its storage goes back to the worker,
  // so a long stream does not hold it.
  ctx.upstream_body = {};
  w_.give_buffer(down_.body());
  w_.give_buffer(ctx.upstream_body_buf);
  w_.give_buffer(ctx.edit_buf);
}

core::Task<Outcome> GatewayPhases::relay(RequestContext& ctx, const http::ResponseSource& src) {
  const auto& head = src.head();
  // Streams are asked for in identity; events cannot be read out of
  // compressed bytes, so a stream compressed anyway is relayed whole, as a
  // buffered body (decoded for a client that did not accept the encoding).
  const bool encoded = !http::content_codings(head).empty();  // (every Content-Encoding line)
  // A client that did not ask for a stream, on a route whose answer is one
  // JSON object (OpenAI's and Anthropic's APIs never stream to it): an event
  // stream is no answer it can read (an SDK would hand its user the events'
  // text). It is read whole, and refused there (respond_buffered: a fallback
  // takes the request, else 502 upstream_invalid_response).
  // (Every API route of an Anthropic pool: a message, a token count, or one translated from them.)
  // (vLLM's own JSON routes too, tokenize … classify, and a transcription not asked to stream: its JSON,
  // text, srt or vtt.)
  const bool object_only =
      !ctx.fields.stream &&
      (anthropic_pool(ctx) ? api_of(ctx.route).has_value()
                           : ctx.route == RouteKind::chat_completions || ctx.route == RouteKind::completions ||
                                 ctx.route == RouteKind::embeddings || is_vllm_extra(ctx.route) ||
                                 is_audio(ctx.route) || is_translated(ctx.route));
  const bool stream = ctx.upstream_status == 200 &&
                      http::is_event_stream(http::first_field(head, bh::field::content_type)) && !src.done() &&
                      !encoded && !object_only;
  // With a fallback left, or another attempt left on the pool (retry.attempts) for a stream sent alone that
  // cannot resume (pools.X.resume sends it again after its head instead: begin_resume; a micro-batch member's
  // generation is shared), a stream's head waits for its first content event: until then it can still go
  // again (retry_held_on_pool, next_target), with nothing sent twice.
  ctx.hold_head = stream && !ctx.committed &&
                  (fallback_left(ctx) || (!ctx.resume.on && ctx.batch_size == 0 && !down_.client_gone() &&
                                          ctx.pool_tries < ctx.gen->config().pools[ctx.target.pool].retry.attempts));
  // An upstream may stream to a client that did not ask for it: the answer
  // is a stream all the same, and a failure after its head ends it in-band
  // (error event, [DONE], the chunked body's end), as for a streamed request.
  if (stream) ctx.stream = true;
  if (stream) return respond_stream(ctx);
  return respond_buffered(ctx);
}

routing::PickRequest GatewayPhases::pick_request(const RequestContext& ctx, const core::PoolConfig& pc) const {
  routing::PickRequest r;
  if (!pc.session_header.empty()) {
    const auto v = http::first_field(down_.request(), pc.session_header);
    r.session = std::string_view(v.data(), v.size());
  }
  if (pc.balance != core::Balance::prefix_affinity) return r;
  r.model = ctx.target.upstream_model.empty() ? std::string_view(ctx.model) : ctx.target.upstream_model;
  // The prompt as sent upstream, unparsed: the JSON text of its member (a
  // view into the body; the same text renders to the same bytes, so its
  // blocks hash alike across requests).
  const char* member = nullptr;
  switch (ctx.route) {
    case RouteKind::chat_completions:
    case RouteKind::messages:  // translated to a chat completion upstream
    case RouteKind::responses:
      member = "messages";
      break;
    case RouteKind::completions:
      member = "prompt";
      break;
    default:
      return r;
  }
  if (auto span = api::find_member(ctx.upstream_body, member))
    r.prompt = ctx.upstream_body.substr(span->value_begin, span->value_end - span->value_begin);
  return r;
}

core::Task<Outcome> GatewayPhases::proxy(RequestContext& ctx) {
  // The client may leave while we wait on the upstream: watch for it.
  down_.watch_for_close(/*release_buffer=*/ctx.stream);
  // A queue place this request holds goes back whatever ends the request (a throw included; a batch member
  // whose client left as it was let out of the queue too: that place was lost for good).
  struct QueueRelease {
    GatewayPhases& self;
    RequestContext& ctx;
    ~QueueRelease() { self.leave_queue(ctx); }
  } release{*this, ctx};
  if (BatchPlan plan; plan_batch(ctx, plan)) {
    std::optional<Outcome> batched = co_await proxy_batch(ctx, plan);
    if (batched) co_return std::move(*batched);
  }
  // One pass per target: the route's pool, then each fallback while the
  // previous one failed before anything reached the client (ctx.fail_over,
  // set by the attempts or by a held stream).
  // A stream that broke, while its resume is tried: what the client gets if the resume fails.
  std::optional<Outcome> broken;
  for (;;) {
    // The pool's admission queue (pools.X.queue), then the attempts, in
    // their own frames, gone once the response head is in: a long stream
    // holds only this small one and the responder's. (A resume does not
    // queue again: its stream was admitted, and its client is waiting mid-message.)
    // (No co_await inside a conditional expression: GCC 12 destroys its result too early.)
    Outcome o = Outcome::next();
    if (!ctx.resume.active && ctx.gen->pool(ctx.target.pool).queue()) o = co_await enter_pool(ctx);
    if (o.goes_on()) o = co_await attempt_pool(ctx);
    if (!o.goes_on()) {
      leave_queue(ctx);
      if (ctx.resume.active) {
        // No endpoint took the continuation: the stream ends as it would have without resume
        // (or the client left meanwhile: its 499).
        ctx.fail_over = false;
        if (down_.client_gone()) co_return o;
        co_return std::move(*broken);
      }
      if (ctx.fail_over && fallback_left(ctx)) {
        ctx.fail_over = false;
        next_target(ctx);
        continue;
      }
      co_return o;
    }
    if (ctx.resume.active) {
      if (!resumed_stream_ok(ctx)) {
        leave_queue(ctx);
        co_return std::move(*broken);
      }
      ++w_.metrics().upstream_resumes;
    } else if ((ctx.resume.on = resume_eligible(ctx))) {
      const std::uint64_t max = ctx.fields.max_tokens;
      if (!ctx.resume.buf) ctx.resume.buf = std::make_unique<RequestContext::Resume::Buffers>();
      ctx.resume.buf->tracker.reset(max > 0 ? std::min<std::uint64_t>(max * 8, 64 * 1024) : 4096);
    }
    const bool cutoff = arm_cutoff(ctx);
    o = co_await relay(ctx, exchange_);
    auto& pool = ctx.gen->pool(ctx.target.pool);
    const auto ep = static_cast<std::uint32_t>(ctx.endpoint);
    if (cutoff) o = after_cutoff(ctx, std::move(o));
    if (ctx.verdict_pending || ctx.judged_good) judge_answer(ctx, o);
    pool.on_finish(ep);
    ctx.source = nullptr;
    // Keep the connection only after a complete, keep-alive response (one
    // whose body's end is still to come: take_upstream_end, after the log).
    if (ctx.end_pending) {
      end_gen_ = ctx.gen;  // the log phase lets go of ctx.gen
      end_pool_ = ctx.target.pool;
      end_ep_ = ep;
    } else if (auto c = exchange_.release()) {
      ++c->uses;
      pool.endpoint(ep).conns.put(std::move(c), core::now());
    }
    if (ctx.fail_over && retry_held_on_pool(ctx)) {
      ctx.fail_over = false;  // the same target, another endpoint (queued again)
      leave_queue(ctx);
      continue;
    }
    if (ctx.fail_over && fallback_left(ctx)) {
      ctx.fail_over = false;
      leave_queue(ctx);
      next_target(ctx);
      continue;
    }
    // A resume keeps the place its stream had: the continuation is in flight on the same pool (it does not
    // queue again), so the pool's max_concurrent still counts it.
    if (ctx.resume.wanted && begin_resume(ctx, o)) {
      if (ctx.resume.finish != RequestContext::Resume::Finish::none) {
        Outcome f = co_await finish_stream(ctx, ctx.resume.finish == RequestContext::Resume::Finish::length);
        co_return f;
      }
      broken.emplace(std::move(o));
      continue;
    }
    co_return o;
  }
}

core::Task<std::optional<Outcome>> GatewayPhases::proxy_batch(RequestContext& ctx, const BatchPlan& plan) {
  // A request that would open a batch or a generation (one upstream
  // request) waits in the pool's queue as an unbatched one does; one that
  // joins an open one rides on its place. (It may find one open after
  // waiting: join_batch then gives its place back.)
  // A request waiting in the queue is let out when a batch it can join
  // opens (release_joiners); if that one is closed by the time it looks
  // (full, its window over), it waits again.
  auto& pool = ctx.gen->pool(ctx.target.pool);
  auto* batcher = ctx.gen->batcher(ctx.target.pool);
  // It stops waiting with a place, a batch to join, a failure, or no wait at all (every endpoint's breaker
  // open: the batch's attempts answer at once, as unbatched; looping on that would spin the worker).
  Outcome q = Outcome::next();
  QueueStay stay;
  while (pool.queue() && ctx.queue_pool < 0 && !batcher->joinable(member_->key(), !plan.prompt)) {
    stay.let_out = false;
    q = co_await enter_pool(ctx, member_->key(), !plan.prompt, &stay);
    if (!q.goes_on() || !stay.let_out) break;
  }
  if (!q.goes_on()) {
    if (!(ctx.fail_over && fallback_left(ctx))) co_return std::optional<Outcome>(std::move(q));
    ctx.fail_over = false;
    leave_queue(ctx);  // (this pool's place, if it had one: the fallback's queue is another)
    next_target(ctx);
    co_return std::nullopt;
  }
  join_batch(ctx, plan);
  Outcome o = co_await proxy_batched(ctx);
  // A batch the upstream refused whole: this request goes on its own (proxy(), same target).
  if (ctx.batch_split) co_return std::nullopt;
  // A batch that failed before its head may still fall back (unbatched, on the next target).
  if (!(ctx.fail_over && fallback_left(ctx))) co_return std::optional<Outcome>(std::move(o));
  ctx.fail_over = false;
  leave_queue(ctx);
  next_target(ctx);
  co_return std::nullopt;
}

core::Task<void> GatewayPhases::wait_backoff(RequestContext& ctx, std::chrono::milliseconds d) {
  if (d.count() <= 0) co_return;
  core::Timer timer(w_.io().get_executor());
  const auto from = core::now();
  timer.expires_at(from + d);
  ctx.backoff = &timer;  // on_client_gone cancels it
  co_await timer.async_wait(core::use_task);
  ctx.backoff = nullptr;
  // A wait for the endpoints to recover (their 429, 503, a reset): not Weir's own time (added_us).
  ctx.upstream_wait += core::now() - from;
}

core::Task<Outcome> GatewayPhases::attempt_pool(RequestContext& ctx) {
  auto& metrics = w_.metrics();
  const auto& req = down_.request();
  if (auto e = prepare_upstream_body(ctx)) {
    // This target cannot take the request (a route or a field its API does
    // not have): the next fallback may; else the client gets why. (A
    // fallback is gone to only when takes_request() said it can: this is a
    // primary that route() let through for a fallback.) Not an attempt, nor a retry: nothing was sent.
    ctx.fail_over = true;
    ctx.target_refused = true;
    co_return Outcome::failed(std::move(*e));
  }
  auto& gen = *ctx.gen;
  auto& pool = gen.pool(ctx.target.pool);
  const auto& pc = pool.config();
  // HEAD of the upstream's model list: its GET, whose filtered answer's fields (Content-Length, a 404) the
  // HEAD gets (RFC 9110 §9.3.2), without its body (respond_buffered).
  const bool list_head = ctx.route == RouteKind::models && req.method() == bh::verb::head;
  const bool head_request = req.method() == bh::verb::head && !list_head;
  const bool anthropic = pc.type == core::UpstreamType::anthropic;
  ctx.source = &exchange_;

  auto now = core::now();
  if (core::passed(ctx.deadline, now)) {
    ctx.source = nullptr;
    ++metrics.deadline_exceeded;
    co_return Outcome::failed(deadline_exceeded(subject(ctx), ctx.deadline_ms));
  }
  const bool resuming = ctx.resume.active;
  // A resume never goes back to an endpoint whose stream broke, nor does a
  // held stream's retry (retry_held_on_pool), nor to one that failed this
  // request before (pool_failed), and each holds a retry-budget slot.
  const bool held_retry = !resuming && !ctx.pool_avoid.empty();
  routing::EndpointSet avoid;  // (allocates only for endpoints from 64 on)
  if (resuming || held_retry) {
    avoid = resuming ? ctx.resume.broke : ctx.pool_avoid;
    avoid |= ctx.pool_failed;
  }
  routing::Attempts attempts = !avoid.empty() ? routing::Attempts(pool, w_.rng(), now, pick_request(ctx, pc), avoid)
                                              : routing::Attempts(pool, w_.rng(), now, pick_request(ctx, pc));
  if (held_retry) {
    const auto held = std::exchange(ctx.held_failure, http::UpstreamFailure::none);
    if (attempts.unavailable()) {
      // No other endpoint (or no budget) for the held stream's retry: a fallback takes it, as without one.
      if (attempts.budget_refused()) ++metrics.retry_budget_exhausted;
      ctx.source = nullptr;
      ctx.fail_over = !down_.client_gone();
      co_return Outcome::failed(upstream_error(held, subject(ctx), false));
    }
    ++ctx.retries;
    metrics.count_retry(held == http::UpstreamFailure::reset ? routing::RetryReason::reset
                                                             : routing::RetryReason::timeout);
  }
  if (resuming && attempts.unavailable()) {
    // No other endpoint (or no budget) for the continuation: the broken stream's error stands (proxy), and
    // the resume begin_resume counted was never sent: no retry.
    if (attempts.budget_refused()) ++metrics.retry_budget_exhausted;
    if (ctx.retries > 0) --ctx.retries;
    ctx.source = nullptr;
    ctx.fail_over = false;
    co_return Outcome::failed(pool_unavailable(subject(ctx), pool.unavailable_for(now)));
  }
  if (attempts.unavailable()) {
    // Every endpoint's breaker is open: the next fallback, or 503 until the first turns half-open.
    ctx.source = nullptr;
    ctx.endpoint = -1;
    ++metrics.pool_unavailable(gen.pool_slot(ctx.target.pool));
    ctx.record_attempt(
        {.pool = static_cast<std::int16_t>(ctx.target.pool), .failure = http::UpstreamFailure::breaker_open});
    ctx.fail_over = !down_.client_gone();
    co_return Outcome::failed(pool_unavailable(subject(ctx), pool.unavailable_for(now)));
  }
  // Each request's first pick on a pool (docs/routing.md): not a held stream's retry there, nor a resume.
  if (avoid.empty()) metrics.count_pick(pool.last_rule());
  // The waits on the endpoints (a connect, an answer's head, a retry's backoff) go into ctx.upstream_wait:
  // no time of Weir's (added_us), measured with the clock reads the attempts take anyway.
  http::UpstreamFailure failure = http::UpstreamFailure::none;
  bool started = false;
  bool deadline_hit = false;  // the request's deadline ended the attempts
  const std::uint32_t retries_before = ctx.retries;
  std::uint32_t unsent = 0;  // the last retry decided was not sent
  int last_status = 0;
  // A retry whose backoff would end past the request's deadline is not made
  // (not counted either): the attempts on this pool are then spent, and the
  // last answer goes to the client, or the next fallback takes the request.
  // Only a deadline that has passed is the client's 504 deadline_exceeded.
  const auto cancel_late_retry = [&](routing::RetryDecision& d) {
    if (d.retry && core::passed(ctx.deadline, core::now() + d.delay)) {
      d.retry = false;
      unsent = 1;
    }
  };
  auto record = [&](std::uint32_t ep, int status, http::UpstreamFailure f, core::TimePoint since, core::TimePoint until,
                    bool stale = false) {
    ctx.attempt_since = since;
    ctx.record_attempt({.pool = static_cast<std::int16_t>(ctx.target.pool),
                        .endpoint = static_cast<std::int16_t>(ep),
                        .status = static_cast<std::int16_t>(status),
                        .failure = f,
                        .us = static_cast<std::uint32_t>(core::micros_between(since, until)),
                        .resume = resuming,
                        .stale = stale});
  };
  // A non-streamed answer's head comes (from vLLM) only when its generation
  // is done: that wait is the generation's, bounded by timeouts.response;
  // a stream's head comes at once, and first_byte bounds the queueing.
  const auto head_wait = ctx.stream ? pc.timeouts.first_byte : pc.timeouts.response;
  // The attempt's start: the first one's is `now` (read above). Its answer's head: t_answered.
  core::TimePoint t_try = now;
  core::TimePoint t_answered{};
  for (bool first_try = true;; first_try = false) {
    if (!first_try) t_try = core::now();
    const std::uint32_t ep_idx = attempts.endpoint();
    auto& ep = pool.endpoint(ep_idx);
    ctx.endpoint = static_cast<int>(ep_idx);
    metrics.count_attempt_at(gen.endpoint_slot(ctx.target.pool, ep_idx));
    auto pooled = attempts.fresh_only() ? nullptr : ep.conns.take(t_try);
    const bool reused = pooled != nullptr;
    if (reused) {
      exchange_.use(std::move(pooled));
    } else {
      const auto t_connect = t_try;
      failure = co_await routing::connect_endpoint(exchange_, ep, within(pc.timeouts.connect, ctx.deadline, t_connect));
      const auto t_connected = core::now();
      ctx.upstream_wait += t_connected - t_connect;  // (the endpoint's accept, a TLS handshake: not Weir's time)
      // Connections opened: one that failed counts in weir_upstream_failures_total instead.
      if (failure == http::UpstreamFailure::none) ++metrics.upstream_connects;
      if (down_.client_gone()) break;
      if (failure != http::UpstreamFailure::none && core::passed(ctx.deadline, t_connected)) {
        record(ep_idx, 0, failure, t_connect, t_connected);
        deadline_hit = true;  // the request's own deadline, not the endpoint's fault
        break;
      }
      if (failure != http::UpstreamFailure::none) {
        if (failure == http::UpstreamFailure::tls)
          routing::log_tls_failure(ep, pc.name, exchange_.connect_error(), t_connected);
        metrics.count_upstream_failure_at(gen.endpoint_slot(ctx.target.pool, ep_idx), failure);
        record(ep_idx, 0, failure, t_connect, t_connected);
        if (attempts.on_connect_failure(failure, t_connected)) {
          metrics.count_retry(routing::RetryReason::connect);
          continue;
        }
        break;
      }
      attempts.on_connected();
    }
    pool.on_start(ep_idx);
    if (ctx.head.capacity() <= sizeof(std::string)) ctx.head = w_.take_buffer();  // a stream gave it back
    ctx.head.clear();
    // W3C Trace Context upstream: the request's trace, a new span id per attempt.
    if (ctx.trace_on()) begin_attempt_trace(ctx);
    http::append_upstream_request_head(
        ctx.head, req,
        http::UpstreamHeadOptions{
            .method = list_head ? std::string_view("GET") : std::string_view(),
            .target = upstream_target(ctx.route, anthropic, down_.target()),
            .base_path = ep.cfg->base_path,
            .base_query = ep.cfg->query,
            .host_header = ep.cfg->host_header,
            .body_bytes = ctx.upstream_body.size(),
            .request_id = ctx.next_attempt_id(),
            .upstream_lines = pc.upstream_lines,
            .identity = ctx.stream,
            // The client's credential is for Weir when Weir authenticates, or
            // replaced by the pool's key: either way it never reaches the model
            // server. A hosted Anthropic API never gets the client's.
            .strip_credentials = anthropic || !pc.api_key.empty() || w_.verifies_credentials(),
            .anthropic = anthropic,
            .body_decoded = ctx.body_decoded,
            .traceparent = ctx.trace_on() ? ctx.trace->traceparent_view() : std::string_view(),
            .tracestate = ctx.trace_on() ? std::string_view(ctx.trace->tracestate) : std::string_view(),
            .client_address = down_.peer_address(),
            .real_ip = down_.client_address(),
            .trusted_peer = down_.peer_trusted(),
        });
    ctx.t_upstream_sent = core::now();
    ctx.sent_alone = true;
    failure = co_await exchange_.start({.head = ctx.head,
                                        .body = ctx.upstream_body,
                                        .head_request = head_request,
                                        .first_byte = within(head_wait, ctx.deadline, ctx.t_upstream_sent),
                                        .idle = within(pc.timeouts.idle, ctx.deadline, ctx.t_upstream_sent),
                                        .sent_at = ctx.t_upstream_sent,
                                        .not_after = ctx.deadline});
    // The answer's head (or the failure) is here: this attempt's one clock read after its send.
    t_answered = core::now();
    // From the request's last byte handed to the kernel to its answer's head: the endpoint's time (its
    // queue, prefill, or a stall), not Weir's. (The write itself is Weir's; an exchange that does not
    // say when it wrote is taken to have written at once.)
    {
      const auto written = exchange_.written_at();
      ctx.upstream_wait += t_answered - (written > ctx.t_upstream_sent ? written : ctx.t_upstream_sent);
    }
    routing::RetryDecision d;
    if (failure != http::UpstreamFailure::none && core::passed(ctx.deadline, t_answered)) {
      record(ep_idx, 0, failure, ctx.t_upstream_sent, t_answered);
      pool.on_finish(ep_idx);
      exchange_.release();
      deadline_hit = true;  // the request's own deadline, not the endpoint's fault
      break;
    }
    const int head_status = failure == http::UpstreamFailure::none ? exchange_.head().result_int() : 0;
    // Whether the server had closed the pooled connection (a reset at once, or its idle timeout's 408
    // crossing the request), then the endpoint's health, in that order and in one place (Attempts::judge,
    // as a micro-batch's): a stale connection is no verdict on the endpoint. A stream's answer is judged at
    // its first token (judge_answer): a stall before it counts against the endpoint too. A non-streamed 2xx
    // is judged once its body was read whole and found an answer (respond_buffered): a 200 head followed by
    // an HTML page, a body cut short or one that cannot be decoded is a failed answer, not a good one that
    // clears the endpoint's failures or closes its half-open breaker. A 404 waits for its body too: one
    // that says the pool's model does not exist there is the replica's fault (RequestContext::model_missing).
    const auto v = attempts.judge({.failure = failure,
                                   .status = head_status,
                                   .reused = reused,
                                   .closing_head_alone = head_status == 408 && exchange_.closing_head_alone(),
                                   .judged_later = !head_request && (head_status < 300 || head_status == 404),
                                   .upstream_bytes = head_status == 0 ? exchange_.upstream_bytes() : 0,
                                   .sent = ctx.t_upstream_sent,
                                   .answered = t_answered});
    if (v.ejected) ++metrics.outlier_ejections;
    if (v.deferred) {
      ctx.verdict_pending = true;
      ctx.trial = v.trial;
    }
    // A 5xx answer, retried or passed on, is a failed attempt of its endpoint as the health state machine
    // takes it: failures ÷ attempts per endpoint finds an endpoint that answers 503s as one that resets.
    // (One failure per attempt: a body that breaks after this head is not counted again, count_upstream_failure.)
    // A 429 is a failed answer for the endpoint's health, but not counted here: the upstream's capacity, not
    // the endpoint failing (docs/observability.md).
    ctx.attempt_failure_counted = failure == http::UpstreamFailure::none && v.failed && head_status != 429;
    if (ctx.attempt_failure_counted)
      metrics.count_upstream_failure_at(gen.endpoint_slot(ctx.target.pool, ep_idx), http::UpstreamFailure::status);
    if (failure == http::UpstreamFailure::none) {
      const int status = head_status;
      if (!routing::retryable_status(status)) {
        started = true;
        break;
      }
      // A pooled connection's server that timed it out as the request went
      // out (its 408 and close crossed the request): sent again at once on a
      // fresh connection, free, as for a reset. Else 408/429/502/503/504/529:
      // the upstream did not do the work. Another attempt here (not when it
      // said x-should-retry: false), the next fallback, or (neither left)
      // this answer.
      d = v.stale ? routing::kStaleResend
                  : attempts.on_status(status, routing::asked_delay(exchange_.head()), t_answered,
                                       routing::says_no_retry(exchange_.head()));
      cancel_late_retry(d);
      if (!d.retry && !fallback_left(ctx)) {
        started = true;
        break;
      }
      record(ep_idx, status, failure, ctx.t_upstream_sent, t_answered, v.stale);
      last_status = status;
      pool.on_finish(ep_idx);
      // A small error body may have come whole with the head: then the connection can serve again.
      if (auto c = exchange_.release()) pool.endpoint(ep_idx).conns.put(std::move(c), core::now());
      if (!d.retry) break;
    } else {
      // (A stale connection is logged as that, not as the reset it looked like.)
      record(ep_idx, 0, failure, ctx.t_upstream_sent, t_answered, v.stale);
      pool.on_finish(ep_idx);
      if (down_.client_gone()) {
        unsent = v.stale ? 1 : 0;  // (the stale resend was taken, never to be sent)
        break;
      }
      if (failure == http::UpstreamFailure::tls) {
        // The server failed the handshake after the client's part of it (a
        // TLS 1.3 client certificate refused): a connect failure, as one
        // refused during the handshake is (the request was never handled).
        routing::log_tls_failure(ep, pc.name, exchange_.connect_error(), t_answered);
        metrics.count_upstream_failure_at(gen.endpoint_slot(ctx.target.pool, ep_idx), failure);
        exchange_.release();
        if (attempts.on_connect_failure(failure, t_answered)) {
          metrics.count_retry(routing::RetryReason::connect);
          continue;
        }
        break;
      }
      // A non-streamed request sent whole and unanswered within timeouts.response may still be generating:
      // sent again only as the pool's retry.response_timeout says (on_response_timeout).
      d = v.stale ? routing::kStaleResend
          : failure == http::UpstreamFailure::timeout && !ctx.stream && exchange_.written_whole()
              ? attempts.on_response_timeout(t_answered)
              : attempts.on_failure(failure, t_answered);
      cancel_late_retry(d);
      // Every failed attempt counts against its endpoint, retried or not,
      // except a pooled connection the server had closed (resent at once).
      if (!v.stale) metrics.count_upstream_failure_at(gen.endpoint_slot(ctx.target.pool, ep_idx), failure);
      exchange_.release();
      if (!d.retry) break;
    }
    // A retry decided but never sent (the deadline, or the client left in its
    // backoff) is not one: neither in the log's `retries` nor in the metric.
    co_await wait_backoff(ctx, d.delay);
    if (down_.client_gone()) {
      unsent = 1;
      break;
    }
    metrics.count_retry(d.reason);
  }
  if (attempts.budget_refused()) ++metrics.retry_budget_exhausted;
  // Spent on this pool without an answer to pass on: the next fallback may take it.
  ctx.fail_over =
      !started && !down_.client_gone() && (failure == http::UpstreamFailure::none || http::is_upstream_fault(failure));
  ctx.retries = retries_before + attempts.retries() - unsent;
  ctx.pool_tries = static_cast<std::uint8_t>(std::min<std::uint32_t>(ctx.pool_tries + 1 + attempts.retries(), 255));
  ctx.pool_failed |= attempts.failed();
  const auto ep_idx = attempts.endpoint();
  if (!started || down_.client_gone()) {
    if (started) pool.on_finish(ep_idx);
    if (ctx.verdict_pending) {  // the client left right after the head: no verdict
      ctx.verdict_pending = false;
      if (ctx.trial) pool.end_trial(ep_idx);
      ctx.trial = false;
    }
    exchange_.release();
    ctx.source = nullptr;
    if (down_.client_gone()) {
      ctx.fail_over = false;
      co_return Outcome::failed(client_gone(why_gone()));
    }
    if (deadline_hit) {
      // The request's own deadline passed (or the next retry would start past it): no fallback either.
      ctx.fail_over = false;
      ++metrics.deadline_exceeded;
      co_return Outcome::failed(deadline_exceeded(subject(ctx), ctx.deadline_ms));
    }
    if (failure == http::UpstreamFailure::none)  // the last attempt answered 408/429/5xx; a fallback takes it
      co_return Outcome::failed(upstream_status_error(last_status, subject(ctx)));
    if (failure == http::UpstreamFailure::protocol && exchange_.head_too_large())  // (the last start()'s)
      co_return Outcome::failed(upstream_head_too_large(subject(ctx)));
    // (A timeout of a request not sent whole: nothing is generating, the SDK may send it again.)
    if (failure == http::UpstreamFailure::timeout && !exchange_.written_whole())
      co_return Outcome::failed(upstream_error(failure, subject(ctx), false));
    co_return Outcome::failed(attempt_error(ctx, failure));
  }
  ctx.t_first_byte = t_answered;  // (the last attempt's clock read after its answer's head)
  record(ep_idx, exchange_.head().result_int(), failure, ctx.t_upstream_sent, ctx.t_first_byte);
  ctx.upstream_status = exchange_.head().result_int();
  co_return Outcome::next();
}

}  // namespace weir::gateway
