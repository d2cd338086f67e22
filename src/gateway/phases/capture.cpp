// Body capture (request_log.capture_bodies): the request and response
// bodies of the tenants that opted in, stored with their request's record,
// each cut at its cap. Only requests of those tenants pay anything: one
// copy of the body's first bytes, and a search for the request's own
// credential in them (requestlog::redact_exact); the pattern redaction
// runs later on the store's writer thread.
#include <boost/beast/http/field.hpp>

#include "auth/authenticator.hpp"
#include "core/text.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"
#include "requestlog/redact.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;

namespace {

// The credential the client presented, as authentication read it: the bearer token, or x-api-key's value.
std::string_view presented_credential(const http::RequestHead& req) {
  return auth::presented_credential(http::first_field(req, bh::field::authorization),
                                    http::first_field(req, "x-api-key"));
}

void take(requestlog::CapturedBody& b, std::string_view bytes, std::uint64_t cap) {
  b.present = true;
  b.size += bytes.size();
  const std::size_t room = b.bytes.size() < cap ? static_cast<std::size_t>(cap) - b.bytes.size() : 0;
  if (bytes.size() > room) b.truncated = true;
  b.bytes.append(bytes.substr(0, room));
}

}  // namespace

void GatewayPhases::begin_capture(RequestContext& ctx) {
  const requestlog::CaptureConfig* cap = w_.shared().capture;
  if (!cap || !ctx.principal || !cap->captures(ctx.principal->tenant_name())) return;
  ctx.capture = true;
  if (!ctx.captured) ctx.captured = std::make_unique<RequestContext::Captured>();
  auto& c = *ctx.captured;
  const auto& req = down_.request();
  // One allocation each: the request's first bytes, and room for a response
  // so a stream's events append without reallocating (up to 64 KiB; beyond, doubling).
  c.request.bytes.reserve(
      static_cast<std::size_t>(std::min<std::uint64_t>(cap->max_request_bytes, down_.body().size())));
  take(c.request, down_.body(), cap->max_request_bytes);
  // The request's own key or token never reaches the store, even pasted into a prompt.
  requestlog::redact_exact(c.request.bytes, presented_credential(req), c.request.truncated);
  c.response.bytes.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(cap->max_response_bytes, 1u << 16)));
}

void GatewayPhases::capture_response(RequestContext& ctx, std::string_view bytes) {
  if (!ctx.capture) return;
  take(ctx.captured->response, bytes, w_.shared().capture->max_response_bytes);
}

void GatewayPhases::end_capture(RequestContext& ctx) {
  if (!ctx.capture) return;
  // (A captured stream keeps its request head for this: respond_stream.cpp.)
  requestlog::redact_exact(ctx.captured->response.bytes, presented_credential(down_.request()),
                           ctx.captured->response.truncated);
}

}  // namespace weir::gateway
