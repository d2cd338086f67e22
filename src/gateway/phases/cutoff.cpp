// The cutoff watch of a proxied or batched request (proxy.cpp, batch.cpp):
// one timer at the stream's first-token timeout (pools.X.timeouts.first_token),
// a batched non-streamed answer's response timeout (pools.X.timeouts.response),
// or the request's deadline (x-weir-timeout-ms), whichever comes first; when
// it fires, the response source is cancelled, and the relay's outcome then
// becomes the deadline's error or a timeout a fallback may take.
#include <algorithm>

#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

namespace {
// The earlier of two cutoff times, {} meaning none.
core::TimePoint earlier(core::TimePoint a, core::TimePoint b) {
  if (a == core::TimePoint{}) return b;
  if (b == core::TimePoint{}) return a;
  return std::min(a, b);
}
}  // namespace

bool GatewayPhases::arm_cutoff(RequestContext& ctx, bool first_token, core::TimePoint response_by) {
  const auto& pc = ctx.gen->config().pools[ctx.target.pool];
  ctx.cutoff = RequestContext::Cutoff::none;
  ctx.first_token_by = first_token && ctx.stream && pc.timeouts.first_token.count() > 0
                           ? ctx.t_upstream_sent + pc.timeouts.first_token
                           : core::TimePoint{};
  ctx.response_by = response_by;
  const auto at = earlier(earlier(ctx.first_token_by, ctx.response_by), ctx.deadline);
  if (at == core::TimePoint{}) return false;
  if (!ctx.cutoff_watch)
    ctx.cutoff_watch = std::make_unique<core::Watchdog>(w_.io().get_executor(), [this, &ctx] { on_cutoff(ctx); });
  ctx.cutoff_watch->reset_expired();
  ctx.cutoff_watch->expires_at(at);
  return true;
}

void GatewayPhases::on_cutoff(RequestContext& ctx) {
  const auto now = core::now();
  if (core::passed(ctx.deadline, now)) {
    ctx.cutoff = RequestContext::Cutoff::deadline;
  } else if (ctx.first_token_by != core::TimePoint{} &&
             (ctx.resume.active ? !ctx.resume.answered : ctx.t_first_token == core::TimePoint{}) &&
             now >= ctx.first_token_by) {
    // (A resume's stream waits for its own first chunk: the client's first token came long before.)
    ctx.cutoff = RequestContext::Cutoff::first_token;
  } else if (core::passed(ctx.response_by, now)) {
    ctx.cutoff = RequestContext::Cutoff::response;
  } else {
    // The first token came in time: only the deadline (or the response timeout) is left to watch.
    if (const auto at = earlier(ctx.response_by, ctx.deadline); at != core::TimePoint{})
      ctx.cutoff_watch->expires_at(at);
    return;
  }
  // The responder's pending read completes as cancelled; it maps it (respond_stream, respond_buffered). A
  // timeout is the endpoint's failed answer unless judged already (the batch's first token came).
  if (ctx.source && !ctx.source->done()) {
    if (ctx.cutoff != RequestContext::Cutoff::deadline)
      ctx.source->cancel_stalled();
    else
      ctx.source->cancel();
  }
}

Outcome GatewayPhases::after_cutoff(RequestContext& ctx, Outcome o) {
  ctx.cutoff_watch->disarm();
  auto& m = w_.metrics();
  switch (ctx.cutoff) {
    case RequestContext::Cutoff::first_token:
      ++m.first_token_timeouts;
      return o;  // a timeout: a fallback may take it (respond_stream set fail_over)
    case RequestContext::Cutoff::response:
      return o;  // a timeout: a fallback may take it (respond_buffered set fail_over)
    case RequestContext::Cutoff::deadline:
      // Nothing more for this request anywhere: no fallback, and the endpoint is not to blame.
      ++m.deadline_exceeded;
      ctx.fail_over = false;
      if (ctx.verdict_pending) {
        ctx.verdict_pending = false;
        if (ctx.trial) ctx.gen->pool(ctx.target.pool).end_trial(static_cast<std::uint32_t>(ctx.endpoint));
        ctx.trial = false;
      }
      if (o.is_responded()) return o;
      return Outcome::failed(deadline_exceeded(subject(ctx), ctx.deadline_ms, ctx.committed));
    case RequestContext::Cutoff::none:
      break;
  }
  return o;
}

}  // namespace weir::gateway
