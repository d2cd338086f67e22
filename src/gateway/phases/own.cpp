// Weir's own answers: GET /v1/models (configured models and aliases the
// principal may use), /health, /ready, /metrics; and the whole-response
// writer every own answer and error response uses.
#include "gateway/admin.hpp"
#include "gateway/endpoints.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

core::Task<void> GatewayPhases::send_own(RequestContext& ctx, const OwnResponse& r) {
  ctx.status = r.status;
  // An answer before admission (or without it) carries the principal's
  // x-ratelimit-* too: every answer to a tenant's request does.
  if (ctx.principal && ctx.rate_limit_lines.empty() && w_.admission() != nullptr)
    note_rate_limits(ctx, std::chrono::steady_clock::now());
  ctx.head.clear();
  std::string_view extra = r.extra_lines;
  // An answer in Anthropic's shape (dialect_of: its routes, its model list, other paths its SDK asks for): its
  // request-id too, which the Anthropic SDKs read (err.requestID, _request_id); with server.cors, its CORS fields.
  std::string with_id;
  const bool anthropic = dialect_of(ctx) == ErrorDialect::anthropic;
  if (anthropic || !ctx.cors_lines.empty()) {
    with_id = r.extra_lines;
    if (anthropic) http::append_header(with_id, "request-id", ctx.request_id);
    with_id += ctx.cors_lines;
    extra = with_id;
  }
  http::append_own_response_head(ctx.head, r.status, r.content_type, r.body.size(), ctx.request_id,
                                 ctx.rate_limit_lines, extra, down_.connection_mode());
  const std::string_view body = down_.head_request() ? std::string_view{} : r.body;
  // (The request's last bytes: its stream slot is free before the client reads them. Not a batch member's
  // whose prompt is still generated upstream: it is held until that ends, proxy_batched.)
  if (!ctx.answered_lingering) ctx.ticket.release_streams();
  if (!co_await down_.write_all(ctx.head, body)) ctx.status = 499;
}

void GatewayPhases::append_anthropic_request_id(RequestContext& ctx) {
  if (dialect_of(ctx) != ErrorDialect::anthropic) return;
  http::append_header(ctx.head, "request-id", ctx.request_id);
}

core::Task<Outcome> GatewayPhases::serve_own(RequestContext& ctx) {
  if (ctx.route == RouteKind::models) {
    // The whole path: ctx.path is the log's copy, cut to kMaxEchoBytes (a
    // long model id, percent-encoded, passes that).
    auto r = models_response(ctx.gen->config(), path_of(down_.target()), ctx.principal.get(), ctx.anthropic_models,
                             query_of(down_.target()));
    if (!r) co_return Outcome::failed(std::move(r.error()));
    co_await send_own(ctx, {200, "application/json", *r, {}});
  } else if (ctx.route == RouteKind::health) {
    co_await send_own(ctx, {200, "application/json", R"({"status":"ok"})", {}});
  } else if (ctx.route == RouteKind::ready) {
    if (w_.draining()) co_return Outcome::failed(core::unavailable("Weir is draining."));
    if (auto why = ready_problem(*ctx.gen->shared, false); !why.empty())
      co_return Outcome::failed(core::unavailable(std::move(why)));
    co_await send_own(ctx, {200, "application/json", R"({"status":"ready"})", {}});
  } else if (ctx.route == RouteKind::metrics) {  // (client_port: false made it RouteKind::other: read.cpp)
    std::string text;
    co_await collect_metrics_text(w_, text);
    // (Its bytes stay out of weir_response_bytes_total: read() said so, before any 100 Continue.)
    co_await send_own(ctx, {200, "text/plain; version=0.0.4; charset=utf-8", text, {}});
  } else {
    co_return Outcome::failed(core::not_found(ctx.path));
  }
  co_return Outcome::responded();
}

}  // namespace weir::gateway
