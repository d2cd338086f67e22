// Errors on the request path and their one mapping to an HTTP status and an
// OpenAI-shaped body (OpenAI API "Error codes"; RFC 9110 status semantics).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace weir::core {

// Who caused the failure: decides the status class and what the access log blames.
enum class ErrorSource : std::uint8_t {
  client,    // malformed or unacceptable request: 4xx
  upstream,  // model server refused, failed, timed out or sent garbage: 502/503/504
  internal,  // Weir itself: 500
};

std::string_view to_string(ErrorSource s);

// One failure, carried by value (tl::expected<T, Error>) to the place that
// answers the client. `type`, `code` and `param` follow OpenAI's error object;
// an empty `code` or `param` is rendered as JSON null.
struct Error {
  ErrorSource source = ErrorSource::internal;
  int status = 500;       // HTTP status code
  std::string_view type;  // OpenAI error.type, e.g. "invalid_request_error"
  std::string_view code;  // OpenAI error.code, e.g. "model_not_found"; empty = null
  std::string message;    // human readable, safe to show the client
  // Offending request field, e.g. "model", "MAX_TOKENS" (a copy: it may name a member of the request, which the
  // error outlives); empty = null.
  std::string param;
  // Extra response header for 429/503 (seconds); 0 = none.
  std::uint32_t retry_after_s = 0;
  // The wait retry_after_s rounds up, exact (ms; sent as `retry-after-ms`, which the openai and anthropic
  // SDKs read before Retry-After); 0 = none known: retry_after_s · 1000 is sent.
  std::uint32_t retry_after_ms = 0;
  // Sent with `x-should-retry: false`: another attempt cannot help, or would start over work that may still be
  // running (a request's own deadline passed; a generation timed out on a pool that does not retry it).
  bool no_retry = false;
};

// Factories: each names the status and the OpenAI type/code it produces.
// Those that echo request input (model, path, method) echo at most
// kMaxEchoBytes (256) of each, cut on a UTF-8 boundary.
Error bad_request(std::string message, std::string_view param = {},
                  std::string_view code = {});                             // 400 invalid_request_error
Error model_not_found(std::string_view model);                             // 404 model_not_found
Error not_found(std::string_view path);                                    // 404 (unknown route)
Error method_not_allowed(std::string_view method, std::string_view path);  // 405
// 501 method_not_implemented: a method Weir does not recognize for any
// resource (RFC 9110 §9.1: methods are case-sensitive; "FOO", "post").
Error method_not_implemented(std::string_view method);
Error payload_too_large(std::uint64_t limit_bytes);  // 413
Error request_timeout(std::string message);          // 408 request_timeout (head or body too slow)
Error header_too_large(std::uint64_t limit_bytes);   // 431 request_header_too_large (RFC 6585 §5)
Error uri_too_long(std::uint64_t limit_bytes);       // 414 uri_too_long: the request line (RFC 9110 §15.5.15)
// 501 unsupported_transfer_coding: a Transfer-Encoding other than chunked
// (RFC 9112 §6.1: a server that does not understand a coding answers 501).
Error unsupported_transfer_coding();
// 505 http_version_not_supported: a request line whose HTTP major version is
// not 1 (RFC 9110 §15.6.6): HTTP/2.0 spelled as HTTP/1.1 text, h2's
// prior-knowledge preface (`PRI * HTTP/2.0`) on a port that speaks HTTP/1.1.
// `major`: the version's major digit as sent.
Error http_version_not_supported(char major);
// 400 proxy_protocol_unsupported: the connection began with a PROXY protocol
// header (HAProxy's, v1 text or v2 binary), which Weir does not accept.
Error proxy_protocol_unsupported();
// 417 expectation_failed: an Expect member other than 100-continue (RFC 9110
// §10.1.1), answered before the body is read.
Error expectation_failed();
// 415 unsupported_media_type: a JSON route's body sent as another media type (`content_type`, echoed).
Error unsupported_media_type(std::string_view content_type);
// 415 unsupported_content_encoding: a request body in a Content-Encoding
// Weir does not decode (RFC 9110 §15.5.16; the answer carries Accept-Encoding).
Error unsupported_encoding(std::string_view coding);
// 400 invalid_content_encoding: a gzip/deflate body that does not decode.
Error undecodable_body(std::string_view coding);
// 421 host_not_allowed: the request names a host (Host, or an absolute-form
// target's authority) this listener is not configured to serve
// (server.allowed_hosts; RFC 9110 §15.5.20 "Misdirected Request").
Error host_not_allowed(std::string message);
Error unauthorized(std::string message);                                            // 401 invalid_api_key
Error forbidden(std::string message, std::string_view code = "model_not_allowed");  // 403
Error rate_limited(std::string message, std::uint32_t retry_after_s);               // 429 rate_limit_exceeded
Error insufficient_quota(std::string message, std::uint32_t retry_after_s = 0);     // 429 insufficient_quota
Error upstream_unavailable(std::string message);                                    // 502 upstream_error
Error upstream_timeout(std::string message);                                        // 504 timeout
Error unavailable(std::string message, std::uint32_t retry_after_s = 1);            // 503 (draining, overload)
Error internal_error(std::string message);                                          // 500 server_error
// 499 (the client left first; nothing is sent): `code` is the access log's
// reason, a literal: client_closed_request, slow_client, client_write_timeout.
Error client_closed(std::string_view code, std::string message);

// Appends {"error":{"message","type","param","code"}} (OpenAI's shape) to `out`.
void append_error_json(std::string& out, const Error& e);
std::string error_json(const Error& e);

// Reason phrase for a status (RFC 9110 §15), "Unknown" for others.
std::string_view reason_phrase(int status);

}  // namespace weir::core
