// The pool's admission queue (pools.X.queue) for proxied requests: a
// request's place by priority, its wait within max_wait and the request's
// deadline, and the shed answers (routing::PoolQueue holds the policy).
#include <algorithm>
#include <charconv>

#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"
#include "http/headers.hpp"

namespace weir::gateway {

void GatewayPhases::leave_queue(RequestContext& ctx) {
  if (ctx.queue_pool < 0) return;
  auto& pool = ctx.gen->pool(static_cast<std::uint32_t>(ctx.queue_pool));
  ctx.queue_pool = -1;
  pool.queue()->done();
  pool.dispatch_queue(core::now());  // its place goes to the next one waiting
}

core::Task<Outcome> GatewayPhases::enter_pool(RequestContext& ctx, std::string_view batch_key, bool coalesce,
                                              QueueStay* stay) {
  auto& pool = ctx.gen->pool(ctx.target.pool);
  routing::PoolQueue& q = *pool.queue();
  const auto& qc = q.config();
  auto& m = w_.metrics();
  const auto now = core::now();
  // The request's priority: its tenant's, or lower by x-weir-priority
  // (without auth the header sets it: there is no tenant to cap it).
  // (The header was read, and a bad one refused, by the route phase.)
  int priority = ctx.principal ? ctx.principal->priority() : 0;
  if (ctx.priority_asked >= 0)
    priority = ctx.principal ? std::min<int>(priority, ctx.priority_asked) : ctx.priority_asked;
  // Every endpoint's breaker open: the attempts answer at once (a fallback, or 503).
  if (pool.policy().breaker() && !pool.any_available(now)) co_return Outcome::next();
  const bool saturated = pool.saturated(now);
  if (q.try_enter(saturated)) {
    ctx.queue_pool = static_cast<int>(ctx.target.pool);
    co_return Outcome::next();
  }
  const auto reason = saturated ? ShedReason::saturated : ShedReason::queue_full;
  const auto shed = [&](ShedReason r) {
    m.count_shed(ctx.gen->pool_slot(ctx.target.pool), r);
    return Outcome::failed(overloaded(subject(ctx), r, qc.shed_status, qc.retry_after));
  };
  if (fallback_left(ctx)) {
    // The next target may have room: it takes the request rather than this
    // queue (logged as this pool's attempt, nothing sent, as a pool whose
    // every breaker is open).
    ctx.record_attempt(
        {.pool = static_cast<std::int16_t>(ctx.target.pool), .failure = http::UpstreamFailure::overloaded});
    ctx.fail_over = true;
    co_return Outcome::failed(overloaded(subject(ctx), reason, qc.shed_status, qc.retry_after));
  }
  // Its place in the queue, in this wait's frame (not the request's context: an open stream does not carry it).
  routing::QueueWaiter waiter;
  waiter.priority = priority;
  waiter.batch_key = batch_key;
  waiter.coalesce = coalesce;
  if (ctx.principal) waiter.flow = ctx.principal->tenant_name();  // served in turn with other tenants' requests
  core::Timer timer(w_.io().get_executor());
  waiter.timer = &timer;
  routing::QueueWaiter* displaced = nullptr;
  if (!q.push(waiter, displaced)) co_return shed(reason);
  w_.tick_soon();  // the tick lets it through when the gate opens without a request leaving
  // (A displaced waiter counts its own shedding when it wakes.)
  // However the wait ends, the waiter is no longer linked after it.
  struct Unlink {
    routing::PoolQueue& q;
    routing::QueueWaiter& waiter;
    RequestContext& ctx;
    ~Unlink() {
      q.leave(waiter);
      waiter.timer = nullptr;
      ctx.backoff = nullptr;
    }
  } unlink{q, waiter, ctx};
  ++m.queued(ctx.gen->pool_slot(ctx.target.pool));
  if (stay && stay->since == core::TimePoint{}) stay->since = now;
  auto until = (stay ? stay->since : now) + qc.timeout;
  if (ctx.deadline != core::TimePoint{} && ctx.deadline < until) until = ctx.deadline;
  timer.expires_at(until);
  ctx.backoff = &timer;  // on_client_gone cancels it
  co_await timer.async_wait(core::use_task);
  ctx.backoff = nullptr;
  switch (waiter.verdict) {
    case routing::QueueWaiter::Verdict::admitted:
      if (waiter.holds_room) pool.admitted_resumed();
      ctx.queue_pool = static_cast<int>(ctx.target.pool);
      if (down_.client_gone()) co_return Outcome::failed(client_gone(why_gone()));
      co_return Outcome::next();
    case routing::QueueWaiter::Verdict::joined:  // a batch it can join opened: it goes with that one's place
      if (down_.client_gone()) co_return Outcome::failed(client_gone(why_gone()));
      if (stay) stay->let_out = true;
      co_return Outcome::next();
    case routing::QueueWaiter::Verdict::shed:
      co_return shed(pool.saturated(core::now()) ? ShedReason::saturated : ShedReason::queue_full);
    default:
      break;
  }
  if (down_.client_gone()) co_return Outcome::failed(client_gone(why_gone()));
  if (core::passed(ctx.deadline, core::now())) {
    ++m.deadline_exceeded;
    co_return Outcome::failed(deadline_exceeded(subject(ctx), ctx.deadline_ms));
  }
  co_return shed(ShedReason::queue_timeout);
}

}  // namespace weir::gateway
