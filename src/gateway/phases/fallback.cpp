// The fallback chain (models.X.fallbacks, docs/reliability.md): which
// target may take a request next (its principal may use the model, and the
// target's API can carry the body), moving to it, and a held stream's retry
// on its own pool before any fallback.
#include <algorithm>
#include <string>
#include <utility>

#include "auth/authenticator.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

namespace {

// A {model: M} fallback takes the request only if its principal may use M,
// as if it had asked for M (a tenant could otherwise reach a model its
// allow-list refuses by making its own model fail).
bool may_take(const RequestContext& ctx, const core::FallbackTarget& fb) {
  return fb.model.empty() || !ctx.principal || auth::Authenticator::check_model(*ctx.principal, fb.model).has_value();
}

}  // namespace

bool GatewayPhases::takes_request(const RequestContext& ctx, std::size_t step) const {
  const core::FallbackTarget& fb = ctx.target.fallbacks[step];
  const auto& pc = ctx.gen->config().pools[fb.pool];
  const bool anthropic = pc.type == core::UpstreamType::anthropic;
  // Same API as the client's: the body goes as it came (a model renamed); a Responses request's translation
  // made for a pool on the same side of the hosted/self-hosted line goes as it is.
  const bool retranslated = is_responses(ctx.route) && !anthropic && pc.continuous_usage != ctx.chat_continuous;
  if (anthropic ? is_anthropic(ctx.route) : (!is_anthropic(ctx.route) && !retranslated) || ctx.chat_translated)
    return true;
  const std::uint64_t bit = step < 64 ? std::uint64_t{1} << step : 0;
  if ((ctx.fallbacks_judged & bit) != 0) return (ctx.fallbacks_refused & bit) == 0;
  // The translation prepare_upstream_body will make for it, into scratch storage.
  thread_local std::string scratch;
  bool ok = false;
  if (retranslated)
    ok = !responses_to_chat(scratch, pc.continuous_usage);  // to the other side of the hosted line
  else if (!anthropic)
    ok = !anthropic_to_chat(ctx, scratch);  // an Anthropic client's request to an OpenAI-compatible pool
  else if (served_by_anthropic(ctx.route))
    ok = !chat_to_anthropic(ctx, fb.pool, fb.upstream_model, scratch);  // chat or Responses to Messages
  if (scratch.capacity() > (64u << 10)) std::string().swap(scratch);
  ctx.fallbacks_judged |= bit;
  if (!ok) ctx.fallbacks_refused |= bit;
  return ok;
}

std::size_t GatewayPhases::next_allowed(const RequestContext& ctx, std::size_t step, std::size_t chain) const {
  while (step < chain && !(may_take(ctx, ctx.target.fallbacks[step]) && takes_request(ctx, step))) ++step;
  return step;
}

bool GatewayPhases::fallback_left(const RequestContext& ctx) const {
  const std::size_t chain = std::min<std::size_t>(ctx.target.fallbacks.size(), ctx.fallback_limit);
  return next_allowed(ctx, ctx.fallback_step, chain) < chain && !down_.client_gone();
}

