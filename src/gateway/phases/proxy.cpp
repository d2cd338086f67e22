// The respond phase for proxied requests: the upstream request (the
// client's body with at most two members spliced), the attempt loop over
// the pool's endpoints (policy in routing::Attempts), then the response as
// a stream or a buffered body. Nothing is retried once a byte reached the
// client (the commit point).
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/verb.hpp>

#include "api/anthropic/request.hpp"
#include "api/json_scan.hpp"
#include "api/openai/stream.hpp"
#include "core/json_text.hpp"
#include "core/text.hpp"
#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"
#include "routing/attempts.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;

namespace {
bool is_event_stream(std::string_view content_type) {
  return content_type.size() >= 17 && core::iequals(content_type.substr(0, 17), "text/event-stream");
}
// The upstream's target: the client's, or the OpenAI-compatible path an
// Anthropic route is translated to.
std::string_view upstream_target(RouteKind r, std::string_view client_target) {
  if (r == RouteKind::messages) return api::anthropic::upstream_path(api::anthropic::Target::messages);
  if (r == RouteKind::messages_count_tokens) return api::anthropic::upstream_path(api::anthropic::Target::count_tokens);
  return client_target;
}
}  // namespace

// Not a coroutine: the task it returns is the phase's, so a stream holds
// no frame for this dispatch.
core::Task<Outcome> GatewayPhases::respond(RequestContext& ctx) { return proxied(ctx) ? proxy(ctx) : serve_own(ctx); }

void GatewayPhases::prepare_upstream_body(RequestContext& ctx) {
  if (!api_of(ctx.route)) {
    // GET/HEAD (the upstream's model list): a request body means nothing
    // there, and forwarded without a length the upstream would read it as
    // the next request on the connection (request smuggling).
    ctx.upstream_body = {};
    return;
  }
  // An Anthropic request's upstream body is its translation (parse phase),
  // which asks a stream for its usage chunk itself.
  const bool anthropic = is_anthropic(ctx.route);
  std::string_view body = anthropic ? std::string_view(ctx.edit_buf) : down_.body();
  if (!ctx.target.upstream_model.empty() && ctx.target.upstream_model != ctx.model) {
    ctx.scratch.clear();
    core::append_json_string(ctx.scratch, ctx.target.upstream_model);
    if (ctx.upstream_body_buf.capacity() == std::string().capacity()) ctx.upstream_body_buf = w_.take_buffer();
    if (api::set_member(body, "model", ctx.scratch, ctx.upstream_body_buf)) body = ctx.upstream_body_buf;
  }
  if (!anthropic && ctx.stream && !ctx.fields.include_usage && ctx.route != RouteKind::embeddings &&
      w_.config().pools[ctx.target.pool].request_usage) {
    // Ask for the usage chunk so this stream's tokens are known; the client
    // did not ask for it, so the stream hooks drop it from the client's stream.
    if (ctx.edit_buf.capacity() == std::string().capacity()) ctx.edit_buf = w_.take_buffer();
    if (api::openai::ask_for_usage(body, ctx.fields.has_stream_options, ctx.scratch, ctx.edit_buf)) {
      body = ctx.edit_buf;
      ctx.strip_usage = true;
    }
  }
  ctx.upstream_body = body;
}

void GatewayPhases::on_client_gone(RequestContext& ctx) {
  if (ctx.source && !ctx.source->done() && !ctx.hooks.done_relayed()) ctx.source->cancel();
}

void GatewayPhases::commit(RequestContext& ctx) {
  if (ctx.committed) return;
  ctx.committed = true;
  // The request cannot be sent again: its storage goes back to the worker,
  // so a long stream does not hold it.
  ctx.upstream_body = {};
  w_.give_buffer(down_.body());
  w_.give_buffer(ctx.upstream_body_buf);
  w_.give_buffer(ctx.edit_buf);
}

core::Task<Outcome> GatewayPhases::proxy(RequestContext& ctx) {
  // The attempts run in their own frame, gone once the response head is in:
  // a long stream holds only this small one and the responder's.
  Outcome o = co_await start_upstream(ctx);
  if (!o.goes_on()) co_return o;
  const auto& head = exchange_.head();
  // Streams are asked for in identity; events cannot be read out of
  // compressed bytes, so a stream compressed anyway is relayed whole, as a
  // buffered body (decoded for a client that did not accept the encoding).
  const auto ce = head[bh::field::content_encoding];
  const bool encoded = !ce.empty() && !core::iequals(ce, "identity");
  const bool stream =
      ctx.upstream_status == 200 && is_event_stream(head[bh::field::content_type]) && !exchange_.done() && !encoded;
  if (stream)
    o = co_await respond_stream(ctx);
  else
    o = co_await respond_buffered(ctx);
  auto& pool = w_.pool(ctx.target.pool);
  const auto ep = static_cast<std::uint32_t>(ctx.endpoint);
  pool.on_finish(ep);
  ctx.source = nullptr;
  // Keep the connection only after a complete, keep-alive response.
  if (auto c = exchange_.release()) {
    ++c->uses;
    pool.endpoint(ep).conns.put(std::move(c), core::now());
  }
  co_return o;
}

