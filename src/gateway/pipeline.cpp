#include "gateway/pipeline.hpp"
#include "core/note.hpp"

#include <exception>

#include <fmt/format.h>

namespace weir::gateway {

namespace {

// Read, authenticate, parse, route and admit, in a frame of its own that is gone before the response: an open
// stream then holds run_pipeline's frame with one pending await, not one with every phase's (memory per
// open stream; GCC 12 gives each co_await of a coroutine its own room in the frame).
core::Task<Outcome> run_front(Phases& p, RequestContext& ctx) {
  Outcome o = co_await p.read(ctx);
  if (o.goes_on()) {
    const auto t0 = ctx.trace_sampled() ? core::now() : core::TimePoint{};
    if (!p.authenticate_now(ctx, o)) o = co_await p.authenticate(ctx);
    // A span when credentials were checked (auth configured, a route that needs it).
    if (ctx.trace_sampled() && (ctx.principal || o.is_failed())) {
      ctx.trace->auth_span = true;
      ctx.trace->auth_start = t0;
      // (A body read after the credentials is not authentication's time: authenticate() set its end.)
      if (ctx.trace->auth_end == core::TimePoint{}) ctx.trace->auth_end = core::now();
      ctx.trace->auth_error = o.is_failed();
    }
  }
  if (o.goes_on()) o = p.parse(ctx);
  if (o.goes_on()) o = p.route(ctx);
  if (o.goes_on()) {
    const auto t0 = ctx.trace_sampled() ? core::now() : core::TimePoint{};
    if (!p.admit_now(ctx, o)) o = co_await p.admit(ctx);
    // A span when admission ran (a principal: limits, budgets, the allow-list).
    if (ctx.trace_sampled() && ctx.principal) {
      ctx.trace->admit_span = true;
      ctx.trace->admit_start = t0;
      ctx.trace->admit_end = core::now();
      ctx.trace->admit_error = o.is_failed();
    }
  }
  co_return o;
}

}  // namespace

core::Task<void> run_pipeline(Phases& p, RequestContext& ctx) {
  Outcome o = Outcome::next();
  try {
    o = co_await run_front(p, ctx);
    if (o.goes_on()) o = co_await p.respond(ctx);
  } catch (const std::exception& ex) {
    // What went wrong stays here: an exception's text may name an
    // upstream's address or a file (a resolver, a socket, a system error),
    // so the client is told only the request id to quote.
    weir::core::note("weir: request {}: internal error: {}\n", ctx.request_id, ex.what());
    o = Outcome::failed(core::internal_error(fmt::format("Internal error (request {}).", ctx.request_id)));
  }
  if (o.goes_on()) o = Outcome::failed(core::internal_error("No phase answered the request."));
  if (o.is_failed()) {
    try {
      co_await p.fail(ctx, o.error());
    } catch (const std::exception&) {
      ctx.set_error(o.error());  // the answer could not be sent; the log still says why
    }
  }
  p.log(ctx);
}

}  // namespace weir::gateway