void GatewayPhases::next_target(RequestContext& ctx) {
  const std::size_t chain = std::min<std::size_t>(ctx.target.fallbacks.size(), ctx.fallback_limit);
  ctx.fallback_step = static_cast<std::uint8_t>(next_allowed(ctx, ctx.fallback_step, chain));
  const auto& fb = ctx.target.fallbacks[ctx.fallback_step++];
  ctx.pool_tries = 0;
  ctx.pool_avoid.clear();
  ctx.pool_failed.clear();
  ctx.target.pool = static_cast<std::uint32_t>(fb.pool);
  ctx.target.upstream_model = fb.upstream_model;
  ctx.pool = static_cast<int>(fb.pool);
  if (ctx.principal) {
    // The model that answers sets the price from here on: M for {model: M}, the request's own for {pool: P}
    // (which runs it under its upstream name), whatever an earlier step moved it to. The reservation covered
    // the dearest of them (reserve_for_fallbacks).
    const std::string_view own = ctx.target.canonical.empty() ? std::string_view(ctx.model) : ctx.target.canonical;
    ctx.price = ctx.gen->pricing().find(fb.model.empty() ? own : std::string_view(fb.model));
    ctx.ticket.reprice(ctx.price);
  }
  ctx.endpoint = -1;
  // Nothing of the failed target reached the client (a fail-over happens
  // only then): what its answer was is not the request's. Its 2xx head is no
  // head of this request's (settle() charges by it), and a stream it sent a
  // non-streamed request does not make the fallback's request a stream
  // (stream_options on a stream:false body is a 400 from vLLM); nor is the
  // usage it reported (a usage chunk before the stream broke) the answer's.
  ctx.upstream_status = 0;
  ctx.stream = ctx.fields.stream;
  ctx.has_usage = false;
  ctx.usage = {};
  ctx.usage_invalid = false;
  ctx.said_prompt = ctx.said_completion = false;
  ctx.has_choice_usage = false;
  ctx.choice_usage = {};
  ctx.completion_text_bytes = 0;  // (nor the text of its answer: none of it reached the client)
  ctx.text_frame = std::string_view::npos;
  // (A target passed over before anything was sent to it, its API unable to carry the request, is no retry.)
  if (std::exchange(ctx.target_refused, false)) return;
  ++ctx.retries;
  ++w_.metrics().upstream_fallbacks;
}

void GatewayPhases::reserve_for_fallbacks(RequestContext& ctx, const admission::Pricing& prices) const {
  ctx.has_reserve_price = false;
  const std::size_t chain = std::min<std::size_t>(ctx.target.fallbacks.size(), ctx.fallback_limit);
  for (std::size_t i = 0; i < chain; ++i) {
    const auto& fb = ctx.target.fallbacks[i];
    if (fb.model.empty() || !may_take(ctx, fb)) continue;
    const admission::ModelPrice* p = prices.find(fb.model);
    if (p == ctx.price || p == nullptr) continue;
    if (!ctx.has_reserve_price) {
      ctx.reserve_price = ctx.price ? *ctx.price : admission::ModelPrice{};
      ctx.has_reserve_price = true;
    }
    ctx.reserve_price.input = std::max(ctx.reserve_price.input, p->input);
    ctx.reserve_price.output = std::max(ctx.reserve_price.output, p->output);
    ctx.reserve_price.cached_input = std::max(ctx.reserve_price.cached_input, p->cached_input);
    ctx.reserve_price.cache_write = std::max(ctx.reserve_price.cache_write, p->cache_write);
    ctx.reserve_price.cache_write_1h = std::max(ctx.reserve_price.cache_write_1h, p->cache_write_1h);
  }
}

bool GatewayPhases::retry_held_on_pool(RequestContext& ctx) {
  const auto f = std::exchange(ctx.held_failure, http::UpstreamFailure::none);  // this relay's, or none
  // As attempt_pool retries a failure before the head (routing::Attempts::
  // on_exchange_failure): a reset or a timeout (the first token's), not an
  // invalid answer; never past the request's own deadline.
  if (f != http::UpstreamFailure::reset && f != http::UpstreamFailure::timeout) return false;
  if (ctx.cutoff == RequestContext::Cutoff::deadline || down_.client_gone() || ctx.resume.active) return false;
  if (ctx.endpoint < 0) return false;
  if (ctx.pool_tries >= ctx.gen->config().pools[ctx.target.pool].retry.attempts) return false;
  ctx.pool_avoid.insert(static_cast<std::uint32_t>(ctx.endpoint));
  ctx.held_failure = f;  // attempt_pool counts the retry by it, once it has an endpoint for it
  return true;
}

}  // namespace weir::gateway
