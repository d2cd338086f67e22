#include "core/error.hpp"

#include "core/json_text.hpp"

#include <fmt/format.h>
#include <boost/beast/http/status.hpp>

namespace weir::core {

std::string_view to_string(ErrorSource s) {
  switch (s) {
    case ErrorSource::client:
      return "client";
    case ErrorSource::upstream:
      return "upstream";
    case ErrorSource::internal:
      return "internal";
  }
  return "internal";
}

namespace {
Error make(ErrorSource src, int status, std::string_view type, std::string_view code, std::string message,
           std::string_view param = {}) {
  Error e;
  e.source = src;
  e.status = status;
  e.type = type;
  e.code = code;
  e.message = std::move(message);
  e.param = param;
  return e;
}
}  // namespace

Error bad_request(std::string message, std::string_view param, std::string_view code) {
  return make(ErrorSource::client, 400, "invalid_request_error", code, std::move(message), param);
}
Error model_not_found(std::string_view model) {
  return make(
      ErrorSource::client, 404, "invalid_request_error", "model_not_found",
      fmt::format("The model `{}` does not exist or you do not have access to it.", utf8_prefix(model, kMaxEchoBytes)),
      "model");
}
Error not_found(std::string_view path) {
  return make(ErrorSource::client, 404, "invalid_request_error", "not_found",
              fmt::format("Unknown request URL: {}.", utf8_prefix(path, kMaxEchoBytes)));
}
Error method_not_allowed(std::string_view method, std::string_view path) {
  return make(ErrorSource::client, 405, "invalid_request_error", "method_not_allowed",
              fmt::format("Method {} is not allowed for {}.", utf8_prefix(method, kMaxEchoBytes),
                          utf8_prefix(path, kMaxEchoBytes)));
}
Error method_not_implemented(std::string_view method) {
  return make(
      ErrorSource::client, 501, "invalid_request_error", "method_not_implemented",
      fmt::format("Method {} is not implemented (methods are case-sensitive).", utf8_prefix(method, kMaxEchoBytes)));
}
Error payload_too_large(std::uint64_t limit_bytes) {
  return make(ErrorSource::client, 413, "invalid_request_error", "request_too_large",
              fmt::format("Request body is larger than the limit of {} bytes.", limit_bytes));
}
Error request_timeout(std::string message) {
  return make(ErrorSource::client, 408, "invalid_request_error", "request_timeout", std::move(message));
}
Error header_too_large(std::uint64_t limit_bytes) {
  return make(ErrorSource::client, 431, "invalid_request_error", "request_header_too_large",
              fmt::format("The request head is larger than {} bytes.", limit_bytes));
}
Error uri_too_long(std::uint64_t limit_bytes) {
  return make(ErrorSource::client, 414, "invalid_request_error", "uri_too_long",
              fmt::format("The request line with its CRLF is longer than {} bytes.", limit_bytes));
}
Error unsupported_transfer_coding() {
  return make(ErrorSource::client, 501, "invalid_request_error", "unsupported_transfer_coding",
              "Transfer-Encoding other than chunked is not implemented; send the body with Content-Length or "
              "Transfer-Encoding: chunked alone.");
}
Error http_version_not_supported(char major) {
  return make(ErrorSource::client, 505, "invalid_request_error", "http_version_not_supported",
              fmt::format("HTTP/{} is not supported on this port: send HTTP/1.1 (or 1.0).", major));
}
Error proxy_protocol_unsupported() {
  return make(ErrorSource::client, 400, "invalid_request_error", "proxy_protocol_unsupported",
              "The request began with a PROXY protocol header, which Weir does not accept: send HTTP/1.1 "
              "alone (no send-proxy on the front proxy's server line).");
}
Error expectation_failed() {
  return make(ErrorSource::client, 417, "invalid_request_error", "expectation_failed",
              "The request's Expect field is not supported: the only expectation is 100-continue.");
}
Error unsupported_media_type(std::string_view content_type) {
  return make(ErrorSource::client, 415, "invalid_request_error", "unsupported_media_type",
              fmt::format("The request body must be JSON (Content-Type: application/json), not '{}'.",
                          utf8_prefix(content_type, 64)));
}
Error unsupported_encoding(std::string_view coding) {
  return make(ErrorSource::client, 415, "invalid_request_error", "unsupported_content_encoding",
              fmt::format("Content-Encoding '{}' is not supported for request bodies; send the body as it is, or "
                          "compressed with gzip or deflate.",
                          utf8_prefix(coding, 64)));
}
Error undecodable_body(std::string_view coding) {
  return make(ErrorSource::client, 400, "invalid_request_error", "invalid_content_encoding",
              fmt::format("The request body is not valid {} data (Content-Encoding: {}).", utf8_prefix(coding, 64),
                          utf8_prefix(coding, 64)));
}
Error client_closed(std::string_view code, std::string message) {
  return make(ErrorSource::client, 499, "client_closed", code, std::move(message));
}
Error unauthorized(std::string message) {
  return make(ErrorSource::client, 401, "invalid_request_error", "invalid_api_key", std::move(message));
}
Error host_not_allowed(std::string message) {
  return make(ErrorSource::client, 421, "invalid_request_error", "host_not_allowed", std::move(message));
}
Error forbidden(std::string message, std::string_view code) {
  return make(ErrorSource::client, 403, "permission_error", code, std::move(message));
}
Error rate_limited(std::string message, std::uint32_t retry_after_s) {
  auto e = make(ErrorSource::client, 429, "requests", "rate_limit_exceeded", std::move(message));
  e.retry_after_s = retry_after_s;
  return e;
}
Error insufficient_quota(std::string message, std::uint32_t retry_after_s) {
  auto e = make(ErrorSource::client, 429, "insufficient_quota", "insufficient_quota", std::move(message));
  e.retry_after_s = retry_after_s;
  return e;
}
Error upstream_unavailable(std::string message) {
  return make(ErrorSource::upstream, 502, "upstream_error", "upstream_unavailable", std::move(message));
}
Error upstream_timeout(std::string message) {
  return make(ErrorSource::upstream, 504, "timeout", "upstream_timeout", std::move(message));
}
Error unavailable(std::string message, std::uint32_t retry_after_s) {
  auto e = make(ErrorSource::internal, 503, "server_error", "service_unavailable", std::move(message));
  e.retry_after_s = retry_after_s;
  return e;
}
Error internal_error(std::string message) {
  return make(ErrorSource::internal, 500, "server_error", "internal_error", std::move(message));
}

void append_error_json(std::string& out, const Error& e) {
  out += R"({"error":{"message":)";
  append_json_string(out, e.message);
  out += R"(,"type":)";
  append_json_string(out, e.type);
  out += R"(,"param":)";
  if (e.param.empty())
    out += "null";
  else
    append_json_string(out, e.param);
  out += R"(,"code":)";
  if (e.code.empty())
    out += "null";
  else
    append_json_string(out, e.code);
  out += "}}";
}

std::string error_json(const Error& e) {
  std::string s;
  append_error_json(s, e);
  return s;
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 304:
      return "Not Modified";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    case 425:
      return "Too Early";  // RFC 8470 (not in Beast's table)
    case 529:
      return "Overloaded";  // (Anthropic's; no RFC names it)
    default: {
      // Every other status RFC 9110 and its registry name, from Beast's
      // table; one no registry names gets no phrase (RFC 9112 §4: the
      // reason-phrase may be empty), never a made-up one.
      const auto s = boost::beast::http::int_to_status(static_cast<unsigned>(status));
      if (s == boost::beast::http::status::unknown) return "";
      const auto r = boost::beast::http::obsolete_reason(s);
      return {r.data(), r.size()};
    }
  }
}

}  // namespace weir::core
