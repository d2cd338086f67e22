// Micro-batching (pools.X.batch, pools.X.coalesce; docs/architecture.md):
// a request's seat in its pool's batcher, and its answer demultiplexed
// from the batch's upstream response.
#include <optional>

#include "api/json_scan.hpp"
#include "api/openai/batch.hpp"
#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

GatewayPhases::GatewayPhases(Worker& w, http::Downstream& down, http::UpstreamExchange& exchange, bool batching)
    : w_(w), down_(down), exchange_(exchange), batching_(batching) {}

GatewayPhases::~GatewayPhases() = default;

namespace {

// Whether http::append_forwarded_fields_key's lines ("name: value\n", names lower-cased) are none, or
// Content-Type's alone.
bool only_content_type(std::string_view fields) {
  while (!fields.empty()) {
    if (!fields.starts_with("content-type: ")) return false;
    const std::size_t nl = fields.find('\n');
    fields.remove_prefix(nl == std::string_view::npos ? fields.size() : nl + 1);
  }
  return true;
}

}  // namespace

bool GatewayPhases::plan_batch(RequestContext& ctx, BatchPlan& plan) {
  if (!batching_ || ctx.fallback_step != 0) return false;
  if (ctx.route != RouteKind::completions && ctx.route != RouteKind::chat_completions) return false;
  auto* batcher = ctx.gen->batcher(ctx.target.pool);
  if (batcher == nullptr) return false;
  if (!member_) member_ = std::make_unique<batching::BatchMember>(w_.io().get_executor());
  const auto& pc = ctx.gen->config().pools[ctx.target.pool];
  if (prepare_upstream_body(ctx)) return false;
  plan = {};
  if (ctx.route == RouteKind::completions && pc.batch.enabled())
    plan.prompt = api::openai::completion_batch_key(ctx.upstream_body, member_->key());
  if (!plan.prompt && !(pc.coalesce && api::openai::coalesce_key(ctx.upstream_body, member_->key()))) return false;
  plan.strip_credentials = !pc.api_key.empty() || w_.verifies_credentials();
  if (ctx.body_decoded) return false;  // (rare) a decoded body's head differs from the others'
  // The fields that go upstream are part of the key: a member never rides on another's credential or headers.
  member_->key() += '\0';  // never in valid JSON nor in a field
  const std::size_t fields_at = member_->key().size();
  http::append_forwarded_fields_key(member_->key(), down_.request(), plan.strip_credentials);
  // A batch of several tenants sends none of a member's fields but Content-Type and Accept
  // (UpstreamHeadOptions::shared), so a member whose key holds another field (one the model server may act
  // on, as vLLM's X-data-parallel-rank) batches with its own tenant only: batching never changes what goes up.
  const bool own_tenant_only = !only_content_type(std::string_view(member_->key()).substr(fields_at));
  // And where they go: the same body to /v1/chat/completions and /v1/completions (or with another query) is not
  // the same request (a 400 on one route must not become the other's 200).
  member_->key() += '\0';
  member_->key() += upstream_target(ctx.route, false, down_.target());
  // A shared generation never crosses tenants: a late joiner gets at once
  // what was generated, and that timing would tell one tenant what another
  // is asking right now (as providers keep prompt caches per organisation).
  // A prompt-list batch may: its members share no text and no timing.
  if ((!plan.prompt || own_tenant_only) && ctx.principal) {
    member_->key() += '\0';
    member_->key() += ctx.principal->tenant_name();
  }
  // What the member's own upstream request asked for: usage at the end
  // (vLLM's StreamOptions.include_usage defaults to true) and on every chunk.
  bool include_usage = false;
  bool continuous = false;
  if (auto so = api::find_member(ctx.upstream_body, "stream_options")) {
    const std::string_view obj = ctx.upstream_body.substr(so->value_begin, so->value_end - so->value_begin);
    const auto member_is = [&](std::string_view key, std::string_view v) {
      const auto m = api::find_member(obj, key);
      return m && obj.substr(m->value_begin, m->value_end - m->value_begin) == v;
    };
    include_usage = !api::find_member(obj, "include_usage") || member_is("include_usage", "true");
    continuous = member_is("continuous_usage_stats", "true");
  }
  plan.include_usage = ctx.stream && include_usage;
  // (vLLM sends per-chunk usage only with include_usage too: continuous_usage_stats alone asks for nothing.)
  plan.continuous_usage = ctx.stream && include_usage && continuous;
  return true;
}

