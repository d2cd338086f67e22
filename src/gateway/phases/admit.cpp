// The admit phase: the model allow-list, rate limits, stream caps and
// budgets of the principal's tenant and key (docs/admission.md), with
// OpenAI's x-ratelimit-* headers for every answer to the request.
#include <algorithm>
#include <cstdint>

#include "admission/refill.hpp"
#include "api/anthropic/upstream_request.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

using core::use_task;

namespace {

// The model admission prices and checks: the route's canonical name, else the one asked for.
std::string_view admit_model(const RequestContext& ctx) {
  return ctx.target.canonical.empty() ? std::string_view(ctx.model) : ctx.target.canonical;
}

// max_tokens × sequences × prompts (sequences: max(n, best_of), what the upstream generates), saturated at
// 2^53 tokens (a count any bucket or budget refuses, and exact as a double): each factor may be up to
// 2^32 − 1, and a product that wrapped (2^31 · 2^31 · 4 is 0 mod 2^64) would reserve nothing against the
// limits it must pass.
std::uint64_t completion_estimate(std::uint64_t max_tokens, std::uint64_t sequences, std::uint64_t prompts) {
  constexpr std::uint64_t kMax = std::uint64_t{1} << 53;
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  if (__builtin_mul_overflow(max_tokens, sequences, &a) || __builtin_mul_overflow(a, prompts, &b)) return kMax;
  return std::min(b, kMax);
}

// a + b × c, saturated at 2^53 (as completion_estimate).
std::uint64_t plus_product(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  constexpr std::uint64_t kMax = std::uint64_t{1} << 53;
  std::uint64_t p = 0;
  std::uint64_t s = 0;
  if (__builtin_mul_overflow(b, c, &p) || __builtin_add_overflow(a, p, &s)) return kMax;
  return std::min(s, kMax);
}

}  // namespace

std::uint64_t GatewayPhases::default_completion(const RequestContext& ctx) const {
  const auto& pools = ctx.gen->config().pools;
  // A chat or Responses request to an Anthropic pool is sent max_tokens (pools.X.anthropic.max_tokens, with
  // reasoning_effort's thinking budget on top): the cap Anthropic honours, exact for the first target (its
  // translation, made by route, says what it sent), at most default_answer_cap for a fallback. An
  // OpenAI-compatible server's is its own (vLLM: the context left), so the model's default_max_tokens is
  // assumed, or the request's min_tokens when that is more (vLLM holds the end back until then).
  const bool translated = !is_anthropic(ctx.route) && served_by_anthropic(ctx.route);
  const std::uint64_t openai_cap = std::max<std::uint64_t>(ctx.target.default_max_tokens, ctx.fields.min_tokens);
  const auto cap_of = [&](std::size_t pool, bool first) -> std::uint64_t {
    if (!translated || pools[pool].type != core::UpstreamType::anthropic) return openai_cap;
    if (first) return ctx.anthropic_ready ? ctx.anthropic_max_tokens : 0;  // (not ready: the target is passed over)
    const std::string_view chat = is_responses(ctx.route) ? std::string_view(ctx.edit_buf) : down_.body();
    return api::anthropic::default_answer_cap(chat, pools[pool].anthropic.max_tokens);
  };
  // Whichever target answers: the most of them (as reserve_for_fallbacks takes the dearest price).
  std::uint64_t cap = cap_of(ctx.target.pool, true);
  const std::size_t chain = std::min<std::size_t>(ctx.target.fallbacks.size(), ctx.fallback_limit);
  for (std::size_t i = 0; i < chain; ++i) cap = std::max(cap, cap_of(ctx.target.fallbacks[i].pool, false));
  return cap;
}

