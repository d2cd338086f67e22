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
    // Refused before the body (or before "100 Continue"): the body is never
    // read, so the connection closes after the answer, lingering over what
    // the client still sends (Downstream::lingering_close).
    down_.no_keep_alive();
    co_return o;
  }
  if (ctx.trace_sampled()) ctx.trace->auth_end = core::now();
  co_return co_await read_body(ctx);  // (the 100 Continue, then the body; decoded and captured by parse())
}

bool GatewayPhases::authenticate_now(RequestContext& ctx, Outcome& o) {
  if (ctx.body_deferred) return false;  // the credentials, then "100 Continue" and the body: authenticate()
  auto r = credentials_now(ctx);
  credentials_pending_ = !r;
  if (r) o = std::move(*r);
  return r.has_value();
}

std::optional<Outcome> GatewayPhases::credentials_now(RequestContext& ctx) {
  auto* authn = w_.authenticator();
  if (!authn || !(api_of(ctx.route) || ctx.route == RouteKind::models || ctx.route == RouteKind::version))
    return Outcome::next();
  const auto& req = down_.request();
  // One credential per request: Authorization is a singleton field (RFC
  // 9110 §11.6.2), and a proxy in front that checks the last of two must
  // not be outvoted by the first.
  if (authn->verifies_credentials() && (req.count(bh::field::authorization) > 1 || req.count("x-api-key") > 1))
      [[unlikely]]
    return Outcome::failed(
        core::bad_request("The request has more than one Authorization or x-api-key header; send one credential."));
  auto p = authn->authenticate(http::first_field(req, bh::field::authorization), http::first_field(req, "x-api-key"),
                               std::chrono::system_clock::now());
  if (!p && (authn->refetch_mark() || authn->key_lookup_pending())) return std::nullopt;
  return accept_credentials(ctx, std::move(p));
}

Outcome GatewayPhases::accept_credentials(RequestContext& ctx, tl::expected<auth::PrincipalPtr, core::Error> p) {
  if (!p) {
    if (const auto& who = w_.authenticator()->refused_identity())
      ctx.refused = std::make_unique<auth::RefusedIdentity>(*who);
    return Outcome::failed(std::move(p.error()));
  }
  ctx.principal = std::move(*p);  // (the body is captured once decoded: parse())
  return Outcome::next();
}

core::Task<Outcome> GatewayPhases::check_credentials(RequestContext& ctx) {
  if (!std::exchange(credentials_pending_, false)) {
    if (auto o = credentials_now(ctx)) co_return std::move(*o);
  }
  // credentials_now() stopped at a wait; the authenticator says which.
  auto* authn = w_.authenticator();
  if (authn->refetch_mark()) {
    // The token names a key we do not hold yet (a rotation): wait for the
    // refetch it started, at most 2 s, and try once more.
    co_await auth::async_wait_fetch(*authn->jwks(), *authn->refetch_mark(), std::chrono::seconds(2),
                                    w_.io().get_executor(), use_task);
  } else {
    // An API key this worker has not seen: one lookup in Redis (bounded by
    // redis.command_timeout), whose answer the worker caches; then the
    // second authenticate() is final (found, refused, or 503 unavailable).
    co_await auth::async_key_lookup(*authn, w_.io().get_executor(), use_task);
  }
  // A client that left during the wait left first: 499, whatever the credential turns out to be.
  if (down_.left_by_now()) co_return Outcome::failed(client_gone(why_gone()));
  const auto& req = down_.request();
  co_return accept_credentials(
      ctx, authn->authenticate(http::first_field(req, bh::field::authorization), http::first_field(req, "x-api-key"),
                               std::chrono::system_clock::now()));
}

}  // namespace weir::gateway
