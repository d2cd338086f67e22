// Upstream (model server) connections: HTTP/1.1 keep-alive over TCP, pooled
// per worker and per endpoint. Never shared between threads.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/system/error_code.hpp>

#include "core/async.hpp"
#include "http/io.hpp"

namespace weir::http {

// Why an upstream I/O step failed, for status mapping and metrics.
enum class UpstreamFailure : std::uint8_t {
  none,
  connect_refused,  // ECONNREFUSED / unreachable → 502, endpoint ejected for a while
  connect_timeout,  // → 504
  timeout,          // first byte or idle timeout while reading → 504
  reset,            // connection reset / closed early → 502
  protocol,         // unparsable response → 502
  tls,              // TLS handshake or certificate verification failed → 502, like a refused connect
  cancelled,        // Weir closed it (client left) — not the upstream's fault
  breaker_open,     // no attempt: every endpoint of the pool is open (routing/health.hpp) → 503 + Retry-After
  // Weir could not open a socket: out of descriptors (EMFILE, ENFILE),
  // buffers or memory, or local ports (EADDRNOTAVAIL) → 503 + Retry-After;
  // Weir's shortage, never held against the endpoint.
  local_resources,
  // No attempt: the pool's admission queue had no room (its max_concurrent,
  // or the pool saturated) and a fallback was left, which took the request;
  // Weir's choice, never held against an endpoint.
  overloaded,
  // Not an I/O failure: the upstream answered with a 5xx status, which the
  // endpoint's health takes as a failed answer (routing/health.hpp). Only
  // counted (weir_upstream_failures_total{kind="status"}), never a request's
  // failure: the answer is retried, or passed on as the upstream's.
  status,
  count_,
};

// The label of a failure kind (metrics, logs): "connect_refused", "reset", ...
std::string_view to_string(UpstreamFailure f);
// True for a failure the upstream caused (none, cancelled and local_resources are not).
constexpr bool is_upstream_fault(UpstreamFailure f) {
  return f != UpstreamFailure::none && f != UpstreamFailure::cancelled && f != UpstreamFailure::local_resources &&
         f != UpstreamFailure::overloaded && f != UpstreamFailure::count_;
}

class TlsClient;  // http/tls.hpp
struct TlsStream;

// Where a TLS connection goes (https:// endpoints): the pool's client
// context and the name sent as SNI (RFC 6066 §3: never an IP literal) and
// verified against the certificate (RFC 6125). A null client: plain TCP.
struct TlsTarget {
  TlsClient* client = nullptr;
  std::string_view server_name;
};

// One TCP connection to one endpoint, with its read buffer and deadline,
// and for an https:// endpoint its TLS stream over the socket.
class UpstreamConnection {
 public:
  explicit UpstreamConnection(Executor ex);
  ~UpstreamConnection();
  UpstreamConnection(const UpstreamConnection&) = delete;
  UpstreamConnection& operator=(const UpstreamConnection&) = delete;

  Socket& socket() { return sock_; }
  // The TLS stream over socket(), or null on a plain connection.
  TlsStream* tls() { return tls_.get(); }
  // Why the last connect() failed its TLS handshake (for the log), else empty.
  const std::string& tls_error() const { return tls_error_; }
  // A handshake the server failed after the client's part of it (TLS 1.3:
  // a refused client certificate is an alert on the first read).
  void set_tls_error(std::string why) { tls_error_ = std::move(why); }
  boost::beast::flat_buffer& buffer() { return buf_; }
  core::Watchdog& watchdog() { return watchdog_; }

  // Closes the socket now: pending reads and writes complete with an error.
  // `why` is remembered (timeout vs cancel) for the caller that sees the error.
  void abort(UpstreamFailure why);
  UpstreamFailure aborted_for() const { return aborted_for_; }

  bool is_open() const { return sock_.is_open(); }
  // Requests completed on this connection (0 = fresh).
  std::uint32_t uses = 0;
  // When it went back to the idle pool.
  std::chrono::steady_clock::time_point idle_since{};