void GatewayPhases::join_batch(RequestContext& ctx, const BatchPlan& plan) {
  auto* batcher = ctx.gen->batcher(ctx.target.pool);
  const auto& req = down_.request();
  if (ctx.trace_on()) {
    // The batch's upstream request carries its first member's traceparent (Weir's span: the client's trace
    // context only when every member is of its tenant); the others' upstream spans link to it (batched_attempt).
    begin_attempt_trace(ctx);
    if (ctx.trace->sampled) ctx.trace->batch_join = core::now();
  }
  const batching::BatchMember::Request r{
      .head = &req,
      .target = upstream_target(ctx.route, false, down_.target()),
      .prompt = plan.prompt.value_or(std::string_view()),
      .body = ctx.upstream_body,
      .request_id = ctx.upstream_id(),
      .stream = ctx.stream,
      .include_usage = plan.include_usage,
      .continuous_usage = plan.continuous_usage,
      .strip_credentials = plan.strip_credentials,
      .traceparent = ctx.trace_on() ? ctx.trace->traceparent_view() : std::string_view(),
      .tracestate = ctx.trace_on() ? std::string_view(ctx.trace->tracestate) : std::string_view(),
      .client_address = down_.peer_address(),
      .real_ip = down_.client_address(),
      .trusted_peer = down_.peer_trusted(),
      .tenant = ctx.principal ? ctx.principal->tenant_name() : std::string_view(),
      .pick = pick_request(ctx, ctx.gen->config().pools[ctx.target.pool])};
  const bool holds_place = ctx.queue_pool >= 0;
  const bool opened =
      plan.prompt ? batcher->join(*member_, r, holds_place) : batcher->coalesce(*member_, r, holds_place);
  if (opened && holds_place) {
    ctx.queue_pool = -1;  // the batch's now: it gives the place back when its upstream request ends
    // Requests waiting in the queue that can join it go with it, not each for a place of its own.
    const auto& pc = ctx.gen->config().pools[ctx.target.pool];
    const std::uint32_t room = plan.prompt ? pc.batch.max_size - 1 : UINT32_MAX;
    ctx.gen->pool(ctx.target.pool).queue()->release_joiners(member_->key(), !plan.prompt, room);
  } else {
    leave_queue(ctx);  // (none held, or the batch it joined has its own)
  }
}

core::Task<Outcome> GatewayPhases::proxy_batched(RequestContext& ctx) {
  // The deadline cancels the member wherever it is (in the window, waiting for the head, relaying): it leaves
  // the batch, the others go on (a generation every member left is cancelled upstream). A stream's first-token
  // timeout is armed with the batch's head, from the batch's send (batched_attempt), as unbatched from its
  // own: the window is Weir's wait, and a member cut off in it would blame an upstream never asked. So is a
  // non-streamed member's response timeout.
  const bool deadline = arm_cutoff(ctx, false);  // batched_attempt() sets ctx.source before it first waits
  Outcome o = co_await batched_attempt(ctx);
  if (deadline || ctx.first_token_by != core::TimePoint{} || ctx.response_by != core::TimePoint{}) {
    if (ctx.cutoff == RequestContext::Cutoff::deadline) ctx.batch_split = false;  // not sent alone after it
    o = after_cutoff(ctx, std::move(o));
  }
  // A non-streamed member that got no answer (502, 504) saw no head of its
  // own: the batch's 2xx head is not its, so it is charged nothing, as the
  // same request alone, failing before its head, would be (settle()) -- unless it lingers (below).
  if (!ctx.stream && !ctx.committed && !o.is_responded() && !o.goes_on()) ctx.upstream_status = 0;
  if (member_->lingering()) {
    // The member left (its client went, its deadline cut it) after its prompt went upstream in a list others
    // still read: vLLM generates it to its end all the same. Its request (and its tenant's stream slot) stays
    // until that prompt ends upstream, and is charged what was generated for it -- its own per-chunk usage,
    // the upstream's count -- as the same request alone would be had it run to its end: no tenant gets
    // generation for nothing while others keep a batch alive. If the batch breaks first, what was generated
    // by then. If every member left (the batch was aborted upstream, its prompt with it), as the same request
    // alone whose client left: settle()'s rule, with its per-chunk usage as it stood at the abort. (One that
    // goes to a fallback leaves at once: its answer is the fallback's.)
    if (ctx.fail_over) {
      member_->forget();
    } else {
      if (o.is_failed() && !down_.client_gone() && !down_.closed() && !ctx.drain_cut) {
        // Cut off with its client still there (its deadline): the client gets its answer now (a 504, or a
        // stream's in-band error and end), as unbatched -- the deadline bounds the request's whole time --
        // and only its settlement (its log line, its charge, its stream slot) waits for the prompt's end.
        // The connection is not read again until then: a whole answer says so (Connection: close), so the
        // client's next request goes on a connection of its own rather than wait; a stream's head went out
        // with keep-alive, so a request sent next on it is read after the settlement.
        if (!ctx.committed) down_.no_keep_alive();
        ctx.answered_lingering = true;
        co_await fail(ctx, o.error());
        o = Outcome::responded();
      }
      // (A wait for the model server to end the member's prompt: its time, not Weir's (added_us).)
      const auto from = core::now();
      co_await member_->settled();
      ctx.upstream_wait += core::now() - from;
      if (const auto u = member_->seen_usage()) {
        if (member_->linger_end() != http::UpstreamFailure::cancelled) {
          ctx.has_usage = true;
          ctx.usage = *u;
        } else if (!ctx.has_usage) {
          ctx.has_choice_usage = true;
          ctx.choice_usage = *u;
          ctx.choice_usage_every_prompt = true;
        }
      }
    }
  }
  co_return o;
}

