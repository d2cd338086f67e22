// The read phase: what the head names (route, method, request id), the
// routes and methods Weir serves, and the body within limits (decoded when
// it comes gzip- or deflate-encoded).
#include <boost/beast/http/verb.hpp>

#include <algorithm>

#include <fmt/format.h>

#include "core/json_text.hpp"
#include "core/text.hpp"
#include "core/time.hpp"
#include "gateway/cors.hpp"
#include "gateway/endpoints.hpp"
#include "gateway/failure.hpp"
#include "gateway/host_rule.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"
#include "http/gzip.hpp"
#include "http/request_check.hpp"
#include "http/response_head.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;

namespace {

// RFC 9110 §5.6.2 tchar.
bool is_tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

// The method and path (origin-form only, without its query, at most 256
// bytes) of a head that was refused before it was parsed whole, from its
// request line (RFC 9112 §3: method SP request-target SP ...), for the log;
// "-" and an empty path when that line did not come or does not have that
// shape.
void log_request_line(std::string_view raw, RequestContext& ctx) {
  ctx.method = "-";
  const std::size_t sp = raw.find(' ');
  if (sp == 0 || sp == std::string_view::npos || sp > 32) return;
  const std::string_view method = raw.substr(0, sp);
  if (!std::all_of(method.begin(), method.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); }))
    return;
  std::string_view target = raw.substr(sp + 1);
  const auto end = std::find_if(target.begin(), target.end(),
                                [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; });
  // The target is whole only when the SP after it came: a line cut off
  // mid-target names no path anyone asked for.
  if (end == target.end() || *end != ' ') return;
  target = target.substr(0, static_cast<std::size_t>(end - target.begin()));
  std::string scratch;
  target = http::origin_form(target, scratch);          // an absolute-form target ("http://h/v1/messages") by its path
  if (target.empty() || target.front() != '/') return;  // both or neither: never a method without a path
  ctx.method.assign(method);
  ctx.path.assign(core::utf8_prefix(path_of(target), core::kMaxEchoBytes));
}

// A client's own id (valid) as the request's, with the id Weir generated for
// it (in ctx.request_id) after it upstream: "<id>-<generated>". Two clients
// (two tenants) may choose the same id at once, and vLLM takes the id as its
// engine's, refusing one it is already running (docs/observability.md).
void take_client_request_id(RequestContext& ctx, std::string_view id) {
  ctx.upstream_request_id.assign(id).append(1, '-').append(ctx.request_id);
  ctx.request_id.assign(id);
}

// The request's id: the client's x-request-id when it is one Weir takes
// (valid_request_id), else a generated one (take_body_request_id may yet
// take the body's request_id).
void assign_request_id(RequestContext& ctx, const http::RequestHead& req, Worker& w) {
  w.next_request_id(ctx.request_id);
  if (auto id = http::first_field(req, "x-request-id"); valid_request_id(id)) take_client_request_id(ctx, id);
}

}  // namespace

void GatewayPhases::take_body_request_id(RequestContext& ctx) {
  // vLLM's chat and completions take the body's request_id when no X-Request-Id header names one (its
  // serving_engine's _base_request_id(raw_request, request.request_id)); its embeddings and other routes
  // declare the field and ignore it. A header, even one Weir does not take, is the id vLLM would use: then
  // the body's is not read.
  if (ctx.route != RouteKind::chat_completions && ctx.route != RouteKind::completions) return;
  const std::string_view id = ctx.fields.request_id;
  if (id.empty() || !valid_request_id(id)) return;
  for (const auto& f : down_.request())
    if (core::iequals(f.name_string(), "x-request-id")) return;
  take_client_request_id(ctx, id);
}

