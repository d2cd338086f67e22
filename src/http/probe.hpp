// An active health probe of one model server: `GET <path>` over a fresh
// connection, answered within a timeout. It costs the model server no
// generation (vLLM's GET /health answers 200 with an empty body; /v1/models
// works for any OpenAI-compatible server).
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "http/io.hpp"
#include "http/upstream.hpp"

namespace weir::http {

// What to send and how long to wait (request parameters are copied into the
// coroutine frame by reference: keep them alive until it completes).
struct ProbeRequest {
  tcp::endpoint addr;
  std::string_view host_header;              // "host:port" as sent in Host
  std::string_view path;                     // e.g. "/health"
  std::chrono::milliseconds timeout{1'000};  // connect + request + status line
  TlsTarget tls;                             // https:// endpoints: TLS with this context and name (else plain)
  std::string_view upstream_lines;           // the pool's header lines (credential, anthropic-version; CRLF each)
  std::string* tls_error = nullptr;          // non-null: set to why a TLS handshake or certificate check failed
  // fetch_text only: its User-Agent and Accept, and (non-null) where it
  // says why it returned 0: refused, timed out, TLS, a cut or oversized answer.
  std::string_view user_agent = "weir-load";
  std::string_view accept = "text/plain";
  std::string* failure = nullptr;
};

// True when the server answered with a 2xx status line (RFC 9112 §4) in
// time; false on refusal, timeout, reset, a failed TLS handshake or
// certificate check, or any other status. Closes the
// connection either way (Connection: close). (`r` by reference: GCC 12
// miscopies coroutine parameters passed on the stack.)
Task<bool> probe_health(Executor ex, const ProbeRequest& r);

// `GET <path>` the same way, reading the whole response within r.timeout
// (Beast's parser: Content-Length, chunked or close-delimited, RFC 9112 §6)
// into `body`. Returns the status code, or 0 on refusal, timeout, reset, a
// malformed or cut response, or a body over `max_bytes` (`body` then empty;
// r.failure, when set, says which). Also the control plane's one HTTP client
// for small documents (auth/jwks_http.cpp).
// (Parameters by reference: see probe_health.)
Task<int> fetch_text(Executor ex, const ProbeRequest& r, std::string& body, const std::size_t& max_bytes);

}  // namespace weir::http
