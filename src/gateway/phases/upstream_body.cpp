// The upstream request's body (the proxy phase's first step): the client's
// body with at most two members spliced (model, stream_options), translated
// for an Anthropic pool, or a multipart audio body passed on; and the
// upstream target for each route.
#include <algorithm>
#include <charconv>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "api/anthropic/request.hpp"
#include "api/anthropic/upstream_request.hpp"
#include "api/json_scan.hpp"
#include "api/openai/batch.hpp"
#include "api/openai/stream.hpp"
#include "api/responses/request.hpp"
#include "api/tool_ids.hpp"
#include "core/json_text.hpp"
#include "core/multipart.hpp"
#include "core/text.hpp"
#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

std::string_view upstream_target(RouteKind r, bool anthropic_pool, std::string_view client_target) {
  // The upstream's model list, also for one model (respond_buffered picks it: vLLM has no /v1/models/{id});
  // Anthropic's API has one at the same path. GET /version goes as it came (an Anthropic pool's own answer).
  if (r == RouteKind::models) return "/v1/models";
  if (r == RouteKind::version) return client_target;
  if (anthropic_pool) return is_anthropic(r) ? client_target : api::anthropic::messages_path();
  if (r == RouteKind::responses) return api::responses::upstream_path();
  if (r == RouteKind::messages) return api::anthropic::upstream_path(api::anthropic::Target::messages);
  if (r == RouteKind::messages_count_tokens) return api::anthropic::upstream_path(api::anthropic::Target::count_tokens);
  return client_target;
}

bool GatewayPhases::anthropic_pool(const RequestContext& ctx) const {
  return ctx.gen->config().pools[ctx.target.pool].type == core::UpstreamType::anthropic;
}

core::Error GatewayPhases::not_served_by_anthropic(const RequestContext& ctx) const {
  return core::bad_request(
      fmt::format("Model `{}` is served by pool `{}`, an Anthropic Messages API upstream, which has no {} route: use "
                  "/v1/chat/completions, /v1/responses or /v1/messages.",
                  core::utf8_prefix(ctx.model, core::kMaxEchoBytes), ctx.gen->config().pools[ctx.target.pool].name,
                  route_label(ctx.route)),
      "model", "unsupported_route");
}

namespace {

// An error of the chat → Anthropic translation of a Responses request (its
// chat-completions translation is what goes on to Anthropic): the field it
// names is the Responses request's (`text` for response_format, `input` for
// messages, ...), and the message says its path is the translation's, whose
// message indexes are not the request's input items.
core::Error as_responses_error(core::Error e) {
  static constexpr std::pair<std::string_view, std::string_view> kFields[] = {
      {"response_format", "text"},         {"messages", "input"},
      {"max_tokens", "max_output_tokens"}, {"max_completion_tokens", "max_output_tokens"},
      {"reasoning_effort", "reasoning"},
  };
  for (const auto& [chat, responses] : kFields)
    if (e.param == chat) {
      e.param = responses;
      break;
    }
  e.message = fmt::format("{} (in this request's translation to chat completions for an Anthropic model)", e.message);
  return e;
}

}  // namespace

std::optional<core::Error> GatewayPhases::chat_to_anthropic(const RequestContext& ctx, std::size_t pool,
                                                            std::string_view upstream_model, std::string& out,
                                                            std::uint64_t* max_tokens_sent) const {
  // The chat body: the client's, or the Responses request's translation (parse).
  const std::string_view chat = is_responses(ctx.route) ? std::string_view(ctx.edit_buf) : down_.body();
  const api::anthropic::UpstreamRequestOptions o{
      .model = upstream_model.empty() ? std::string_view(ctx.model) : upstream_model,
      .default_max_tokens = ctx.gen->config().pools[pool].anthropic.max_tokens,
      .max_tokens_sent = max_tokens_sent};
  auto r = api::anthropic::chat_to_messages(chat, o, out);
  if (r) return std::nullopt;
  if (is_responses(ctx.route)) return as_responses_error(std::move(r.error()));
  return std::move(r.error());
}

std::optional<core::Error> GatewayPhases::anthropic_to_chat(const RequestContext& ctx, std::string& out,
                                                            bool continuous_usage) const {
  auto fields = api::anthropic::translate_request(
      ctx.route == RouteKind::messages ? api::anthropic::Target::messages : api::anthropic::Target::count_tokens,
      down_.body(), out, continuous_usage);
  if (!fields) return std::move(fields.error());
  return std::nullopt;
}

