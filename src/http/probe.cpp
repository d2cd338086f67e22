#include "http/probe.hpp"

#include "http/io.hpp"
#include "http/retry_after.hpp"

#include "http/shortage.hpp"
#include "http/tls.hpp"
#include "http/upstream.hpp"

#include <array>
#include <charconv>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

namespace weir::http {

namespace {

namespace bh = boost::beast::http;
using Parser = bh::response_parser<bh::string_body>;
// A request as written: its head and its body (empty for a GET). One buffer
// type for every write here, so each stream type has one write operation.
using RequestBuffers = std::array<asio::const_buffer, 2>;

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

// Connects `sock` to `a`, closing it at `until` if the connect is still
// under way then (a try out of time: the socket closed, as
// close_at_deadline leaves it). (References: see probe.hpp on GCC 12.)
Task<boost::system::error_code> connect_until(Executor ex, const std::shared_ptr<Socket>& sock, const tcp::endpoint& a,
                                              const std::chrono::steady_clock::time_point& until) {
  Timer timer(ex);
  auto done = std::make_shared<bool>(false);
  timer.expires_at(until);
  timer.async_wait([weak = std::weak_ptr<Socket>(sock), done](boost::system::error_code ec) {
    if (ec || *done) return;
    if (auto s = weak.lock()) {
      boost::system::error_code ignored;
      s->close(ignored);
    }
  });
  auto [ec] = co_await sock->async_connect(a, use_task);
  *done = true;
  co_return ec;
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
  const RequestBuffers out{asio::buffer(req), asio::const_buffer()};
  auto [wec, wn] = co_await asio::async_write(stream, out, use_task);
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
// `kind` is its class when the deadline did not cut it.
void fail(const ProbeRequest& r, const Socket& sock, std::string_view what, const boost::system::error_code& ec,
          FetchFailure kind) {
  if (r.failure_kind) *r.failure_kind = sock.is_open() ? kind : FetchFailure::timeout;
  if (!r.failure) return;
  *r.failure = sock.is_open() ? fmt::format("{}: {}", what, ec.message())
                              : fmt::format("no answer within {} ms", r.timeout.count());
}

// The most a read buffer of this client holds: Beast's 8 KiB head limit,
// then one 64 KiB read. A chunk-size line or chunk extensions that do not
// fit fail the read (buffer_overflow) instead of growing it without bound.
constexpr std::size_t kReadBufferCap = 128 * 1024;

// The most bytes of interim (1xx) heads before an answer: Beast's head limit
// (8 KiB), which the final head has on its own. Past it the read fails
// (http::error::header_limit) and the connection is closed.
constexpr std::size_t kMaxInterimHeads = 8 * 1024;

// An interim response's status (1xx but 101 Switching Protocols, RFC 9110 §15.2).
constexpr bool is_interim(int status) { return status >= 100 && status < 200 && status != 101; }

// Writes `request` to `stream`, then reads the answer into `parser` (Beast
// frames it: Content-Length, chunked or close-delimited, RFC 9112 §6,
// within the parser's limits), keeping what follows it in `buf`. Returns the
// error, if any; `wrote` says whether the request went out. Shared by
// fetch_text and KeptConnection::post.
// `body_limit`: the parser's (set here: a status line read again gets a new parser).
template <class Stream>
Task<boost::system::error_code> exchange_over(Stream& stream, const RequestBuffers& request,
                                              boost::beast::flat_buffer& buf, Parser& parser, std::uint64_t body_limit,
                                              bool& wrote) {
  auto [wec, wn] = co_await asio::async_write(stream, request, use_task);
  (void)wn;
  if (wec) co_return wec;
  wrote = true;
  parser.body_limit(body_limit);
  auto [rec, rn] = co_await bh::async_read(stream, buf, parser, use_task);
  // Beast's parser ends a message at an interim (1xx) head, which has no
  // body: skipped, as a client must (RFC 9110 §15.2), the answer being the
  // final response after them. (Taken for the answer, a 103 failed the
  // fetch, and on a kept connection left the real answer to be read as the
  // next request's.) Their heads count together against kMaxInterimHeads.
  bool space_restored = false;
  std::size_t interim_bytes = 0;
  for (;;) {
    if (rec == bh::error::bad_status && !space_restored && restore_status_line_space(buf)) {
      space_restored = true;  // "HTTP/1.1 200\r\n": read again
    } else if (rec || !is_interim(parser.get().result_int())) {
      break;
    } else if ((interim_bytes += rn) > kMaxInterimHeads) {
      rec = bh::error::header_limit;
      break;
    } else {
      space_restored = false;  // (each head's status line may lack its space)
    }
    std::destroy_at(&parser);
    std::construct_at(&parser);
    parser.body_limit(body_limit);
    auto [again, n2] = co_await bh::async_read(stream, buf, parser, use_task);
    rec = again;
    rn = n2;
  }
  // A TLS peer that closes without close_notify after a complete message is fine.
  if (rec && is_tls_close(rec) && parser.is_done()) co_return boost::system::error_code();
  co_return rec;
}

// The GET of fetch_text on `sock`, over `tls` when not null; returns the status (0 on failure).
Task<int> fetch_over(Socket& sock, TlsStream* tls, const ProbeRequest& r, std::string& body,
                     const std::size_t& max_bytes) {
  const std::string req = probe_request(r, r.user_agent, r.accept);
  const RequestBuffers out{asio::buffer(req), asio::const_buffer()};
  boost::beast::flat_buffer buf(kReadBufferCap);
  Parser parser;
  bool wrote = false;
  const auto ec = tls ? co_await exchange_over(tls->stream, out, buf, parser, max_bytes, wrote)
                      : co_await exchange_over(sock, out, buf, parser, max_bytes, wrote);
  if (ec) {
    fail(r, sock, wrote ? "response read failed" : "request write failed", ec,
         ec == bh::error::body_limit ? FetchFailure::too_large : FetchFailure::read);
    co_return 0;
  }
  body = std::move(parser.get().body());
  co_return parser.get().result_int();
}

// with_connection's result when the socket could not be opened for want of
// Weir's own resources (probe_health: ProbeResult::local_shortage).
constexpr int kLocalShortage = -1;

// Connects (and, for https://, handshakes) within the deadline, then runs
// probe_over (`body` null: returns 1 for a 2xx status line, else 0) or
// fetch_over (returns the status, 0 on failure). kLocalShortage (`body`
// null; fetch_text: 0 with FetchFailure::local_shortage) when the socket
// could not be opened or connected for want of Weir's own descriptors,
// buffers, memory or ports. (Scalars and references only: see probe.hpp on
// GCC 12.)
Task<int> with_connection(Executor ex, const ProbeRequest& r, std::string* body, const std::size_t& max_bytes) {
  auto sock = std::make_shared<Socket>(ex);
  Timer deadline(ex);
  close_at_deadline(deadline, sock, r);
  int result = 0;
  // Each address's TCP connect within its share of what is left of the deadline (http::connect_share, the
  // request path's rule): one refused, unreachable or silent leaves the others their turn. One address: the
  // whole of it. The TLS handshake after it has what is left of the deadline.
  using Clock = std::chrono::steady_clock;
  const auto end = deadline.expiry();
  std::size_t tries = 1;
  for (const auto& other : r.others) tries += other == r.addr ? 0 : 1;
  auto share_end = [&]() -> Clock::time_point {
    const auto now = Clock::now();
    return tries > 1 ? now + connect_share(std::chrono::ceil<std::chrono::milliseconds>(end - now), tries) : end;
  };
  boost::system::error_code cec;
  if (tries == 1)
    std::tie(cec) = co_await sock->async_connect(r.addr, use_task);
  else
    cec = co_await connect_until(ex, sock, r.addr, share_end());
  for (const auto& other : r.others) {
    if (other == r.addr) continue;
    const bool nobody = cec == asio::error::connection_refused || cec == asio::error::network_unreachable ||
                        cec == asio::error::host_unreachable ||
                        (!sock->is_open() && !is_local_shortage(cec));  // (its share ran out: closed)
    if (!nobody || Clock::now() >= end) break;
    --tries;
    boost::system::error_code ignored;
    sock->close(ignored);
    cec = co_await connect_until(ex, sock, other, share_end());
  }
  if (is_local_shortage(cec)) {
    // (socket(2) failed: the socket never opened, so this is no timeout either.)
    if (r.shortage) *r.shortage = cec;
    if (r.failure_kind) *r.failure_kind = FetchFailure::local_shortage;
    if (r.failure) *r.failure = fmt::format("cannot open a connection: {}", cec.message());
    result = body ? 0 : kLocalShortage;
  } else if (cec || !sock->is_open()) {
    fail(r, *sock, "cannot connect", cec, FetchFailure::connect);
  }
  if (!cec && sock->is_open()) {
    if (r.tls.client) {
      TlsStream tls(*sock, r.tls.client->context());
      std::string error;
      if (!prepare_client(tls, r.tls, error)) {
        if (r.tls_error) *r.tls_error = error;
        if (r.failure) *r.failure = error;
        if (r.failure_kind) *r.failure_kind = FetchFailure::tls;
      } else {
        auto [hec] = co_await tls.stream.async_handshake(asio::ssl::stream_base::client, use_task);
        // (A handshake cut by the deadline closing the socket is a timeout, not a TLS verdict.)
        if (hec && sock->is_open()) {
          error = handshake_failure_reason(tls, hec);
          if (r.tls_error) *r.tls_error = error;
          if (r.failure) *r.failure = "TLS handshake failed: " + error;
          if (r.failure_kind) *r.failure_kind = FetchFailure::tls;
        } else if (hec) {
          fail(r, *sock, "TLS handshake failed", hec, FetchFailure::tls);
        }
        if (!hec && body) {
          result = co_await fetch_over(*sock, &tls, r, *body, max_bytes);
        } else if (!hec) {
          const bool ok = co_await probe_over(tls.stream, r);
          result = ok ? 1 : 0;
        }
      }
    } else if (body) {
      result = co_await fetch_over(*sock, nullptr, r, *body, max_bytes);
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

Task<ProbeResult> probe_health(Executor ex, const ProbeRequest& r) {
  const std::size_t none = 0;
  const int ok = co_await with_connection(ex, r, nullptr, none);
  if (ok == kLocalShortage) co_return ProbeResult::local_shortage;
  co_return ok == 1 ? ProbeResult::healthy : ProbeResult::unhealthy;
}

Task<int> fetch_text(Executor ex, const ProbeRequest& r, std::string& body, const std::size_t& max_bytes) {
  body.clear();
  co_return co_await with_connection(ex, r, &body, max_bytes);
}

namespace {

using Resolver = asio::ip::basic_resolver<tcp, Executor>;

// One open connection of a KeptConnection: the socket, TLS over it for
// https://, what was read past the last answer.
struct KeptSocket {
  explicit KeptSocket(Executor ex) : sock(ex) {}
  Socket sock;
  std::unique_ptr<TlsStream> tls;  // declared after `sock`, which it refers to
  boost::beast::flat_buffer buf{kReadBufferCap};
  bool timed_out = false;  // the step's deadline passed: its timer closed `sock`
};

// Closes `c`'s socket `after` from now, unless `timer` is cancelled first:
// whatever is pending on it then completes with an error.
void close_after(Timer& timer, const std::shared_ptr<KeptSocket>& c, std::chrono::milliseconds after) {
  c->timed_out = false;
  timer.expires_after(after);
  timer.async_wait([weak = std::weak_ptr<KeptSocket>(c)](boost::system::error_code ec) {
    if (ec) return;
    if (auto s = weak.lock()) {
      s->timed_out = true;
      boost::system::error_code ignored;
      s->sock.close(ignored);
    }
  });
}

}  // namespace

struct KeptConnection::State {
  State(Executor e, PostTarget t) : ex(e), target(std::move(t)), timer(e) {}
  Executor ex;
  PostTarget target;
  std::shared_ptr<TlsClient> tls;    // https:// only
  std::string tls_error;             // why `tls` could not be made
  std::shared_ptr<KeptSocket> conn;  // null: none open
  Timer timer;                       // the current step's deadline
};

KeptConnection::KeptConnection(Executor ex, PostTarget target) : s_(std::make_unique<State>(ex, std::move(target))) {
  if (s_->target.tls) {
    core::TlsConfig cfg;
    cfg.ca_file = s_->target.ca_file;  // empty: the system store; names verified
    s_->tls = TlsClient::make(cfg, s_->tls_error);
  }
}

KeptConnection::~KeptConnection() { close(); }

bool KeptConnection::connected() const { return s_->conn != nullptr; }

void KeptConnection::close() {
  s_->timer.cancel();
  if (!s_->conn) return;
  boost::system::error_code ignored;
  s_->conn->sock.shutdown(tcp::socket::shutdown_both, ignored);
  s_->conn->sock.close(ignored);
  s_->conn.reset();
}

Task<PostAnswer> KeptConnection::post(const PostRequest& r) {
  PostAnswer a;
  for (int round = 0; round < 2; ++round) {
    const bool reused = connected();
    if (!reused) {
      if (std::string error = co_await open(r); !error.empty()) {
        close();
        a = PostAnswer();
        a.error = std::move(error);
        co_return a;
      }
    }
    bool answered = false;
    a = co_await send(r, answered);
    if (a.status != 0 || !reused || answered) break;
  }
  co_return a;
}

// Resolves the host, connects to each address in turn and, for https://,
// handshakes: each step within r.timeout. Returns why it failed ("" when open).
Task<std::string> KeptConnection::open(const PostRequest& r) {
  State& s = *s_;
  if (s.target.tls && !s.tls) co_return s.tls_error;
  auto resolver = std::make_shared<Resolver>(s.ex);
  s.timer.expires_after(r.timeout);
  s.timer.async_wait([weak = std::weak_ptr<Resolver>(resolver)](boost::system::error_code ec) {
    if (auto res = weak.lock(); res && !ec) res->cancel();
  });
  const std::string port = std::to_string(s.target.port);
  auto [rec, endpoints] = co_await resolver->async_resolve(s.target.host, port, use_task);
  s.timer.cancel();
  if (rec) co_return fmt::format("cannot resolve {}: {}", s.target.host, rec.message());

  auto c = std::make_shared<KeptSocket>(s.ex);
  close_after(s.timer, c, r.timeout);  // the connect and the TLS handshake
  boost::system::error_code cec = asio::error::host_not_found;
  for (const auto& entry : endpoints) {
    if (c->timed_out) break;
    boost::system::error_code closed;
    c->sock.close(closed);
    std::tie(cec) = co_await c->sock.async_connect(entry.endpoint(), use_task);
    if (!cec) break;
  }
  if (!cec && c->timed_out) cec = asio::error::timed_out;
  if (cec) co_return fmt::format("cannot connect: {}", c->timed_out ? "timed out" : cec.message());
  boost::system::error_code ignored;
  c->sock.set_option(tcp::no_delay(true), ignored);
  if (s.tls) {
    c->tls = std::make_unique<TlsStream>(c->sock, s.tls->context());
    std::string error;
    if (!prepare_client(*c->tls, TlsTarget{.client = s.tls.get(), .server_name = s.target.host}, error))
      co_return error;
    auto [hec] = co_await c->tls->stream.async_handshake(asio::ssl::stream_base::client, use_task);
    if (hec) {
      if (c->timed_out) co_return std::string("TLS handshake failed: timed out");
      error = handshake_failure_reason(*c->tls, hec);
      co_return error.starts_with("TLS ") ? error : "TLS handshake failed: " + error;
    }
  }
  s.timer.cancel();
  s.conn = std::move(c);
  co_return std::string();
}

// The POST on the open connection, within r.timeout; `answered`: some of an
// answer came back (else a kept connection may have been closed in between).
Task<PostAnswer> KeptConnection::send(const PostRequest& r, bool& answered) {
  State& s = *s_;
  const std::shared_ptr<KeptSocket> c = s.conn;
  PostAnswer a;
  const std::string head =
      fmt::format("POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: {}\r\n{}Content-Length: {}\r\n\r\n", r.target,
                  r.host_header, r.content_type, r.header_lines, r.body.size());
  const RequestBuffers request{asio::buffer(head), asio::buffer(r.body.data(), r.body.size())};
  Parser parser;
  bool wrote = false;
  close_after(s.timer, c, r.timeout);
  const auto ec = c->tls ? co_await exchange_over(c->tls->stream, request, c->buf, parser, r.max_body, wrote)
                         : co_await exchange_over(c->sock, request, c->buf, parser, r.max_body, wrote);
  s.timer.cancel();
  answered = parser.got_some();
  auto& res = parser.get();
  // A final status read is the answer even when its body then fails (too large, cut, timed out): the server
  // took the POST, and a 2xx must not be sent again as if it had not (OTLP retries only what failed).
  const bool final_head = parser.is_header_done() && !is_interim(res.result_int());
  if (final_head) {
    a.status = res.result_int();
    if (const auto wait = parse_retry_after(res[bh::field::retry_after], std::chrono::system_clock::now()))
      a.retry_after = *wait;
  }
  if (ec) {
    a.error = c->timed_out ? "timed out" : ec.message();
    if (final_head) a.error = "the answer's body: " + a.error;
    close();
    co_return a;
  }
  a.body = std::move(res.body());
  if (!parser.keep_alive()) close();  // every Connection line (RFC 9110 §5.3)
  co_return a;
}

}  // namespace weir::http