core::Task<Outcome> GatewayPhases::read(RequestContext& ctx) {
  ctx.gen = w_.generation();  // the configuration this request runs on, to its end
  ctx.model_slot = MetricsShard::no_model();
  const auto& req = down_.request();
  // A head refused for its framing, Host or Expect was read whole: its route
  // is known, so the error takes the route's shape (Anthropic's on
  // /v1/messages) and the log names the request. Any other failure leaves
  // no usable head: never an empty id in the log or the reply.
  const bool head_read = down_.head_read();
  if (!head_read) {
    // What the log can say about it: the method and path of its request
    // line, when one came whole (never used to route; only to give the error its route's shape).
    log_request_line(down_.refused_request_line(ctx.scratch), ctx);
    // Its error takes its route's shape (Anthropic's on /v1/messages: a 431 there is an Anthropic error).
    if (!ctx.path.empty()) ctx.route = classify_path(ctx.path);
    // The client's x-request-id when its field was read before the head failed (a TE with a CL, an
    // asterisk target): the client finds its own id in the refusal and the log, as for any other.
    assign_request_id(ctx, req, w_);
    co_return Outcome::failed(read_error(ctx.read_failure, down_.config(), down_.failure_detail()));
  }
  const std::string_view path = path_of(down_.target());  // origin-form: no client-chosen authority
  ctx.route = classify_path(path);
  // An Anthropic SDK's models.list()/retrieve() (it always sends anthropic-version): Anthropic's shapes, errors
  // included; also the 404 for a path under /v1/models/ that is none of them ("/v1/models/", "/v1/models/m/":
  // a trailing slash is another path in both shapes, as on every route).
  ctx.anthropic_client = !http::first_field(req, "anthropic-version").empty();
  ctx.anthropic_models = (ctx.route == RouteKind::models || path.starts_with("/v1/models/")) && ctx.anthropic_client;
  ctx.method.assign(core::utf8_prefix(req.method_string(), core::kMaxEchoBytes));  // a token of any length
  ctx.path.assign(core::utf8_prefix(path, core::kMaxEchoBytes));
  assign_request_id(ctx, req, w_);
  // (Traced before a refused head's answer too: every request Weir answered is, as the log has it.)
  if (w_.tracer() && traced(ctx.route)) begin_trace(ctx);
  // Every answer from here on, errors included, carries the CORS fields (a browser page reads a 401 or a 429
  // only through them); the one branch the request path pays with server.cors off.
  const core::CorsConfig& cors = ctx.gen->config().server.cors;
  if (cors.enabled) [[unlikely]]
    ctx.cors_allowed = append_cors_fields(ctx.cors_lines, cors, req);
  if (ctx.read_failure != http::ReadFailure::none)
    co_return Outcome::failed(read_error(ctx.read_failure, down_.config(), down_.failure_detail()));
  // Then a host this listener does not serve (server.allowed_hosts; without it, on a loopback listener,
  // /metrics answers IP literals and localhost only: a DNS-rebinding page's requests name its own site,
  // gateway/host_rule.hpp). 421, not 403: the request reached a server not configured for its origin
  // (RFC 9110 §15.5.20). Before the body and "100 Continue".
  if (!host_check(ctx)) [[unlikely]] {
    if (!down_.body_complete()) down_.no_keep_alive();
    co_return Outcome::failed(misdirected(ctx));
  }

  // Unknown routes and wrong methods are answered without reading the body:
  // the connection then closes unless there was none.
  if (req.method() == bh::verb::unknown) {  // a method no resource has: 501, not 405 (RFC 9110 §9.1)
    if (!down_.body_complete()) down_.no_keep_alive();
    co_return Outcome::failed(core::method_not_implemented(req.method_string()));
  }
  // /metrics served only on the admin listener (server.metrics.client_port: false): no such route here, for
  // any method, logged as any unknown path is.
  if (ctx.route == RouteKind::metrics && !ctx.gen->config().server.metrics.client_port) ctx.route = RouteKind::other;
  // A scrape writes no log line (log()): every byte of its answer stays out of weir_response_bytes_total, the
  // "100 Continue" a body it expects to send gets included (that goes out before serve_own), so the counter
  // adds up to the log's bytes_out. (One that is logged after all, refused or cut, is counted by log().)
  if (ctx.route == RouteKind::metrics) down_.leave_out_of_total();
  if (ctx.route == RouteKind::other) {
    if (!down_.body_complete()) down_.no_keep_alive();
    co_return Outcome::failed(core::not_found(path));
  }
  const bool post_route = api_of(ctx.route).has_value();
  const bool get_or_head = req.method() == bh::verb::get || req.method() == bh::verb::head;
  if ((post_route && req.method() != bh::verb::post) || (!post_route && !get_or_head)) {
    if (!down_.body_complete()) down_.no_keep_alive();
    // A browser's preflight: answered before authentication (it carries no credentials: Fetch §3.2.2).
    if (cors.enabled && is_preflight(req)) co_return co_await preflight(ctx);
    co_return Outcome::failed(core::method_not_allowed(req.method_string(), path));
  }
  // A body still on its way is read after authentication (authenticate()):
  // a request without a valid credential is answered from its head (401),
  // never after its client sent and Weir held up to server.max_body. A
  // client that expects 100-continue waits for it before it sends the body:
  // it gets it only once the head has passed every check that does not need
  // the body, its credentials included (RFC 9110 §10.1.1).
  // (A body that came with the head is read now: no wait, no coroutine for
  // authenticate(), unless its client expects 100-continue.)
  if (!down_.body_buffered() || (!down_.body_complete() && http::expects_continue(req))) {
    ctx.body_deferred = true;
    co_return Outcome::next();
  }
  co_return co_await read_body(ctx);
}

bool GatewayPhases::host_check(const RequestContext& ctx) const {
  const auto& configured = ctx.gen->config().server.allowed_hosts;
  // (Without the option, only /metrics on a loopback listener looks at a string.)
  const bool metrics = ctx.route == RouteKind::metrics;
  if (!configured && !(metrics && w_.loopback_listener())) return true;
  const auto& req = down_.request();
  return host_allowed(client_host_rule(configured ? &*configured : nullptr, w_.loopback_listener(), metrics),
                      request_authority(req.target(), http::first_field(req, bh::field::host)));
}

