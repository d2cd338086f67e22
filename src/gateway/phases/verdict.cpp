// An answer's verdict for its endpoint's health (routing/health.hpp), when it
// waited past the head (routing::AttemptEnd::judged_later): a stream's is a
// good answer at its first token (respond_stream.cpp), else a failed or good
// one at its end (proxy.cpp), with its time to first token for outlier
// detection (outlier.ttft_factor); a non-streamed answer's is given once its
// body was read (respond_buffered.cpp): failed when the upstream failed it
// (a body cut short, no answer Weir can read, one it cannot decode) or it
// says the pool's model does not exist there, else good.
#include <algorithm>
#include <cstdint>

#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

bool GatewayPhases::stream_answered(const RequestContext& ctx) {
  // A resume's stream is judged at its own first event (the client's first token came long before).
  return ctx.resume.active ? ctx.resume.answered : ctx.t_first_token != core::TimePoint{};
}

void GatewayPhases::judge_first_token(RequestContext& ctx) {
  // The stream's first token: a good answer, now (relay_read), not at the stream's end. A half-open
  // endpoint's trial closes its breaker here, so the pool serves again while that first stream runs on
  // (minutes, for a long generation), and the endpoint's count of failures starts again from it.
  ctx.verdict_pending = false;
  ctx.judged_good = true;
  auto& pool = ctx.gen->pool(ctx.target.pool);
  const auto ep = static_cast<std::uint32_t>(ctx.endpoint);
  const auto now = core::now();
  if (pool.report_answer(ep, /*failed=*/false, now, ctx.trial, ctx.t_upstream_sent)) ++w_.metrics().outlier_ejections;
  ctx.trial = false;
  if (!ctx.resume.active && ctx.t_first_token > ctx.t_upstream_sent &&
      pool.report_ttft(ep,
                       static_cast<std::uint32_t>(std::min<std::int64_t>(
                           core::micros_between(ctx.t_upstream_sent, ctx.t_first_token), 0xffffffff)),
                       now))
    ++w_.metrics().outlier_ejections;
}

void GatewayPhases::judge_answer(RequestContext& ctx, const Outcome& o) {
  // The answer of a stream is judged at its first token (judge_first_token), else at its end (here): a
  // stall or a failure before the first token counts against the endpoint as a failed answer would
  // (routing/health.hpp); a client that left, nothing.
  // The upstream's in-band error event fails the answer wherever it comes (an engine's fault), unless it
  // refused the request (a 4xx in-band: vLLM streams the refusals it finds as the engine takes a request):
  // that is an answer, as a 400 head is, and clears the endpoint's count of failures.
  // A 404 that says the pool's model does not exist on this endpoint (respond_buffered): a replica that does
  // not serve what the pool routes to it, a failed answer though the client gets the 404 as it came.
  const bool refused = ctx.error_relayed && ctx.upstream_refused;
  // An answer over server.max_response is Weir's limit, which the request may have asked past: not the
  // endpoint failing (else a client asking for long answers ejects every healthy endpoint).
  const bool upstream_failed = ctx.model_missing || (!refused && !ctx.over_limit && o.is_failed() &&
                                                     o.error().source == core::ErrorSource::upstream);
  auto& pool = ctx.gen->pool(ctx.target.pool);
  const auto ep = static_cast<std::uint32_t>(ctx.endpoint);
  if (!ctx.verdict_pending) {
    // Judged good at its first token: an in-band error after it still fails the answer (trial slot long given back).
    if (ctx.judged_good && ctx.error_relayed && upstream_failed &&
        pool.report_answer(ep, /*failed=*/true, core::now(), /*trial=*/false, ctx.t_upstream_sent))
      ++w_.metrics().outlier_ejections;
    ctx.judged_good = false;
    return;
  }
  if (stream_answered(ctx)) {  // (its first token came with the read that ended the stream)
    judge_first_token(ctx);
    judge_answer(ctx, o);
    return;
  }
  ctx.verdict_pending = false;
  if (o.is_responded() || upstream_failed || refused) {
    if (pool.report_answer(ep, upstream_failed, core::now(), ctx.trial, ctx.t_upstream_sent))
      ++w_.metrics().outlier_ejections;
  } else if (ctx.trial) {
    pool.end_trial(ep);
  }
  ctx.trial = false;
}

}  // namespace weir::gateway
