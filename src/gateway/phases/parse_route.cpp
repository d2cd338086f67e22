// The parse and route phases: the JSON body's fields (api/request.hpp),
// then model → pool (routing/route_table.hpp). An Anthropic or Responses
// request is translated here into the upstream's chat-completions body
// (api/anthropic/, api/responses/), and a chat or Responses request whose
// model is served by an Anthropic pool into Anthropic's Messages API
// (api/anthropic/upstream_request.hpp); a speech-to-text request's form is
// read for its model and stream fields.
#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <boost/beast/http/field.hpp>

#include <boost/json/parse.hpp>

#include "api/anthropic/request.hpp"
#include "api/anthropic/upstream_request.hpp"
#include "api/json_scan.hpp"
#include "api/responses/request.hpp"
#include "core/saturating.hpp"
#include "gateway/admin.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

namespace {
constexpr std::uint32_t kMaxTimeoutMs = 86'400'000;
}  // namespace

bool GatewayPhases::proxied(const RequestContext& ctx) const {
  if (api_of(ctx.route) || ctx.route == RouteKind::version) return true;
  // Quick mode: the upstream knows its models.
  const auto& cfg = ctx.gen->config();
  return ctx.route == RouteKind::models && cfg.models.empty() && cfg.default_pool;
}

namespace {
// The metrics' model slot of a route found for the request's model.
std::uint32_t model_slot_of(const RequestContext& ctx, const routing::Route& r) {
  return r.model_index == routing::kUnlistedModel ? MetricsShard::unlisted_model()
                                                  : ctx.gen->labels().model_slot[r.model_index];
}

// Whether the principal may use `model`, whose route is `r` (a request without a principal may use any):
// the allow-list check admission makes, on the route's canonical name.
tl::expected<void, core::Error> check_model(const RequestContext& ctx, std::string_view model,
                                            const routing::Route& r) {
  if (!ctx.principal) return {};
  return auth::Authenticator::check_model(*ctx.principal, r.canonical.empty() ? model : r.canonical);
}

// The route the client may know of for `model`: none for a model the principal may not use, as for one that
// does not exist, so that nothing it is answered (an error's status and code, which parser reads its body)
// tells a tenant which models and aliases are configured for others.
std::optional<routing::Route> usable_route(const RequestContext& ctx, std::string_view model) {
  auto r = ctx.gen->routes().find(model);
  if (r && !model.empty() && !check_model(ctx, model, *r)) return std::nullopt;
  return r;
}

// The body's top-level `model` string, unescaped ("" when there is none or
// the body is not JSON: the full parse then says why).
std::string peek_model(std::string_view body) {
  const auto span = api::find_member(body, "model");
  if (!span) return {};
  const std::string_view v = body.substr(span->value_begin, span->value_end - span->value_begin);
  if (v.size() < 2 || v.front() != '"') return {};
  if (v.find('\\') == std::string_view::npos) return std::string(v.substr(1, v.size() - 2));
  boost::system::error_code ec;
  const auto parsed = boost::json::parse(boost::json::string_view(v.data(), v.size()), ec);
  return !ec && parsed.is_string() ? std::string(parsed.get_string()) : std::string();
}
// A JSON route's body is read as JSON when its Content-Type says so (application/json, or application/*+json,
// RFC 6839) or there is none, as vLLM's FastAPI reads it; any other media type (text/plain, a form: curl -d
// without -H) vLLM refuses after a round trip: here, before the request is admitted and charged.
bool json_media_type(std::string_view content_type) {
  const std::string_view type = core::trim_ows(content_type.substr(0, content_type.find(';')));
  if (type.empty()) return true;
  constexpr std::string_view kApp = "application/";
  if (type.size() <= kApp.size() || !core::iequals(type.substr(0, kApp.size()), kApp)) return false;
  const std::string_view sub = type.substr(kApp.size());
  return core::iequals(sub, "json") || (sub.size() > 5 && core::iequals(sub.substr(sub.size() - 5), "+json"));
}

}  // namespace