std::optional<core::Error> GatewayPhases::responses_to_chat(std::string& out, bool vllm) const {
  thread_local std::string echo;  // (the echo is the same for every pool: the parse phase's is kept)
  auto fields = api::responses::translate_request(down_.body(), out, echo, vllm);
  if (echo.capacity() > (64u << 10)) std::string().swap(echo);
  if (!fields) return std::move(fields.error());
  return std::nullopt;
}

std::optional<core::Error> GatewayPhases::translate_for_anthropic(RequestContext& ctx) {
  if (ctx.upstream_body_buf.capacity() == std::string().capacity()) ctx.upstream_body_buf = w_.take_buffer();
  return chat_to_anthropic(ctx, ctx.target.pool, ctx.target.upstream_model, ctx.upstream_body_buf,
                           &ctx.anthropic_max_tokens);
}

std::optional<core::Error> GatewayPhases::prepare_upstream_body(RequestContext& ctx) {
  if (!api_of(ctx.route)) {
    // GET/HEAD (the upstream's model list): a request body means nothing
    // there, and forwarded without a length the upstream would read it as
    // the next request on the connection (request smuggling).
    ctx.upstream_body = {};
    return std::nullopt;
  }
  if (ctx.resume.active) {
    // A resume sends its continuation (begin_resume); the usage chunk asked for stays asked for.
    ctx.upstream_body = ctx.resume.buf->body;
    return std::nullopt;
  }
  const bool anthropic = anthropic_pool(ctx);
  if (anthropic && !served_by_anthropic(ctx.route)) return not_served_by_anthropic(ctx);
  if (is_audio(ctx.route)) {
    prepare_audio_body(ctx);
    return std::nullopt;
  }
  ctx.strip_usage = false;  // decided again per target: pools differ in request_usage
  if (anthropic && !is_anthropic(ctx.route)) {
    // Chat completions or Responses into Anthropic's Messages API (the
    // model named in the translation); the route phase did it for the first target.
    if (!(ctx.anthropic_ready && ctx.fallback_step == 0 && !ctx.batch_split))
      if (auto e = translate_for_anthropic(ctx)) return e;
    ctx.upstream_body = ctx.upstream_body_buf;
    return std::nullopt;
  }
  const bool continuous = ctx.gen->config().pools[ctx.target.pool].continuous_usage;
  if (!anthropic && is_responses(ctx.route) && ctx.chat_continuous != continuous) {
    // Translated for a pool on the other side of the hosted/self-hosted line (the parse phase's first target,
    // or an earlier fallback): this one takes other names (max_tokens or max_completion_tokens, vLLM's members).
    if (auto e = responses_to_chat(ctx.edit_buf, continuous)) return e;
    ctx.chat_continuous = continuous;
  }
  if (!anthropic && is_anthropic(ctx.route) && (!ctx.chat_translated || ctx.chat_continuous != continuous)) {
    // The parse phase only read this request (its first target is an
    // Anthropic pool), or translated it for a pool that differs in
    // continuous_usage (whether it takes vLLM's extensions: a stream's
    // continuous_usage_stats, top_k, thinking's chat_template_kwargs, a
    // prefill's continue_final_message): this OpenAI-compatible target needs its translation.
    if (ctx.edit_buf.capacity() == std::string().capacity()) ctx.edit_buf = w_.take_buffer();
    if (auto e = anthropic_to_chat(ctx, ctx.edit_buf, continuous)) return e;
    ctx.chat_translated = true;
    ctx.chat_continuous = continuous;
  }
  // A translated request's upstream body is its translation (parse phase),
  // which asks a stream for its usage chunk itself; an Anthropic route to an
  // Anthropic pool is the client's body, whose stream always carries usage.
  const bool translated = is_translated(ctx.route) && !anthropic;
  std::string_view body = translated ? std::string_view(ctx.edit_buf) : down_.body();
  if (anthropic && is_anthropic(ctx.route) && body.find("tool_use") != std::string_view::npos) {
    // A conversation begun on an OpenAI-compatible model holds its tool ids, which Anthropic may refuse: made
    // ones it takes (the chat translation a fallback had in edit_buf is made again if another needs it).
    if (ctx.edit_buf.capacity() == std::string().capacity()) ctx.edit_buf = w_.take_buffer();
    if (api::map_tool_ids(body, ctx.edit_buf)) {
      body = ctx.edit_buf;
      ctx.chat_translated = false;
    }
  }
  if (!ctx.target.upstream_model.empty() && ctx.target.upstream_model != ctx.model) {
    ctx.scratch.clear();
    core::append_json_string(ctx.scratch, ctx.target.upstream_model);
    if (ctx.upstream_body_buf.capacity() == std::string().capacity()) ctx.upstream_body_buf = w_.take_buffer();
    if (api::set_member(body, "model", ctx.scratch, ctx.upstream_body_buf)) body = ctx.upstream_body_buf;
  }
  if (!translated && !anthropic && ctx.stream && !ctx.fields.include_usage && ctx.route != RouteKind::embeddings &&
      ctx.gen->config().pools[ctx.target.pool].request_usage) {
    // Ask for the usage chunk so this stream's tokens are known; the client
    // did not ask for it, so the stream hooks drop it from the client's stream.
    if (ctx.edit_buf.capacity() == std::string().capacity()) ctx.edit_buf = w_.take_buffer();
    const auto ask = api::openai::ask_for_usage(body, ctx.fields.has_stream_options, ctx.scratch, ctx.edit_buf);
    if (ask != api::openai::UsageAsk::none) {
      body = ctx.edit_buf;
      ctx.strip_usage = ask == api::openai::UsageAsk::for_weir;
    }
  }
  ctx.upstream_body = body;
  return std::nullopt;
}