core::Task<Outcome> GatewayPhases::start_upstream(RequestContext& ctx) {
  auto& metrics = w_.metrics();
  const auto& req = down_.request();
  prepare_upstream_body(ctx);
  auto& pool = w_.pool(ctx.target.pool);
  const auto& pc = pool.config();
  const bool head_request = req.method() == bh::verb::head;

  // The client may leave while we wait on the upstream: watch for it.
  down_.watch_for_close(/*release_buffer=*/ctx.stream);
  ctx.source = &exchange_;

  auto now = core::now();
  routing::Attempts attempts(pool, w_.rng(), now);
  std::int64_t added = core::micros_between(ctx.t_start, now);  // read, parse, route, admit
  http::UpstreamFailure failure = http::UpstreamFailure::none;
  bool started = false;
  for (;;) {
    const std::uint32_t ep_idx = attempts.endpoint();
    auto& ep = pool.endpoint(ep_idx);
    ctx.endpoint = static_cast<int>(ep_idx);
    auto pooled = attempts.fresh_only() ? nullptr : ep.conns.take(core::now());
    const bool reused = pooled != nullptr;
    if (reused) {
      exchange_.use(std::move(pooled));
    } else {
      ++metrics.upstream_connects;
      failure = co_await exchange_.connect(ep.addr, pc.timeouts.connect);
      if (down_.client_gone()) break;
      if (failure != http::UpstreamFailure::none) {
        metrics.count_upstream_failure(failure);
        if (attempts.on_connect_failure(failure, core::now())) {
          ++metrics.upstream_retries;
          continue;
        }
        break;
      }
      attempts.on_connected();
    }
    pool.on_start(ep_idx);
    const auto t0 = core::now();
    if (ctx.head.capacity() <= sizeof(std::string)) ctx.head = w_.take_buffer();  // a stream gave it back
    ctx.head.clear();
    http::append_upstream_request_head(ctx.head, req,
                                       http::UpstreamHeadOptions{
                                           .target = upstream_target(ctx.route, req.target()),
                                           .host_header = ep.cfg->host_header,
                                           .body_bytes = ctx.upstream_body.size(),
                                           .request_id = ctx.request_id,
                                           .api_key = pc.api_key,
                                           .identity = ctx.stream,
                                           // The client's credential is for Weir when Weir authenticates, or
                                           // replaced by the pool's key: either way it never reaches the model server.
                                           .strip_credentials = !pc.api_key.empty() || w_.authenticator() != nullptr,
                                       });
    ctx.t_upstream_sent = core::now();
    added += core::micros_between(t0, ctx.t_upstream_sent);
    failure = co_await exchange_.start({.head = ctx.head,
                                        .body = ctx.upstream_body,
                                        .head_request = head_request,
                                        .first_byte = pc.timeouts.first_byte,
                                        .idle = pc.timeouts.idle});
    if (failure == http::UpstreamFailure::none) {
      started = true;
      break;
    }
    pool.on_finish(ep_idx);
    if (down_.client_gone()) break;
    if (attempts.on_exchange_failure(failure, reused, exchange_.upstream_bytes(), core::now() - ctx.t_upstream_sent)) {
      ++metrics.upstream_retries;
      continue;
    }
    metrics.count_upstream_failure(failure);
    break;
  }
  ctx.retries = attempts.retries();
  ctx.added_us = added;
  const auto ep_idx = attempts.endpoint();
  if (!started || down_.client_gone()) {
    if (started) pool.on_finish(ep_idx);
    exchange_.release();
    ctx.source = nullptr;
    if (down_.client_gone()) co_return Outcome::failed(client_gone(ClientGone::closed));
    co_return Outcome::failed(upstream_error(failure, subject(ctx), false));
  }

  ctx.t_first_byte = core::now();
  ctx.upstream_status = exchange_.head().result_int();
  co_return Outcome::next();
}

}  // namespace weir::gateway