Outcome GatewayPhases::parse(RequestContext& ctx) {
  const auto api = api_of(ctx.route);
  // The body, decoded once the credentials passed (an API route's); the request log's copy starts then.
  if (api)
    if (auto o = decode_body(ctx); !o.goes_on()) return o;
  if (w_.shared().capture) begin_capture(ctx);
  // An Anthropic SDK's models.list() page (limit, after_id, before_id): a bad one is refused here, before a
  // model list that comes from the upstream is fetched (a cursor naming no model is seen with the list).
  if (ctx.anthropic_models && ctx.route == RouteKind::models && !path_of(down_.target()).starts_with("/v1/models/"))
    if (auto page = anthropic_page(query_of(down_.target())); !page) return Outcome::failed(std::move(page.error()));
  if (!api) return Outcome::next();
  if (*api != api::ApiKind::audio) {
    const std::string_view ct = http::first_field(down_.request(), boost::beast::http::field::content_type);
    if (!json_media_type(ct)) return refused_body(ctx, core::unsupported_media_type(ct));
  }
  // A translated route's first pool: its translation is made for it (prepare_upstream_body makes it again for a
  // fallback pool that differs in continuous_usage: self-hosted or hosted, api/responses/request.hpp).
  bool continuous = false;
  if (is_responses(ctx.route)) {
    const auto r = usable_route(ctx, peek_model(down_.body()));
    continuous = !r || ctx.gen->config().pools[r->pool].continuous_usage;
  }
  if (is_anthropic(ctx.route)) {
    // An Anthropic request to an Anthropic pool goes as it came: read what
    // the gateway needs, leave the rest to the upstream (which accepts more
    // than the chat translation can express). Its translation for an
    // OpenAI-compatible fallback, if it gets that far, is made then (proxy).
    const auto r = usable_route(ctx, peek_model(down_.body()));
    continuous = r && ctx.gen->config().pools[r->pool].continuous_usage;
    if (r && ctx.gen->config().pools[r->pool].type == core::UpstreamType::anthropic) {
      auto fields = api::anthropic::read_messages_request(down_.body(), ctx.route == RouteKind::messages_count_tokens);
      if (!fields) return refused_body(ctx, std::move(fields.error()));
      ctx.fields = std::move(*fields);
      ctx.model = std::move(ctx.fields.model);
      ctx.stream = ctx.fields.stream;
      return Outcome::next();
    }
  }
  if (is_translated(ctx.route)) {
    // The translation is the upstream body: it goes in a lent buffer until the commit point.
    if (ctx.edit_buf.capacity() == std::string().capacity()) ctx.edit_buf = w_.take_buffer();
    auto fields =
        is_responses(ctx.route)
            ? api::responses::translate_request(down_.body(), ctx.edit_buf, ctx.extra().responses_echo, continuous)
            : api::anthropic::translate_request(ctx.route == RouteKind::messages ? api::anthropic::Target::messages
                                                                                 : api::anthropic::Target::count_tokens,
                                                down_.body(), ctx.edit_buf, continuous);
    if (!fields) return refused_body(ctx, std::move(fields.error()));
    ctx.fields = std::move(*fields);
    ctx.model = std::move(ctx.fields.model);
    ctx.stream = ctx.fields.stream;
    ctx.chat_translated = is_anthropic(ctx.route);
    ctx.chat_continuous = continuous;
    return Outcome::next();
  }
  if (*api == api::ApiKind::audio) [[unlikely]] {
    // The form's boundary is the Content-Type's: two lines would let Weir read the form by one and the
    // upstream (or a proxy after Weir) by the other.
    bool repeated = false;
    (void)http::only_field(down_.request(), "content-type", repeated);
    if (repeated)
      return refused_body(ctx, core::bad_request("The request has more than one Content-Type line: a form "
                                                 "needs exactly one (its boundary)."));
  }
  auto fields = *api == api::ApiKind::audio
                    ? api::parse_audio_request(
                          http::first_field(down_.request(), boost::beast::http::field::content_type), down_.body())
                    : api::parse_request(*api, down_.body());
  if (!fields) return refused_body(ctx, std::move(fields.error()));
  ctx.fields = std::move(*fields);
  ctx.model = std::move(ctx.fields.model);
  ctx.stream = ctx.fields.stream;
  if (!ctx.fields.request_id.empty()) [[unlikely]]
    take_body_request_id(ctx);
  return Outcome::next();
}

Outcome GatewayPhases::refused_body(RequestContext& ctx, core::Error e) {
  // The log, the request log, the span and the metrics name the model the
  // client sent (as for a refusal after routing), though its body was refused.
  if (ctx.model.empty()) {
    ctx.model = peek_model(down_.body());  // ("" for a body that is no JSON object: a form)
    if (const auto r = ctx.gen->routes().find(ctx.model); r && !ctx.model.empty())
      ctx.model_slot = model_slot_of(ctx, *r);
  }
  return Outcome::failed(std::move(e));
}