std::optional<Outcome> GatewayPhases::admit_checks(RequestContext& ctx, admission::TokenEstimate& estimate) {
  const auto api = api_of(ctx.route);
  if (!api) return Outcome::next();
  const auto& f = ctx.fields;
  // Completion budget when the request gives no max_tokens: the cap Weir sends (an Anthropic pool's), else
  // the route's default (models.X.default_max_tokens) or min_tokens, corrected by settle() with the real usage.
  const std::uint64_t out_tokens =
      *api == api::ApiKind::embeddings || *api == api::ApiKind::vllm_extra || *api == api::ApiKind::audio ||
              ctx.route == RouteKind::messages_count_tokens || f.echo_only
          ? 0
          : completion_estimate(f.max_tokens ? f.max_tokens : default_completion(ctx), f.sequences(), f.prompt_count);
  // Tokenizing and counting tokens run no model: they cost no tokens (but
  // count against request limits; docs/protocols.md).
  const bool free = ctx.route == RouteKind::tokenize || ctx.route == RouteKind::detokenize ||
                    ctx.route == RouteKind::messages_count_tokens;
  // Media parts at the model's media_tokens each: their bytes (a URL, base64) say nothing of their tokens.
  estimate = admission::TokenEstimate::of(
      free ? 0 : f.prompt_bytes, out_tokens,
      free ? 0 : plus_product(f.prompt_overhead_tokens, f.media_parts, ctx.target.media_tokens));
  // A route that uses tokens is never estimated at none (an audio stream without a prompt, a body whose texts
  // are all media): a take of 0 would pass a tokens bucket that settled usage left in debt.
  if (!free && estimate.total() == 0) estimate.prompt_tokens = 1;
  ctx.prompt_tokens_estimate = estimate.prompt_tokens;
  ctx.completion_cap = f.max_tokens ? completion_estimate(f.max_tokens, f.sequences(), f.prompt_count) : 0;
  if (!ctx.principal) return Outcome::next();
  const admission::Pricing& prices = ctx.gen->pricing();  // the ticket points into it: the request holds it
  ctx.price = prices.find(admit_model(ctx));
  reserve_for_fallbacks(ctx, prices);
  // (A named model the principal may not use was answered in route, as an unknown one: what is left to refuse
  // here is a request without a model from a principal restricted to some, the 403.)
  if (auto ok = auth::Authenticator::check_model(*ctx.principal, admit_model(ctx)); !ok) {
    ctx.refused_by = auth::Authenticator::refusing_list(*ctx.principal, admit_model(ctx));
    return Outcome::failed(std::move(ok.error()));
  }
  return std::nullopt;
}

Outcome GatewayPhases::admit_result(RequestContext& ctx, tl::expected<admission::Ticket, core::Error> t,
                                    std::chrono::steady_clock::time_point now) {
  // OpenAI's x-ratelimit-* headers go on every answer to this request, a 429 included.
  note_rate_limits(ctx, now);
  if (!t) return Outcome::failed(std::move(t.error()));
  ctx.ticket = std::move(*t);
  return Outcome::next();
}

void GatewayPhases::note_rate_limits(RequestContext& ctx, std::chrono::steady_clock::time_point now) {
  ctx.rate_limit_lines.clear();
  const auto h = w_.admission()->rate_limit_headers(*ctx.principal, now);
  if (h.has_requests) admission::append_rate_limit_headers(ctx.rate_limit_lines, "requests", h.requests);
  if (h.has_tokens) admission::append_rate_limit_headers(ctx.rate_limit_lines, "tokens", h.tokens);
}

bool GatewayPhases::admit_now(RequestContext& ctx, Outcome& o) {
  admission::TokenEstimate estimate;
  if (auto r = admit_checks(ctx, estimate)) {
    o = std::move(*r);
    return true;
  }
  // Limits shared through Redis may ask for a wait (a limiter answers
  // `pending` only there): admit() takes it.
  if (w_.shared().redis_limiter) return false;
  const auto now = std::chrono::steady_clock::now();
  o = admit_result(ctx,
                   w_.admission()->admit(*ctx.principal, admit_model(ctx), estimate, now, nullptr, &ctx.gen->pricing(),
                                         ctx.has_reserve_price ? &ctx.reserve_price : nullptr),
                   now);
  return true;
}

core::Task<Outcome> GatewayPhases::admit(RequestContext& ctx) {
  admission::TokenEstimate estimate;
  if (auto o = admit_checks(ctx, estimate)) co_return std::move(*o);
  auto* adm = w_.admission();
  const admission::Pricing& prices = ctx.gen->pricing();
  auto now = std::chrono::steady_clock::now();
  admission::Shortfall wait;
  const admission::ModelPrice* reserve_at = ctx.has_reserve_price ? &ctx.reserve_price : nullptr;
  auto t = adm->admit(*ctx.principal, admit_model(ctx), estimate, now, &wait, &prices, reserve_at);
  if (!t && wait.pending) {
    // A shared (Redis) limit: this replica's lease is short but the shared
    // bucket may cover it. Wait for refills while the answer is pending, up
    // to the limiter's refill_patience(); the answer after that is final.
    t = co_await admission::admit_after_refills(
        *w_.shared().limiter, wait, w_.index(), w_.io().get_executor(), [&](admission::Shortfall* again) {
          now = std::chrono::steady_clock::now();
          return adm->admit(*ctx.principal, admit_model(ctx), estimate, now, again, &prices, reserve_at);
        });
  }
  co_return admit_result(ctx, std::move(t), now);
}

}  // namespace weir::gateway