core::Task<Outcome> GatewayPhases::batched_attempt(RequestContext& ctx) {
  batching::BatchMember& m = *member_;
  ctx.source = &m;                      // a client that leaves now leaves the batch (on_client_gone)
  ctx.attempt_failure_counted = false;  // (the batch's attempt: its 5xx head is counted by the batch)
  // (One clock read per member: a late joiner of a generation sent before it joined waits for the upstream
  // only from here.)
  const auto joined = core::now();
  const bool ok = co_await m.wait_head();
  const auto now = core::now();
  ctx.endpoint = m.endpoint();
  // The attempts recorded from here on are the batch's, sent with its lead's traceparent: the member's
  // upstream spans link to it when it was not their own (only one member's span id reached the upstream).
  const bool sampled = ctx.trace_sampled();
  if (sampled) {
    if (const auto sent = tracing::parse_traceparent(m.sent_traceparent())) {
      ctx.trace->batch_sent_trace = sent->trace_id;
      ctx.trace->batch_sent_span = sent->span_id;
      ctx.trace->batch_lead = m.sent_traceparent() == ctx.trace->traceparent_view();
    }
  }
  const auto batch_attempt = [&] {
    if (sampled) ctx.trace->batch_attempts |= static_cast<std::uint8_t>(1u << (ctx.attempt_count - 1));
  };
  // The batch's attempts before its last (retried on its pool), as an unbatched request logs its own: their
  // time was the endpoints' (added_us leaves it out).
  for (const auto& a : m.earlier_attempts()) {
    ctx.record_attempt({.pool = static_cast<std::int16_t>(ctx.target.pool),
                        .endpoint = a.endpoint,
                        .status = a.status,
                        .failure = a.failure,
                        .us = a.us,
                        .stale = a.stale});
    batch_attempt();
    ctx.upstream_wait += std::chrono::microseconds(a.us);
  }
  ctx.retries += m.batch_retries();
  if (m.sent_at() != core::TimePoint{}) {
    // A late member of a coalesced generation joined one already sent.
    ctx.t_upstream_sent = std::max(ctx.t_start, m.sent_at());
    // The batch window is Weir's hold (as a queue's wait); from the batch's send (or this member's join, if
    // later) to its head, the upstream's time.
    ctx.upstream_wait += now - std::max(joined, m.sent_at());
    ctx.extra().batch_id.assign(m.batch_id());
    ctx.batch_size = static_cast<std::uint16_t>(m.batch_size());
    ctx.batch_slot = static_cast<std::uint16_t>(m.slot());
    ctx.coalesced = m.coalesced();
  }
  if (down_.client_gone()) {
    m.cancel();
    ctx.source = nullptr;
    co_return Outcome::failed(client_gone(why_gone()));
  }
  if (!ok && m.resend_alone()) {
    ctx.source = nullptr;
    ctx.batch_split = true;
    ++ctx.retries;
    ctx.record_attempt({.pool = static_cast<std::int16_t>(ctx.target.pool),
                        .endpoint = static_cast<std::int16_t>(ctx.endpoint),
                        .status = static_cast<std::int16_t>(m.split_status()),
                        .us = static_cast<std::uint32_t>(core::micros_between(ctx.t_upstream_sent, now))});
    batch_attempt();
    co_return Outcome::next();  // not an outcome: proxy() sends the request alone
  }
  if (!ok) {
    ctx.source = nullptr;
    auto f = m.failure();  // counted in the metrics once, by the batch
    ctx.fail_over = http::is_upstream_fault(f);
    if (ctx.endpoint >= 0) {
      ctx.record_attempt({.pool = static_cast<std::int16_t>(ctx.target.pool),
                          .endpoint = static_cast<std::int16_t>(ctx.endpoint),
                          .failure = f,
                          .us = ctx.t_upstream_sent == core::TimePoint{}
                                    ? 0u
                                    : static_cast<std::uint32_t>(core::micros_between(ctx.t_upstream_sent, now))});
      batch_attempt();
    }
    if (!m.invalid_answer().empty())
      co_return Outcome::failed(upstream_untranslatable(subject(ctx), m.invalid_answer()));
    if (f == http::UpstreamFailure::protocol && m.stream_cut_short())
      co_return Outcome::failed(upstream_stream_incomplete(subject(ctx)));
    if (f == http::UpstreamFailure::protocol && m.head_too_large())
      co_return Outcome::failed(upstream_head_too_large(subject(ctx)));
    co_return Outcome::failed(attempt_error(ctx, f));
  }
  ctx.upstream_status = m.head().result_int();
  ctx.t_first_byte = now;
  ctx.record_attempt({.pool = static_cast<std::int16_t>(ctx.target.pool),
                      .endpoint = static_cast<std::int16_t>(ctx.endpoint),
                      .status = static_cast<std::int16_t>(ctx.upstream_status),
                      .us = static_cast<std::uint32_t>(core::micros_between(ctx.t_upstream_sent, now))});
  batch_attempt();
  if (routing::retryable_status(ctx.upstream_status) && fallback_left(ctx)) {
    // The pool's answer is one a fallback takes over (429, 503, ...): this
    // member leaves the batch for its model's next target, as it would unbatched.
    m.cancel();
    ctx.source = nullptr;
    ctx.fail_over = true;
    co_return Outcome::failed(upstream_status_error(ctx.upstream_status, subject(ctx)));
  }
  if (m.body_withheld()) {
    // An error to a prompt list (400, 413 and 422 were split off before
    // this): its body was written for every member's prompts and may quote
    // any of them (tenants share batches), so the batch did not read it.
    // Each member gets the status with Weir's error instead.
    // (The upstream's wait, exact in retry-after-ms, and its own x-should-retry: false, pass on with it.)
    std::uint32_t retry_after_s = 1;
    const auto asked = routing::asked_delay(m.head());
    if (asked) retry_after_s = retry_after_seconds(*asked);
    const bool told_no_retry = routing::says_no_retry(m.head());
    m.cancel();
    ctx.source = nullptr;
    auto e = batch_status_error(ctx.upstream_status, subject(ctx), retry_after_s);
    if (e.retry_after_s > 0 && asked && *asked <= std::chrono::seconds(e.retry_after_s) && asked->count() > 0)
      e.retry_after_ms = static_cast<std::uint32_t>(asked->count());
    e.no_retry = told_no_retry;
    co_return Outcome::failed(std::move(e));
  }
  // The first-token timeout from the batch's send (a late joiner of a coalesced generation: from its arrival).
  // A non-streamed member of a micro-batch gets its answer assembled from the batch's stream, whose events
  // may keep coming (each gap within timeouts.response) long after the same request alone would have had
  // its 504: its whole wait is bounded by timeouts.response from the batch's send, as the same request's
  // head alone (gateway/phases/proxy.cpp). Cut, it leaves the batch (the others go on) with a timeout a
  // fallback may take, not sent again on this pool: the generation it left may still be running for the
  // others, and one started over for it alone would need as long again. (A non-streamed coalesced
  // generation goes upstream unstreamed: its head is its whole answer, bounded so by the batch's attempt.)
  const auto& pc = ctx.gen->config().pools[ctx.target.pool];
  const bool whole_wait = !ctx.stream && !m.coalesced();
  (void)arm_cutoff(ctx, true, whole_wait ? ctx.t_upstream_sent + pc.timeouts.response : core::TimePoint{});
  // A stream's head waits for its first content while a fallback is left (relay), as unbatched.
  Outcome o = co_await relay(ctx, m);
  ctx.source = nullptr;
  // The member's own per-chunk usage, which the batch asked for on its behalf and which its client sees only
  // if it asked too: settle() weighs it as it weighs the per-choice usage of a stream sent alone (the whole
  // of a stream that ended without a usage chunk; the floor of one cut short: the client left, the batch
  // broke, a deadline), so a member is charged the same whether or not its client asked for per-chunk usage.
  // A member is one prompt with one choice (docs/batching.md): any of its chunks' usage said its prompt's count.
  // (Not an answer that failed over: nothing of it is the request's.)
  if (!ctx.has_usage && !ctx.fail_over) {
    if (const auto u = m.seen_usage()) {
      ctx.has_choice_usage = true;
      ctx.choice_usage = *u;
      ctx.choice_usage_every_prompt = true;
    }
  }
  // A non-streaming member whose batch failed before its answer: nothing reached the client.
  if (!o.is_responded() && !ctx.committed && http::is_upstream_fault(m.failure())) ctx.fail_over = true;
  co_return o;
}

}  // namespace weir::gateway
