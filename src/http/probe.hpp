// The control plane's small HTTP/1.1 client. An active health probe of one
// model server: `GET <path>` over a fresh connection, answered within a
// timeout. It costs the model server no generation (vLLM's GET /health
// answers 200 with an empty body; /v1/models works for any
// OpenAI-compatible server). fetch_text: a small document (JWKS, a model
// server's /metrics). KeptConnection: POSTs on one kept-alive connection
// (the trace exporter's OTLP/HTTP requests, tracing/exporter.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "http/io.hpp"
#include "http/upstream.hpp"

namespace weir::http {

// Why fetch_text returned 0 (ProbeRequest::failure_kind).
enum class FetchFailure : std::uint8_t {
  none,
  connect,    // refused, unreachable, or no connection
  timeout,    // r.timeout passed first
  tls,        // the TLS handshake or certificate check failed
  read,       // the request could not be written, or the answer was cut or malformed
  too_large,  // the body was over max_bytes
  // Weir could not open the socket: out of descriptors, buffers, memory or
  // local ports (http/shortage.hpp). Nothing was asked of the server.
  local_shortage,
};

// What a health probe found (probe_health).
enum class ProbeResult : std::uint8_t {
  healthy,    // a 2xx status line in time
  unhealthy,  // refused, timed out, reset, a failed TLS handshake or certificate check, any other status
  // Not made: Weir could not open the socket (FetchFailure::local_shortage).
  // No verdict on the endpoint: its state stays as it was.
  local_shortage,
};

// What to send and how long to wait (request parameters are copied into the
// coroutine frame by reference: keep them alive until it completes).
struct ProbeRequest {
  tcp::endpoint addr;
  // The host's other addresses (routing::connect_endpoint's rule): tried in
  // order while a connect is refused, unreachable or out of its share of
  // the timeout (each address an equal share of what is left; routing::connect_share).
  std::span<const tcp::endpoint> others;
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
  FetchFailure* failure_kind = nullptr;  // non-null: set to the class of that failure
  // Both: non-null, set to the socket(2) or connect(2) error when Weir was
  // short of a resource of its own (FetchFailure::local_shortage), else left.
  boost::system::error_code* shortage = nullptr;
};

// healthy when the server answered with a 2xx status line (RFC 9112 §4) in
// time; unhealthy on refusal, timeout, reset, a failed TLS handshake or
// certificate check, or any other status; local_shortage when Weir could not
// open the socket (EMFILE, ENFILE, ENOBUFS, ENOMEM, EADDRNOTAVAIL: its own
// shortage, never the endpoint's). Closes the connection either way
// (Connection: close). (`r` by reference: GCC 12 miscopies coroutine
// parameters passed on the stack.)
Task<ProbeResult> probe_health(Executor ex, const ProbeRequest& r);

// `GET <path>` the same way, reading the whole response within r.timeout
// (Beast's parser: Content-Length, chunked or close-delimited, RFC 9112 §6)
// into `body`. Returns the final response's status code (interim 1xx heads
// before it are skipped, up to 8 KiB of them in all: past that the response
// is malformed), or 0 on refusal, timeout, reset, a
// malformed or cut response, a body over `max_bytes`, or a socket Weir could
// not open (`body` then empty; r.failure, when set, says which). Also the control plane's one HTTP client
// for small documents (auth/jwks_http.cpp).
// (Parameters by reference: see probe_health.)
Task<int> fetch_text(Executor ex, const ProbeRequest& r, std::string& body, const std::size_t& max_bytes);

// Where a KeptConnection goes.
struct PostTarget {
  std::string host;  // resolved at each connect (each address in turn); https://: SNI and the name verified
  std::uint16_t port = 80;
  bool tls = false;     // https://: TLS 1.2 at least, the certificate chain and the host name verified
  std::string ca_file;  // https://: trusted CAs (PEM); empty = the system store
};

// One POST (its fields are read while it runs: keep them alive until it completes).
struct PostRequest {
  std::string_view target;        // path and query
  std::string_view host_header;   // "host:port" as sent in Host
  std::string_view content_type;  // of `body`
  std::string_view header_lines;  // more header lines (User-Agent, credentials), CRLF each
  std::string_view body;          // sent with its Content-Length
  // Each step within it: the name's resolution, the connect (with the TLS
  // handshake), then the request and its answer.
  std::chrono::milliseconds timeout{1'000};
  std::size_t max_body = 64 * 1024;  // a longer answer body: its status, `error` set, `body` empty
};

// What a POST got back.
struct PostAnswer {
  // The final answer's status (interim 1xx heads before it skipped, as fetch_text does); 0 = none (`error` says why).
  int status = 0;
  // Why no answer came (status 0), or why its body could not be read whole (a status set: the server answered;
  // `body` then empty).
  std::string error;
  // The wait the answer's Retry-After asks for (http/retry_after.hpp: delay-seconds, or an HTTP-date's time
  // from now; one too large to read is 10^9 s, for the caller to cap); 0 = none, unreadable, or no wait.
  std::chrono::milliseconds retry_after{};
  std::string body;  // the answer's body (Content-Length, chunked or close-delimited)
};

// POSTs to one endpoint on one kept-alive connection (plain or TLS), opened
// on the first POST and again after the server closed it or an error. One
// POST at a time, on the executor's thread.
class KeptConnection {
 public:
  // For https://, the TLS context is built here; a CA file that cannot be
  // loaded fails every POST, saying why.
  KeptConnection(Executor ex, PostTarget target);
  ~KeptConnection();
  KeptConnection(const KeptConnection&) = delete;
  KeptConnection& operator=(const KeptConnection&) = delete;

  // POSTs r.body to r.target. A kept connection the server closed in
  // between fails before any answer: the POST is then sent once more, on a
  // new connection. Any error, and an answer with Connection: close, closes
  // the connection. (`r` by reference: see probe_health.)
  Task<PostAnswer> post(const PostRequest& r);
  // Closes the connection, if open (a new one is opened by the next POST).
  void close();
  bool connected() const;

 private:
  struct State;
  Task<std::string> open(const PostRequest& r);
  Task<PostAnswer> send(const PostRequest& r, bool& answered);
  std::unique_ptr<State> s_;
};

}  // namespace weir::http