 private:
  friend Task<UpstreamFailure> connect(UpstreamConnection& c, const tcp::endpoint& ep, const TlsTarget& tls,
                                       std::chrono::milliseconds timeout,
                                       std::chrono::steady_clock::time_point handshake_by);
  Socket sock_;
  boost::beast::flat_buffer buf_;
  core::Watchdog watchdog_;
  UpstreamFailure aborted_for_ = UpstreamFailure::none;
  std::unique_ptr<TlsStream> tls_;  // only for https:// endpoints: plain connections allocate nothing more
  std::string tls_error_;
};

// Idle keep-alive connections to one endpoint, newest first out (LIFO keeps
// the hot connections hot and lets old ones age out). Bounded by count
// (max_idle) and by time (max_idle_age, enforced by put() and sweep()).
class ConnectionPool {
 public:
  ConnectionPool(std::uint32_t max_idle, std::chrono::milliseconds max_idle_age)
      : max_idle_(max_idle), max_idle_age_(max_idle_age) {}

  // A reusable connection, or nullptr. Connections idle longer than
  // max_idle_age, closed by the server, or holding unsolicited bytes are
  // closed and dropped (known from epoll at no cost for a quiet connection,
  // else by a recv(MSG_PEEK)).
  std::unique_ptr<UpstreamConnection> take(std::chrono::steady_clock::time_point now);
  // Returns a connection after a complete response; closes it if the pool is full.
  void put(std::unique_ptr<UpstreamConnection> c, std::chrono::steady_clock::time_point now);
  // Closes the idle connections that are max_idle_age old (no system call)
  // and those the server has closed (FIN or RST pending: else they sit in
  // CLOSE-WAIT, holding a descriptor, until the next take() reaches them) or
  // written to unasked: one recv(MSG_PEEK | MSG_DONTWAIT), about 1 µs, per
  // younger connection epoll has reported something on since its response
  // drained it, none for the quiet ones (http::quiet_since_drained). Meant for a periodic timer off the request
  // path (the worker's, every few hundred ms). Keeps the others in order.
  // Returns how many it closed.
  std::size_t sweep(std::chrono::steady_clock::time_point now);
  // Closes every idle connection (drain, shutdown).
  void clear();
  // Takes `from`'s idle connections (oldest first, each keeping its idle
  // time), as many as this pool keeps: a configuration reload hands an
  // endpoint's connections to the pool that serves it next.
  void adopt(ConnectionPool& from);
  std::size_t idle() const { return idle_.size(); }

 private:
  // Ordered by idle_since, oldest first (put() appends, take() pops the back).
  std::vector<std::unique_ptr<UpstreamConnection>> idle_;
  std::uint32_t max_idle_;
  std::chrono::milliseconds max_idle_age_;
};

// Opens a TCP connection to `ep` with TCP_NODELAY within `timeout` and, when
// `tls.client` is set, runs the TLS client handshake on it (SNI, certificate
// verification, ALPN http/1.1) by `handshake_by` ({}: within the same
// `timeout`). Returns the failure kind (connect_refused, connect_timeout,
// tls with c.tls_error() set, cancelled).
Task<UpstreamFailure> connect(UpstreamConnection& c, const tcp::endpoint& ep, const TlsTarget& tls,
                              std::chrono::milliseconds timeout,
                              std::chrono::steady_clock::time_point handshake_by = {});

// The TCP connect timeout of one try at an address when `remaining` of a
// connect timeout is left for `tries` addresses, this one included: an equal
// share (Go's net.Dialer rule), but at least kMinConnectShare unless less is
// left (Go's floor is 2 s; a lost SYN is sent again after 1 s), never 0. A
// refused try takes next to nothing of its share, so the ones after it get
// the more. A TLS handshake is not in the share: it has what is left of the
// whole timeout (connect()'s `handshake_by`), as Go's TLSHandshakeTimeout is
// apart from its dial.
inline constexpr std::chrono::milliseconds kMinConnectShare{1000};
constexpr std::chrono::milliseconds connect_share(std::chrono::milliseconds remaining, std::size_t tries) {
  auto share = tries > 1 ? remaining / static_cast<std::int64_t>(tries) : remaining;
  if (share < kMinConnectShare) share = std::min(kMinConnectShare, remaining);
  return share.count() < 1 ? std::chrono::milliseconds(1) : share;
}

// Maps a socket/Beast error seen while talking to the upstream to a failure kind,
// taking into account why Weir itself may have aborted the connection.
UpstreamFailure classify(const UpstreamConnection& c, const boost::system::error_code& ec);

}  // namespace weir::http