Outcome GatewayPhases::route(RequestContext& ctx) {
  if (!proxied(ctx)) return Outcome::next();
  if (!api_of(ctx.route)) {
    // GET /v1/models in quick mode, GET /version: the default pool, else the first one.
    ctx.target = routing::Route{};
    ctx.target.pool = static_cast<std::uint32_t>(ctx.gen->config().default_pool.value_or(0));
    ctx.pool = static_cast<int>(ctx.target.pool);
    return Outcome::next();
  }
  // A body without a model (chat, completions, embeddings, vLLM's extra routes, speech to text: vLLM answers
  // them with its served model) goes as it came to the default pool, whose upstream picks the model; without
  // one there is nothing to route it by. (Anthropic's and the Responses API's bodies require a model: parse.)
  if (ctx.model.empty() && !ctx.gen->config().default_pool)
    return Outcome::failed(core::bad_request(
        "you must provide a model parameter: Weir routes this request by it (or configure a default_pool)", "model"));
  auto r = ctx.gen->routes().find(ctx.model);
  if (!r) return Outcome::failed(core::model_not_found(ctx.model));
  // A model the principal may not use is answered as one that does not exist (OpenAI's 404 model_not_found
  // "does not exist or you do not have access to it", as GET /v1/models/{id} answers), here before anything
  // else the route decides, so that a tenant cannot tell which models, or what an alias names, are configured
  // for others; the access log keeps the reason (model_not_allowed). A request without a model is refused in
  // admit (403: it names nothing to find).
  if (!ctx.model.empty() && !check_model(ctx, ctx.model, *r)) {
    ctx.model_refused = true;
    ctx.refused_by =
        auth::Authenticator::refusing_list(*ctx.principal, r->canonical.empty() ? ctx.model : r->canonical);
    return Outcome::failed(core::model_not_found(ctx.model));
  }
  ctx.target = *r;
  ctx.model_slot = model_slot_of(ctx, *r);
  ctx.pool = static_cast<int>(r->pool);
  // Weir's request controls are read here, on every request whatever its
  // pools, so a client's typo is a 400 before anything is sent upstream, not
  // only once a fallback's queue reads it (logged and counted with the
  // route's model and pool). Each is one line: two are a 400.
  bool repeated = false;
  const auto control = [&](std::string_view name) { return http::only_field(down_.request(), name, repeated); };
  const auto sent_twice = [&](std::string_view name) {
    return Outcome::failed(core::bad_request(fmt::format("{} must be sent once.", name)));
  };
  // x-weir-fallbacks: N (0..) caps the chain for this request; "none" is 0.
  if (const std::string_view h = control("x-weir-fallbacks"); !h.empty() || repeated) {
    if (repeated) return sent_twice("x-weir-fallbacks");
    unsigned n = 0;
    const auto [p, ec] = std::from_chars(h.data(), h.data() + h.size(), n);
    if (h == "none")
      n = 0;
    else if (ec != std::errc() || p != h.data() + h.size())
      return Outcome::failed(core::bad_request("x-weir-fallbacks must be a number of fallbacks (0, 1, ...) or none."));
    ctx.fallback_limit = static_cast<std::uint8_t>(std::min(n, 255u));
  }
  // x-weir-priority: 0..100 (a pool's queue orders by it: enter_pool).
  if (const std::string_view h = control("x-weir-priority"); !h.empty() || repeated) {
    if (repeated) return sent_twice("x-weir-priority");
    int v = -1;
    const auto [p, ec] = std::from_chars(h.data(), h.data() + h.size(), v);
    if (ec != std::errc() || p != h.data() + h.size() || v < 0 || v > 100)
      return Outcome::failed(core::bad_request("x-weir-priority must be a whole number from 0 to 100."));
    ctx.priority_asked = static_cast<std::int8_t>(v);
  }
  // x-weir-timeout-ms: N bounds the whole request from its arrival, queueing
  // and retries included (docs/reliability.md#deadlines). Relative, as
  // gRPC's grpc-timeout and Envoy's x-envoy-upstream-rq-timeout-ms, so no
  // clock has to agree with Weir's.
  if (const std::string_view h = control("x-weir-timeout-ms"); !h.empty() || repeated) {
    if (repeated) return sent_twice("x-weir-timeout-ms");
    std::uint32_t ms = 0;
    const auto [p, ec] = std::from_chars(h.data(), h.data() + h.size(), ms);
    if (ec != std::errc() || p != h.data() + h.size() || ms < 1 || ms > kMaxTimeoutMs)
      return Outcome::failed(
          core::bad_request("x-weir-timeout-ms must be a whole number of milliseconds from 1 to 86400000 (24 hours)."));
    ctx.deadline_ms = ms;
    ctx.deadline = core::saturating_add(ctx.t_start, std::chrono::milliseconds(ms));
  }
  if (anthropic_pool(ctx)) {
    // Chat completions and Responses are translated for Anthropic here, so
    // what Anthropic cannot express is a 400 before admission charges it,
    // unless a fallback can take the request: then the proxy phase passes
    // this target over (attempt_pool) for the next one.
    if (!served_by_anthropic(ctx.route)) {
      if (!fallback_left(ctx)) return Outcome::failed(not_served_by_anthropic(ctx));
    } else if (!is_anthropic(ctx.route)) {
      // Anthropic's Messages API has no served model to fall back on: a chat request for it names one.
      if (ctx.model.empty())
        return Outcome::failed(core::bad_request(
            "you must provide a model parameter: the default pool speaks Anthropic's Messages API, which requires one",
            "model"));
      if (auto e = translate_for_anthropic(ctx)) {
        if (!fallback_left(ctx)) return Outcome::failed(std::move(*e));
      } else {
        ctx.anthropic_ready = true;
      }
    }
  }
  return Outcome::next();
}

}  // namespace weir::gateway
