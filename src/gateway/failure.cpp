#include "gateway/failure.hpp"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "api/anthropic/response.hpp"
#include "core/json_text.hpp"
#include "http/response_source.hpp"

namespace weir::gateway {

core::Error read_error(http::ReadFailure f, const core::ServerConfig& sc, std::string_view detail) {
  switch (f) {
    case http::ReadFailure::head_timeout:
      return core::request_timeout("The request head was not received in time.");
    case http::ReadFailure::body_timeout:
      return core::request_timeout("The request body was not received in time.");
    case http::ReadFailure::head_too_large:
      return core::header_too_large(sc.max_header_bytes);
    case http::ReadFailure::line_too_long:
      return core::uri_too_long(sc.max_header_bytes);
    case http::ReadFailure::body_too_large:
      return core::payload_too_large(sc.max_body_bytes);
    case http::ReadFailure::client_closed: {
      auto e = client_gone(ClientGone::closed);
      e.message = "The client closed the connection before sending the whole request.";
      return e;
    }
    case http::ReadFailure::drain_cut:
      return drain_cut();
    case http::ReadFailure::over_budget:
      return buffers_full(nullptr, sc.max_buffered_bytes);
    case http::ReadFailure::bad_framing:
      return core::bad_request(
          "Malformed HTTP request: Transfer-Encoding must end in a single chunked, and comes with neither "
          "Content-Length nor HTTP/1.0; Content-Length comes once, with one value.");
    case http::ReadFailure::obs_fold:
      return core::bad_request(
          "Malformed HTTP request: a header or trailer line begins with a space or tab (obs-fold, RFC 9112 §5.2); send "
          "each field on one line.");
    case http::ReadFailure::unsupported_coding:
      return core::unsupported_transfer_coding();
    case http::ReadFailure::bad_host:
      return core::bad_request(
          "Malformed HTTP request: a request needs exactly one valid Host header (HTTP/1.0: at most one).");
    case http::ReadFailure::bad_target:
      return core::bad_request(
          "Malformed HTTP request: the request target must be a path (/v1/...) or an http(s) absolute URI.");
    case http::ReadFailure::unsupported_expectation:
      return core::expectation_failed();
    case http::ReadFailure::version_not_supported:
      return core::http_version_not_supported(detail.empty() ? '?' : detail.front());
    case http::ReadFailure::proxy_protocol:
      return core::proxy_protocol_unsupported();
    case http::ReadFailure::framing_too_large:
      return core::bad_request(
          "Malformed HTTP request: the chunked body's framing (a chunk-size line, chunk extensions or trailers) "
          "is too large.");
    case http::ReadFailure::malformed:
    case http::ReadFailure::none:
      break;
  }
  return core::bad_request(fmt::format("Malformed HTTP request: {}.", detail));
}

namespace {
// "<lead> pool `P` (model `M`) <what> (request R)."
std::string upstream_message(const UpstreamSubject& who, std::string_view what, std::string_view lead = "Upstream") {
  std::string m = fmt::format("{} pool `{}`", lead, who.pool);
  if (!who.model.empty())
    fmt::format_to(std::back_inserter(m), " (model `{}`)", core::utf8_prefix(who.model, core::kMaxEchoBytes));
  fmt::format_to(std::back_inserter(m), " {} (request {}).", what, who.request_id);
  return m;
}
}  // namespace

core::Error upstream_error(http::UpstreamFailure f, const UpstreamSubject& who, bool mid_stream) {
  const char* when = mid_stream ? " while streaming" : "";
  switch (f) {
    case http::UpstreamFailure::connect_refused:
      return core::upstream_unavailable(upstream_message(who, "refused the connection"));
    case http::UpstreamFailure::connect_timeout:
      return core::upstream_timeout(upstream_message(who, "timed out", "Connecting to upstream"));
    case http::UpstreamFailure::timeout:
      return core::upstream_timeout(upstream_message(who, fmt::format("timed out{}", when)));
    case http::UpstreamFailure::tls:
      // The reason (certificate, name, protocol) is in Weir's log, not in the client's answer.
      return core::upstream_unavailable(upstream_message(who, "failed the TLS handshake"));
    case http::UpstreamFailure::protocol:
      return core::upstream_unavailable(upstream_message(who, fmt::format("sent an invalid HTTP response{}", when)));
    case http::UpstreamFailure::breaker_open:
      return pool_unavailable(who, std::chrono::seconds(1));
    case http::UpstreamFailure::local_resources: {
      core::Error e;
      e.source = core::ErrorSource::internal;
      e.status = 503;
      e.type = "server_error";
      e.code = "gateway_overloaded";
      e.message = upstream_message(who, "right now: it is out of file descriptors or local ports",
                                   "The gateway cannot open a connection to upstream");
      e.retry_after_s = 1;
      return e;
    }
    default:
      return core::upstream_unavailable(upstream_message(who, fmt::format("closed the connection{}", when)));
  }
}

core::Error upstream_head_too_large(const UpstreamSubject& who) {
  return core::upstream_unavailable(
      upstream_message(who, fmt::format("sent a response head larger than {} bytes", http::kMaxResponseHead)));
}

core::Error upstream_error_event(const UpstreamSubject& who) {
  return core::upstream_unavailable(upstream_message(who, "sent an error event in its stream"));
}

core::Error upstream_unfinished(const UpstreamSubject& who, std::string_view finish_reason) {
  auto e = core::upstream_unavailable(
      upstream_message(who, fmt::format("ended the generation before it was complete (finish_reason \"{}\")",
                                        core::utf8_prefix(finish_reason, 64))));
  e.code = "upstream_unfinished";
  return e;
}

core::Error upstream_event_too_large(const UpstreamSubject& who, std::uint64_t limit_bytes) {
  return core::upstream_unavailable(
      upstream_message(who, fmt::format("sent a stream event over {} bytes (server.max_event)", limit_bytes)));
}

core::Error upstream_stream_incomplete(const UpstreamSubject& who) {
  return core::upstream_unavailable(upstream_message(who, "ended the stream before it was complete"));
}

core::Error upstream_status_error(int status, const UpstreamSubject& who) {
  return core::upstream_unavailable(upstream_message(who, fmt::format("answered {}", status)));
}

core::Error batch_status_error(int status, const UpstreamSubject& who, std::uint32_t retry_after_s) {
  core::Error e = core::upstream_unavailable(upstream_message(
      who, fmt::format("answered {} to the micro-batch this request was part of; its body is not passed on, as "
                       "it may quote the batch's other prompts",
                       status)));
  if (status >= 400 && status <= 599) e.status = status;
  e.code = "upstream_error";
  if (status == 429 || status == 503 || status == 529) e.retry_after_s = std::max<std::uint32_t>(retry_after_s, 1);
  return e;
}

core::Error pool_unavailable(const UpstreamSubject& who, std::chrono::steady_clock::duration wait) {
  core::Error e;
  e.source = core::ErrorSource::upstream;
  e.status = 503;
  e.type = "upstream_error";
  e.code = "upstream_unavailable";
  e.message = upstream_message(who,
                               "has no endpoint available: every endpoint's circuit breaker is open (or half-open "
                               "with its trial requests in flight)");
  if (wait <= std::chrono::steady_clock::duration::zero()) wait = std::chrono::seconds(1);
  e.retry_after_s = retry_after_seconds(wait);
  e.retry_after_ms = retry_after_millis(wait);
  return e;
}

core::Error overloaded(const UpstreamSubject& who, ShedReason why, int status,
                       std::chrono::steady_clock::duration retry_after) {
  core::Error e;
  e.source = core::ErrorSource::upstream;
  e.status = status;
  e.type = "server_error";
  e.code = "overloaded";
  const char* what = why == ShedReason::saturated       ? "is saturated and its queue has no room for this request"
                     : why == ShedReason::queue_timeout ? "stayed too busy for this request's time in its queue"
                                                        : "is at its concurrency limit and its queue has no room for "
                                                          "this request";
  e.message = upstream_message(who, what);
  e.retry_after_s = retry_after_seconds(retry_after);
  e.retry_after_ms = retry_after_millis(retry_after);
  return e;
}

core::Error deadline_exceeded(const UpstreamSubject& who, std::uint32_t budget_ms, bool mid_stream) {
  core::Error e;
  e.source = core::ErrorSource::upstream;
  e.status = 504;
  e.type = "timeout";
  e.code = "deadline_exceeded";
  // "The request's deadline of 300 ms (x-weir-timeout-ms) passed before upstream pool `P` (model `M`) answered (request
  // R)."
  // Mid-stream: "... passed while upstream pool `P` (model `M`) was streaming its answer (request R)."
  e.message = upstream_message(who, mid_stream ? "was streaming its answer" : "answered",
                               fmt::format("The request's deadline of {} ms (x-weir-timeout-ms) passed {} upstream",
                                           budget_ms, mid_stream ? "while" : "before"));
  e.no_retry = true;
  return e;
}

core::Error buffers_full(const UpstreamSubject* who, std::uint64_t limit_bytes) {
  core::Error e;
  e.source = core::ErrorSource::internal;
  e.status = 503;
  e.type = "server_error";
  e.code = "gateway_overloaded";
  const std::string held =
      fmt::format("the request bodies and answers Weir holds would pass {} bytes (server.max_buffered)", limit_bytes);
  e.message = who ? upstream_message(*who, fmt::format("sent an answer Weir cannot hold now: {}; retry shortly", held))
                  : fmt::format("Weir cannot take this request's body now: {}; retry shortly.", held);
  e.retry_after_s = 1;
  return e;
}

core::Error upstream_too_large(const UpstreamSubject& who, std::uint64_t limit_bytes) {
  return core::upstream_unavailable(
      upstream_message(who, fmt::format("sent a response larger than {} bytes", limit_bytes)));
}

core::Error upstream_inflates_too_much(const UpstreamSubject& who, std::uint64_t ratio) {
  auto e = core::upstream_unavailable(upstream_message(
      who, fmt::format("sent a compressed body that inflates more than {}:1 (a decompression bomb)", ratio)));
  e.code = "upstream_invalid_response";
  return e;
}

core::Error upstream_undecodable(const UpstreamSubject& who, std::string_view encoding) {
  auto e = core::upstream_unavailable(upstream_message(
      who, fmt::format("sent a body in Content-Encoding '{}', which Weir cannot decode (it decodes gzip and deflate)",
                       core::utf8_prefix(encoding, 64))));
  e.code = "upstream_invalid_response";  // as for a body that decodes to no answer
  return e;
}

core::Error upstream_untranslatable(const UpstreamSubject& who, std::string_view expected) {
  auto e =
      core::upstream_unavailable(upstream_message(who, fmt::format("answered with a body that is not {}", expected)));
  e.code = "upstream_invalid_response";
  return e;
}

core::Error upstream_invalid_arguments(const UpstreamSubject& who, std::string_view call) {
  auto e = core::upstream_unavailable(
      upstream_message(who, fmt::format("answered with a {} whose arguments are not valid JSON", call)));
  e.code = "upstream_invalid_response";
  return e;
}

core::Error drain_cut() {
  auto e = core::unavailable("Weir shut down (server.drain_timeout passed) before this request finished; retry it.", 1);
  e.code = "drain_timeout";
  return e;
}

core::Error client_gone(ClientGone why) {
  switch (why) {
    case ClientGone::slow:
      return core::client_closed("slow_client", "The client stopped reading the stream.");
    case ClientGone::write_timeout:
      return core::client_closed("client_write_timeout", "A write to the client timed out.");
    case ClientGone::closed:
      break;
  }
  return core::client_closed("client_closed_request", "The client closed the connection.");
}

void append_error_body(std::string& out, const core::Error& e, ErrorDialect d) {
  if (d == ErrorDialect::anthropic) return api::anthropic::append_error_json(out, e.status, e.message);
  core::append_error_json(out, e);
}

Delivery delivery_of(const core::Error& e, bool committed, bool streaming) {
  if (e.status == 499) return Delivery::none;
  if (!committed) return Delivery::response;
  return streaming ? Delivery::in_band : Delivery::none;
}

}  // namespace weir::gateway