core::Error GatewayPhases::misdirected(const RequestContext& ctx) const {
  const auto& req = down_.request();
  const std::string_view authority = request_authority(req.target(), http::first_field(req, bh::field::host));
  return core::host_not_allowed(
      fmt::format("Weir does not serve {} here (server.allowed_hosts{}).",
                  authority.empty() ? std::string("a request without a host name (no Host, or an empty one)")
                                    : fmt::format("the host '{}'", core::utf8_prefix(authority, core::kMaxEchoBytes)),
                  ctx.gen->config().server.allowed_hosts
                      ? ""
                      : "; on a loopback address, /metrics is answered for IP literals and localhost only, unless "
                        "the option lists more"));
}

core::Task<Outcome> GatewayPhases::preflight(RequestContext& ctx) {
  const auto& req = down_.request();
  if (!ctx.cors_allowed)
    co_return Outcome::failed(
        core::forbidden(fmt::format("Origin {} may not call Weir from a browser (server.cors.allowed_origins).",
                                    core::utf8_prefix(request_origin(req), core::kMaxEchoBytes)),
                        "origin_not_allowed"));
  ctx.status = 204;
  ctx.head.clear();
  http::append_status_line(ctx.head, 204);
  http::append_header(ctx.head, "x-request-id", ctx.request_id);
  // (Not ctx.cors_lines: a preflight's fields are its own, and it exposes nothing.)
  append_preflight_fields(ctx.head, ctx.gen->config().server.cors, req, allowed_methods(ctx.route));
  core::append_http_date(ctx.head);
  http::append_connection_header(ctx.head, down_.connection_mode());
  ctx.head += "\r\n";  // (204: no Content-Length, no content: RFC 9110 §8.6, §15.3.5)
  if (!co_await down_.write_all(ctx.head, {})) ctx.status = 499;
  co_return Outcome::responded();
}

core::Task<Outcome> GatewayPhases::read_body(RequestContext& ctx) {
  ctx.body_deferred = false;
  if (!down_.body_complete()) {
    if (!down_.has_body_storage()) down_.lend_body_storage(w_.take_buffer());
    // (Its waits for the client's bytes are the client's time, not Weir's: Downstream::client_waited().)
    const bool read = co_await down_.read_body();
    if (!read) {
      ctx.bytes_in = down_.body().size();  // what came before the body failed
      co_return Outcome::failed(read_error(down_.failure(), down_.config(), down_.failure_detail()));
    }
  }
  ctx.bytes_in = down_.body().size();
  co_return Outcome::next();
}

Outcome GatewayPhases::decode_body(RequestContext& ctx) {
  const auto& req = down_.request();
  // The codings of every Content-Encoding line, as one list (RFC 9110 §5.3:
  // "gzip" on two lines is "gzip, gzip", refused as the one line would be),
  // empty elements ignored (§5.6.1: "gzip," is "gzip").
  std::string_view ce;  // the one coding, or the whole list when there are several
  std::string ce_list;  // (only when there are several)
  std::size_t codings = 0;
  for (const auto& f : req) {
    if (f.name() != bh::field::content_encoding) continue;
    std::string_view v = f.value();
    while (!v.empty()) {
      const std::size_t comma = v.find(',');
      const std::string_view c = core::trim_ows(v.substr(0, comma));
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
      if (c.empty()) continue;
      if (++codings == 1) {
        ce = c;
      } else {
        if (codings == 2) ce_list.assign(ce);
        ce_list.append(", ").append(c);
      }
    }
  }
  if (codings > 1) ce = ce_list;
  if (!ce.empty() && !core::iequals(ce, "identity") && !down_.body().empty()) {
    // A compressed body (RFC 9110 §8.4): gzip and deflate are decoded here,
    // within server.max_body (what Weir would hold either way), so every
    // route reads and forwards the JSON or form itself; other codings are a
    // 415 naming what is accepted.
    if (!(core::iequals(ce, "gzip") || core::iequals(ce, "x-gzip") || core::iequals(ce, "deflate")))
      return Outcome::failed(core::unsupported_encoding(ce));
    std::string decoded = w_.take_buffer();
    bool over = false;
    // The connection's own limit (the one its raw body was held to: a reload applies to connections accepted
    // after it), not the generation's.
    const std::uint64_t max_body = down_.config().max_body_bytes;
    if (!http::gunzip(down_.body(), decoded, max_body, &over)) {
      w_.give_buffer(decoded);
      if (over) return Outcome::failed(core::payload_too_large(max_body));
      return Outcome::failed(core::undecodable_body(ce));
    }
    // What it decoded to is charged to server.max_buffered too (its Content-Length was): a small gzip body
    // holds up to server.max_body once decoded.
    if (!down_.charge_body(decoded.size())) {
      w_.give_buffer(decoded);
      return Outcome::failed(buffers_full(nullptr, down_.config().max_buffered_bytes));
    }
    down_.body().swap(decoded);
    w_.give_buffer(decoded);
    ctx.body_decoded = true;
  }
  return Outcome::next();
}

}  // namespace weir::gateway
