// Resume mid-stream (pools.X.resume, docs/upstreams.md#resume-mid-stream):
// whether a broken chat stream may continue on another endpoint, the
// continuation's request, and the checks on its first chunks.
#include <optional>

#include <boost/beast/http/field.hpp>

#include "core/json_text.hpp"
#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"
#include "http/sse.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;

bool GatewayPhases::resume_eligible(const RequestContext& ctx) const {
  // One sequence only: a continuation of n choices (or of best_of candidates, which vLLM does not stream) would
  // not be the client's text.
  if (ctx.route != RouteKind::chat_completions || !ctx.stream || ctx.fields.sequences() != 1) return false;
  const auto& pc = ctx.gen->config().pools[ctx.target.pool];
  if (!pc.resume || pc.type != core::UpstreamType::openai) return false;
  return !api::openai::resume_excluded(ctx.upstream_body);
}

bool GatewayPhases::begin_resume(RequestContext& ctx, const Outcome& o) {
  auto& r = ctx.resume;
  r.wanted = false;
  r.active = false;
  r.finish = RequestContext::Resume::Finish::none;
  if (!r.on || !ctx.committed || !o.is_failed() || o.error().source != core::ErrorSource::upstream) return false;
  if (down_.client_gone() || ctx.cutoff == RequestContext::Cutoff::deadline || core::passed(ctx.deadline, core::now()))
    return false;
  const auto& tr = r.buf->tracker;
  if (tr.blocked()) return false;  // tool calls in flight, reasoning, another choice
  if (tr.finished()) {
    // The finish_reason reached the client: only the stream's end was lost.
    r.finish = RequestContext::Resume::Finish::done;
    return true;
  }
  const auto& pc = ctx.gen->config().pools[ctx.target.pool];
  if (r.count >= std::max<std::uint32_t>(1, pc.retry.attempts - 1)) return false;
  if (!tr.content()) {
    // Broken before any content (only the head, and the role chunk if it came, reached the client): the
    // request goes again as it was sent, and its stream goes on from there (its role chunk dropped when the
    // client has one already).
    r.buf->body.assign(r.original);
  } else {
    switch (api::openai::continuation_body(r.original, tr.text_json(), tr.tokens(), r.buf->body)) {
      case api::openai::Continuation::exhausted:
        r.finish = RequestContext::Resume::Finish::length;
        return true;
      case api::openai::Continuation::unsupported:
        return false;
      case api::openai::Continuation::ok:
        break;
    }
  }
  if (ctx.endpoint >= 0) r.broke.insert(static_cast<std::uint32_t>(ctx.endpoint));
  ++r.count;
  r.active = true;
  r.answered = false;
  r.role_due = !tr.noted();
  r.tokens_before = tr.tokens();
  ++ctx.retries;
  return true;
}

bool GatewayPhases::resumed_stream_ok(RequestContext& ctx) {
  const auto& head = exchange_.head();
  if (ctx.upstream_status == 200 && http::is_event_stream(http::first_field(head, bh::field::content_type)) &&
      !exchange_.done() && http::content_codings(head).empty())
    return true;
  // Not a stream to continue with (an upstream that refuses continue_final_message answers 400):
  // the attempt ends here, its answer unread.
  auto& pool = ctx.gen->pool(ctx.target.pool);
  const auto ep = static_cast<std::uint32_t>(ctx.endpoint);
  if (ctx.verdict_pending) {
    ctx.verdict_pending = false;
    if (ctx.trial) pool.end_trial(ep);
    ctx.trial = false;
  }
  pool.on_finish(ep);
  if (auto c = exchange_.release()) pool.endpoint(ep).conns.put(std::move(c), core::now());
  ctx.source = nullptr;
  return false;
}

namespace {

// The start of a chunk of the stream being resumed, with its own id,
// created and model: `{"id":…,"object":"chat.completion.chunk","created":…,"model":…`.
void begin_stream_chunk(const api::openai::ResumeTracker& tr, std::string& out) {
  out.clear();
  out += R"({"id":)";
  out += tr.id_json().empty() ? std::string_view(R"("")") : tr.id_json();
  out += R"(,"object":"chat.completion.chunk","created":)";
  out += tr.created_json().empty() ? std::string_view("0") : tr.created_json();
  out += R"(,"model":)";
  out += tr.model_json().empty() ? std::string_view(R"("")") : tr.model_json();
}

}  // namespace

core::Task<Outcome> GatewayPhases::finish_stream(RequestContext& ctx, bool length) {
  ctx.scratch.clear();
  const auto& tr = ctx.resume.buf->tracker;
  if (length) {
    // The chunk an unbroken stream ends with when max_tokens cuts it, with the stream's own id.
    begin_stream_chunk(tr, ctx.body);
    ctx.body += R"(,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length","stop_reason":null}]})";
    http::append_sse_data(ctx.scratch, ctx.body);
    ++ctx.events;
  }
  if (ctx.fields.usage_asked && !ctx.hooks.usage().usage_chunk_relayed()) {
    // The usage chunk the client asked for (as vLLM reads the body), which the broken stream never sent: the
    // upstream's usage when its usage chunk reached Weir, else what settle() charges a stream cut short
    // (its prompt as estimated, one token per content event relayed, at most max_tokens, raised to what
    // per-chunk usage counted: a floor, never lowered by counts the broken stream left stale). (A usage
    // chunk that reached the client stands alone.) Weir ends the stream whole here, so settle() charges
    // the same counts.
    if (!ctx.has_usage && ctx.has_choice_usage) {
      ctx.usage = unreported_usage(ctx);
      ctx.has_usage = true;
    }
    const api::Usage u = ctx.has_usage ? ctx.usage : unreported_usage(ctx);
    const std::uint64_t prompt = u.prompt_tokens;
    const std::uint64_t completion = u.completion_tokens;
    begin_stream_chunk(tr, ctx.body);
    ctx.body += R"(,"choices":[],"usage":{"prompt_tokens":)";
    core::append_uint(ctx.body, prompt);
    ctx.body += R"(,"completion_tokens":)";
    core::append_uint(ctx.body, completion);
    ctx.body += R"(,"total_tokens":)";
    core::append_uint(ctx.body, prompt + completion);
    ctx.body += "}}";
    http::append_sse_data(ctx.scratch, ctx.body);
    ++ctx.events;
  }
  http::append_sse_data(ctx.scratch, "[DONE]");
  ++ctx.events;
  if (ctx.capture) capture_response(ctx, ctx.scratch);
  ctx.ticket.release_streams();  // (the stream's last bytes)
  down_.queue_body(ctx.scratch);
  down_.queue_end();
  down_.flush();
  co_await down_.drain();
  if (down_.write_failed()) co_return Outcome::failed(client_gone(why_gone()));
  co_return Outcome::responded();
}

}  // namespace weir::gateway