void GatewayPhases::prepare_audio_body(RequestContext& ctx) {
  // A speech-to-text form goes up as it came, with two edits: the model
  // field renamed (or added) for the target's upstream_model, and a stream
  // asking for its usage chunk (vLLM's stream_include_usage form field),
  // which the stream hooks then drop from the client's stream. The form
  // parsed in the parse phase, so it parses again here.
  std::string_view body = down_.body();
  ctx.strip_usage = false;
  const auto boundary =
      core::form_boundary(http::first_field(down_.request(), boost::beast::http::field::content_type));
  const bool rename = !ctx.target.upstream_model.empty() && ctx.target.upstream_model != ctx.model;
  if (boundary && rename) {
    const auto parts = core::parse_form(body, *boundary);
    if (parts && !parts->empty()) {
      if (ctx.upstream_body_buf.capacity() == std::string().capacity()) ctx.upstream_body_buf = w_.take_buffer();
      if (const auto* m = core::find_part(*parts, "model"))
        core::replace_part_value(body, *m, ctx.target.upstream_model, ctx.upstream_body_buf);
      else
        core::append_form_field(body, *boundary, parts->back(), "model", ctx.target.upstream_model,
                                ctx.upstream_body_buf);
      body = ctx.upstream_body_buf;
    }
  }
  if (boundary && ctx.stream && !ctx.fields.include_usage && ctx.gen->config().pools[ctx.target.pool].request_usage) {
    const auto parts = core::parse_form(body, *boundary);
    if (parts && !parts->empty()) {
      if (ctx.edit_buf.capacity() == std::string().capacity()) ctx.edit_buf = w_.take_buffer();
      // A client's stream_include_usage=false is replaced, not contradicted by a second field.
      if (const auto* u = core::find_part(*parts, "stream_include_usage"))
        core::replace_part_value(body, *u, "true", ctx.edit_buf);
      else
        core::append_form_field(body, *boundary, parts->back(), "stream_include_usage", "true", ctx.edit_buf);
      body = ctx.edit_buf;
      ctx.strip_usage = true;
      // vLLM sends per-chunk usage (stream_continuous_usage_stats) only with include_usage, so a client that
      // asked for it without include_usage got none: it is turned off, as the client had it in effect (the
      // chat path's ask_for_usage does the same). (upstream_body_buf, the renamed form, is free now.)
      const auto edited = core::parse_form(body, *boundary);
      if (const auto* c = edited ? core::find_part(*edited, "stream_continuous_usage_stats") : nullptr) {
        if (ctx.upstream_body_buf.capacity() == std::string().capacity()) ctx.upstream_body_buf = w_.take_buffer();
        core::replace_part_value(body, *c, "false", ctx.upstream_body_buf);
        body = ctx.upstream_body_buf;
      }
    }
  }
  ctx.upstream_body = body;
}

}  // namespace weir::gateway
