// The authenticate phase: JWT (cached key set) or API key → principal
// (docs/auth.md). Weir's own health, readiness and metrics routes need none.
#include <boost/beast/http/field.hpp>

#include "auth/jwks_wait.hpp"
#include "auth/redis_keys.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;
using core::use_task;

core::Task<Outcome> GatewayPhases::authenticate(RequestContext& ctx) {
  Outcome o = co_await check_credentials(ctx);
  if (!ctx.body_deferred) co_return o;
  if (!o.goes_on()) {
    // Refused before "100 Continue": the client may send the body anyway;
    // it is never read, so the connection closes after the answer (lingering).
    down_.no_keep_alive();
    co_return o;
  }
  co_return co_await read_body(ctx);  // (the 100 Continue, then the body)
}

core::Task<Outcome> GatewayPhases::check_credentials(RequestContext& ctx) {
  auto* authn = w_.authenticator();
  if (!authn || !(api_of(ctx.route) || ctx.route == RouteKind::models || ctx.route == RouteKind::version))
    co_return Outcome::next();
  const auto& req = down_.request();
  const auto now = [] { return std::chrono::system_clock::now(); };
  auto p =
      authn->authenticate(http::first_field(req, bh::field::authorization), http::first_field(req, "x-api-key"), now());
  if (!p && authn->refetch_mark()) {
    // The token names a key we do not hold yet (a rotation): wait for the
    // refetch it started, at most 2 s, and try once more.
    co_await auth::async_wait_fetch(*authn->jwks(), *authn->refetch_mark(), std::chrono::seconds(2),
                                    w_.io().get_executor(), use_task);
    p = authn->authenticate(http::first_field(req, bh::field::authorization), http::first_field(req, "x-api-key"),
                            now());
  } else if (!p && authn->key_lookup_pending()) {
    // An API key this worker has not seen: one lookup in Redis (bounded by
    // redis.command_timeout), whose answer the worker caches; then the
    // second authenticate() is final (found, refused, or 503 unavailable).
    co_await auth::async_key_lookup(*authn, w_.io().get_executor(), use_task);
    p = authn->authenticate(http::first_field(req, bh::field::authorization), http::first_field(req, "x-api-key"),
                            now());
  }
  if (!p) co_return Outcome::failed(std::move(p.error()));
  ctx.principal = std::move(*p);
  if (w_.shared().capture) begin_capture(ctx);
  co_return Outcome::next();
}

}  // namespace weir::gateway
