#include "http/probe.hpp"

#include "http/tls.hpp"

#include <array>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

namespace weir::http {

namespace {

// Closes `sock` at `r.timeout`: whatever is pending on it then completes with an error.
void close_at_deadline(Timer& deadline, const std::shared_ptr<Socket>& sock, const ProbeRequest& r) {
  deadline.expires_after(r.timeout);
  deadline.async_wait([weak = std::weak_ptr<Socket>(sock)](boost::system::error_code ec) {
    if (ec) return;
    if (auto s = weak.lock()) {
      boost::system::error_code ignored;
      s->close(ignored);
    }
  });
}

// The probe's request: GET `r.path`, Connection: close, the pool's key when it has one.
std::string probe_request(const ProbeRequest& r, std::string_view agent, std::string_view accept) {
  std::string req = fmt::format("GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}\r\n", r.path, r.host_header, agent);
  if (!accept.empty()) fmt::format_to(std::back_inserter(req), "Accept: {}\r\n", accept);
  req += r.upstream_lines;
  req += "Connection: close\r\n\r\n";
  return req;
}

// The status line check of probe_health over `stream` (the socket or TLS over it).
template <class Stream>
Task<bool> probe_over(Stream& stream, const ProbeRequest& r) {
  const std::string req = probe_request(r, "weir-health", {});
  auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(req), use_task);
  (void)wn;
  std::array<char, 64> buf{};
  std::size_t have = 0;
  while (!wec && have < 12) {  // "HTTP/1.1 200"
    auto [rec, n] = co_await stream.async_read_some(asio::buffer(buf.data() + have, buf.size() - have), use_task);
    if (rec) break;
    have += n;
  }
  const std::string_view line(buf.data(), have);
  co_return have >= 12 && line.starts_with("HTTP/1.") && line[8] == ' ' && line[9] == '2';
}

// Says why fetch_text failed, when asked: `what` and the error, or that the
// deadline passed (it closed the socket under the pending operation).
void fail(const ProbeRequest& r, const Socket& sock, std::string_view what, const boost::system::error_code& ec) {
  if (!r.failure) return;
  *r.failure = sock.is_open() ? fmt::format("{}: {}", what, ec.message())
                              : fmt::format("no answer within {} ms", r.timeout.count());
}

// The GET of fetch_text over `stream` (on `sock`); returns the status (0 on failure).
template <class Stream>
Task<int> fetch_over(Stream& stream, const Socket& sock, const ProbeRequest& r, std::string& body,
                     const std::size_t& max_bytes) {
  const std::string req = probe_request(r, r.user_agent, r.accept);
  auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(req), use_task);
  (void)wn;
  if (wec) {
    fail(r, sock, "request write failed", wec);
    co_return 0;
  }
  // Beast frames the answer (Content-Length, chunked or close-delimited) within max_bytes.
  // The read buffer is bounded (Beast's 8 KiB head limit, then one 64 KiB
  // read): a chunk-size line or extensions that do not fit fail the fetch
  // (buffer_overflow) instead of growing it.
  boost::beast::flat_buffer buf(128 * 1024);
  boost::beast::http::response_parser<boost::beast::http::string_body> parser;
  parser.body_limit(max_bytes);
  auto [rec, rn] = co_await boost::beast::http::async_read(stream, buf, parser, use_task);
  (void)rn;
  // A TLS peer that closes without close_notify after a complete message is fine.
  if (rec && !(is_tls_close(rec) && parser.is_done())) {
    fail(r, sock, "response read failed", rec);
    co_return 0;
  }
  body = std::move(parser.get().body());
  co_return parser.get().result_int();
}

// Connects (and, for https://, handshakes) within the deadline, then runs
// probe_over (`body` null: returns 1 for a 2xx status line, else 0) or
// fetch_over (returns the status, 0 on failure). (Scalars and references
// only: see probe.hpp on GCC 12.)
Task<int> with_connection(Executor ex, const ProbeRequest& r, std::string* body, const std::size_t& max_bytes) {
  auto sock = std::make_shared<Socket>(ex);
  Timer deadline(ex);
  close_at_deadline(deadline, sock, r);
  int result = 0;
  auto [cec] = co_await sock->async_connect(r.addr, use_task);
  if (cec || !sock->is_open()) fail(r, *sock, "cannot connect", cec);
  if (!cec && sock->is_open()) {
    if (r.tls.client) {
      TlsStream tls(*sock, r.tls.client->context());
      std::string error;
      if (!prepare_client(tls, r.tls, error)) {
        if (r.tls_error) *r.tls_error = error;
        if (r.failure) *r.failure = error;
      } else {
        auto [hec] = co_await tls.stream.async_handshake(asio::ssl::stream_base::client, use_task);
        // (A handshake cut by the deadline closing the socket is a timeout, not a TLS verdict.)
        if (hec && sock->is_open()) {
          error = handshake_failure_reason(tls, hec);
          if (r.tls_error) *r.tls_error = error;
          if (r.failure) *r.failure = "TLS handshake failed: " + error;
        } else if (hec) {
          fail(r, *sock, "TLS handshake failed", hec);
        }
        if (!hec && body) {
          result = co_await fetch_over(tls.stream, *sock, r, *body, max_bytes);
        } else if (!hec) {
          const bool ok = co_await probe_over(tls.stream, r);
          result = ok ? 1 : 0;
        }
      }
    } else if (body) {
      result = co_await fetch_over(*sock, *sock, r, *body, max_bytes);
    } else {
      const bool ok = co_await probe_over(*sock, r);
      result = ok ? 1 : 0;
    }
  }
  deadline.cancel();
  boost::system::error_code ignored;
  sock->close(ignored);
  co_return result;
}

}  // namespace

Task<bool> probe_health(Executor ex, const ProbeRequest& r) {
  const std::size_t none = 0;
  const int ok = co_await with_connection(ex, r, nullptr, none);
  co_return ok == 1;
}

Task<int> fetch_text(Executor ex, const ProbeRequest& r, std::string& body, const std::size_t& max_bytes) {
  body.clear();
  co_return co_await with_connection(ex, r, &body, max_bytes);
}

}  // namespace weir::http
