// The admin listener's connections (admin: {listen: ...}): HTTP/1.1 with
// keep-alive, one request at a time. A request's head is checked as on the
// client listener (http/request_check.hpp), then by answer_on_head() (the
// token among it) before its body is read; a head that expects 100-continue
// gets it only once that let it pass (RFC 9110 §10.1.1); then the body is
// read within kMaxBody and the route's handler answers.
#include "gateway/admin_server.hpp"
#include "http/headers.hpp"

#include <array>
#include <memory>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <boost/asio/write.hpp>
#include <boost/beast/core/basic_stream.hpp>
#include <boost/beast/http.hpp>

#include "core/access_log.hpp"
#include "core/json_text.hpp"
#include "core/text.hpp"
#include "core/text_writer.hpp"
#include "core/time.hpp"
#include "gateway/admin.hpp"
#include "gateway/console_assets.hpp"
#include "gateway/host_rule.hpp"
#include "gateway/key_store.hpp"
#include "gateway/worker.hpp"
#include "http/client_address.hpp"
#include "http/flat_parser.hpp"
#include "http/io.hpp"
#include "http/request_check.hpp"

namespace weir::gateway {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bh = boost::beast::http;

namespace {

constexpr std::size_t kMaxBody = 1u << 20;
constexpr std::size_t kMaxHeader = 16 * 1024;  // request head limit (431; a request line alone over it: 414)
constexpr std::size_t kReadRoom = 64 * 1024;   // read-buffer room beyond a head: one read
constexpr auto kIdleTimeout = std::chrono::seconds(30);
// The idle wait of a connection none of whose requests yet presented the admin token (a new one, or one
// that only fetched the console's files, /ready or /metrics, or was refused): it holds one of
// admin.max_connections, so it has a few seconds to send a head, not kIdleTimeout.
constexpr auto kUntrustedIdleTimeout = std::chrono::seconds(5);
constexpr auto kRequestTimeout = std::chrono::seconds(10);

using Stream = beast::basic_stream<asio::ip::tcp, core::Executor>;

// Every answer of the admin listener, JSON and refusals of a malformed
// request included, under the console's policy: nothing here may be
// framed, sniffed into another type, or run script from elsewhere.
void set_security_fields(bh::response<bh::string_body>& res) {
  res.set("Content-Security-Policy", console::kContentSecurityPolicy);
  res.set("X-Content-Type-Options", "nosniff");
  res.set("X-Frame-Options", "DENY");
  res.set("Referrer-Policy", "no-referrer");
  res.set("Cross-Origin-Opener-Policy", "same-origin");
  res.set("Cross-Origin-Resource-Policy", "same-origin");
}

// Lingering close (RFC 9112 §9.6), after an answer the connection ends
// with: the client may still be sending (a head or body refused midway, a
// body sent after all without waiting for 100 Continue); closing with its
// bytes unread would reset the connection and could lose the answer. Read
// and discard for up to 2 s or 1 MiB, then close.
core::Task<void> linger(Stream& stream) {
  boost::system::error_code ignored;
  stream.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  stream.expires_after(std::chrono::seconds(2));
  std::array<char, 8192> sink;
  for (std::size_t total = 0; total <= (1u << 20);) {
    auto [rec, rn] = co_await stream.async_read_some(asio::buffer(sink), core::use_task);
    if (rec) break;
    total += rn;
  }
}

}  // namespace

void AdminServer::log_request(std::string_view method, std::string_view path, std::string_view client, int status,
                              core::TimePoint t0, std::size_t bytes_in, std::size_t bytes_out, bool scrape) const {
  // A scrape is not logged, as on the client port (a refused request to /metrics is).
  if (!shared_.log_sink || !shared_.log_sink->enabled() || scrape) return;
  std::string line;
  {
    core::TextWriter w(line, 256);
    w.put(R"({"ts":")");
    core::put_rfc3339(w, std::chrono::system_clock::now());
    w.put(R"(","listener":"admin","method":)");
    w.put_log_string(core::utf8_prefix(method, 16));
    w.put(R"(,"path":)");
    w.put_log_string(core::utf8_prefix(path, core::kMaxEchoBytes));
    w.put(R"(,"client":)");
    if (client.empty())
      w.put("null");
    else
      w.put_log_string(client);
    w.put(R"(,"status":)");
    w.put_int(status);
    w.put(R"(,"duration_ms":)");
    w.put_scaled(core::micros_between(t0, core::now()), 3);
    w.put(R"(,"bytes_in":)");
    w.put_uint(bytes_in);
    w.put(R"(,"bytes_out":)");
    w.put_uint(bytes_out);
    w.put("}\n");
  }
  shared_.log_sink->write_lines(line);
}

core::Task<void> AdminServer::serve(http::Socket sock) {
  // (Counted in by spawn_serve; out when this ends, however it ends.)
  // Listed among the untrusted (spawn_serve may close the oldest of them to make room) until a request
  // presents the admin token.
  struct Counted {
    std::shared_ptr<ConnectionTable> table;
    std::list<http::Socket*>::iterator entry{};
    bool listed = false;
    void trust() {
      if (listed) table->untrusted.erase(entry);
      listed = false;
    }
    ~Counted() {
      trust();
      --table->count;
    }
  } counted{connections_};
  bool trusted = false;  // a request of this connection presented the admin token
  beast::basic_stream<asio::ip::tcp, core::Executor> stream(std::move(sock));
  counted.entry = connections_->untrusted.insert(connections_->untrusted.end(), &stream.socket());
  counted.listed = true;
  // The peer, for the log lines (read now: a client that resets the connection leaves none to read).
  core::IpText client_text{};
  const auto peer = http::socket_peer(stream.socket().native_handle());
  const std::string_view client(client_text.data(), peer ? core::format_ip(*peer, client_text) : 0);
  // Bounded: a head is parsed whole within kMaxHeader, a body piece by
  // piece; a chunk-size line or trailer section that does not fit is
  // refused (buffer_overflow), never held (the class of CVE-2023-39326).
  beast::flat_buffer buf(kMaxHeader + kReadRoom);
  // Chunk extensions: counted against kMaxHeader, no control bytes (http::ChunkExtCheck).
  http::ChunkExtCheck ext_check;
  // The reads' deadline cancels the socket's pending read, and does not
  // close it as the stream's own expiry would, so a head or body that did
  // not come in time still gets its 408 (and its log line).
  core::Watchdog read_deadline(stream.get_executor(), [&stream] {
    boost::system::error_code ignored;
    stream.socket().cancel(ignored);
  });
  for (;;) {
    http::FlatParser<true, http::AppendStringBody> parser;
    const auto set_up = [&] {
      parser.header_limit(kMaxHeader);
      parser.body_limit(kMaxBody);
      ext_check = {.left = kMaxHeader, .over = false};
      parser.on_chunk_header(ext_check);
    };
    set_up();
    stream.expires_never();
    read_deadline.reset_expired();
    if (buf.size() == 0) {
      // Idle (kIdleTimeout) until the head's first byte: a connection that
      // sends nothing in that time ends quietly.
      read_deadline.expires_after(trusted ? kIdleTimeout : kUntrustedIdleTimeout);
      auto [wec] = co_await stream.socket().async_wait(asio::ip::tcp::socket::wait_read, core::use_task);
      if (wec || read_deadline.expired()) co_return;
    }
    // From its first byte, the head has kRequestTimeout (then a 408); the
    // request's duration in its log line counts from there too.
    const auto t0 = core::now();
    read_deadline.expires_after(kRequestTimeout);
    auto [ec, n] = co_await bh::async_read_header(stream, buf, parser, core::use_task);
    // HTTP/1.2 to 1.9: read as HTTP/1.1 (RFC 9110 §2.5), as on the client listener (http::Downstream).
    if (ec == bh::error::bad_version &&
        http::take_higher_minor_as_11({static_cast<char*>(buf.data().data()), buf.size()})) {
      std::destroy_at(&parser);
      std::construct_at(&parser);
      set_up();
      std::tie(ec, n) = co_await bh::async_read_header(stream, buf, parser, core::use_task);
    }
    if (read_deadline.expired()) ec = beast::error::timeout;
    // (The head's own size is the limit's measure, as on the client listener: Beast's check lets one past it.)
    if (http::head_over_limit(ec, n, kMaxHeader)) ec = bh::error::header_limit;
    // The log's bytes_in, as on the client listener (http::Downstream::bytes_in): the head as far as it was
    // parsed, then what of the body was (framing included); a body left unread (refused on the head) is not.
    // A head the parser refused, or one the client left part-way, was taken from the connection all the same:
    // counted to its blank line where that came, else all that came of it.
    std::size_t bytes_in = n;
    if (ec && !parser.is_header_done()) {
      const std::string_view rest{static_cast<const char*>(buf.data().data()), buf.size()};
      const auto end = rest.find("\r\n\r\n");
      bytes_in += end == std::string_view::npos ? rest.size() : end + 4;
    }
    // A connection that closed before a byte of its next head ends quietly.
    if (ec && (ec == bh::error::end_of_stream || !parser.got_some())) co_return;
    // What RFC 9112 asks of a server beyond Beast's parse (framing, Host,
    // target form, Expect): refused before the body is read, as on the client listener.
    http::HeadProblem problem = http::HeadProblem::none;
    std::optional<AdminResponse> refused;  // answered on the head alone, its body not read
    bool head_checked = false;             // answer_on_head() asked (refused, or `handler` set)
    const AdminHandler* handler = nullptr;
    std::size_t continued = 0;  // the 100 Continue's bytes, when it went out
    AdminRequest req;
    std::string authorization;  // the first Authorization field's value
    std::size_t authorization_fields = 0;
    // (Also for a body declared over the limit, or a head refused or left after its request line: the
    // log line names the request, as on the client listener. Beast sets the target once the line parsed.)
    if (parser.is_header_done() || ec == bh::error::body_limit ||
        (parser.got_some() && !parser.get().target().empty())) {
      const auto& head = parser.get();
      req.method = std::string(head.method_string());
      std::string target_buf;
      const std::string_view target = http::origin_form(head.target(), target_buf);  // absolute-form: its path
      const auto q = target.find('?');
      req.path = std::string(target.substr(0, q));
      if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));
    }
    if (!ec) {
      problem = http::check_request_head(parser.get().base());
      const auto& head = parser.get();
      req.if_none_match = std::string(head[bh::field::if_none_match]);
      req.content_type = std::string(head[bh::field::content_type]);
      req.has_body = parser.chunked() || parser.content_length().value_or(0) > 0;
      // (Read only from a head that passed: one Host at most, a valid absolute-form target.)
      if (problem == http::HeadProblem::none)
        req.authority = std::string(request_authority(head.target(), head[bh::field::host]));
      for (const auto& f : head) {  // (every Content-Encoding line, joined: one of them coded is a coded body)
        if (f.name() == bh::field::content_encoding) {
          if (!req.content_encoding.empty()) req.content_encoding += ", ";
          req.content_encoding += core::trim_ows(f.value());
        } else if (f.name() == bh::field::authorization) {
          if (++authorization_fields == 1) authorization = std::string(f.value());
        }
      }
      if (problem == http::HeadProblem::none && !parser.is_done()) {
        const bool expects = http::expects_continue(head.base());
        // The head's refusals come before the body, with "Expect: 100-continue" or without (the same
        // answer either way: answer_on_head), so no body is read, nor waited for, for a request refused
        // anyway. A body that came whole with the head (and no 100 Continue asked for) is read first: no
        // wait, and the connection stays open whatever the answer.
        const auto length = parser.content_length();
        if (expects || !length || buf.size() < *length) {
          read_deadline.disarm();  // (the check may await a JWKS refetch: the head is in, the body not due)
          refused = co_await answer_on_head(req, authorization, authorization_fields, handler);
          head_checked = true;
          if (!refused && expects) {
            // RFC 9110 §10.1.1: the client waits for 100 Continue before its
            // body; a head refused (above) gets its final answer instead,
            // and the connection then closes.
            stream.expires_after(kRequestTimeout);
            auto [cec, cn] = co_await asio::async_write(stream, asio::buffer(http::kContinue), core::use_task);
            if (cec) co_return;
            continued = cn;
            stream.expires_never();
          }
        }
        if (!refused) {
          // http::read_message, as on the client listener: a chunked body's
          // framing with a bare LF is refused at once, not after the timeout.
          read_deadline.expires_after(kRequestTimeout);
          auto [bec, bn] = co_await http::read_message(stream, buf, parser, false);
          ec = read_deadline.expired() ? beast::error::timeout : bec;
          bytes_in += bn;
        }
      }
    }
    read_deadline.disarm();
    if (ec == bh::error::partial_message || ec == asio::error::eof || ec == asio::error::connection_reset) {
      // The client closed mid-request: nobody to answer (499, as on the client listener).
      log_request(req.method.empty() ? std::string_view("-") : std::string_view(req.method), req.path, client, 499, t0,
                  bytes_in, continued);
      co_return;
    }
    bh::response<bh::string_body> res;
    res.version(11);
    if (ec || problem != http::HeadProblem::none) {
      AdminError e = admin_bad_request(fmt::format("Malformed HTTP request: {}.", ec.message()));
      if (ec == beast::error::timeout) {  // the head or body did not come within kRequestTimeout
        e = AdminError{408,
                       "invalid_request_error",
                       "request_timeout",
                       fmt::format("The request did not arrive within {} s.", kRequestTimeout.count()),
                       {}};
      } else if (ec == bh::error::body_limit) {
        e = AdminError{413,
                       "invalid_request_error",
                       "payload_too_large",
                       fmt::format("The body is larger than {} bytes.", kMaxBody),
                       {}};
      } else if (ec == bh::error::header_limit &&
                 http::request_line_over(parser.got_some() && !parser.get().target().empty(),
                                         {static_cast<const char*>(buf.data().data()), buf.size()}, kMaxHeader)) {
        // A request line over the limit: 414 as on the client listener (RFC 9110 §15.5.15).
        e = AdminError{414,
                       "invalid_request_error",
                       "uri_too_long",
                       fmt::format("The request line is longer than {} bytes.", kMaxHeader),
                       {}};
      } else if (ec == bh::error::header_limit) {  // 431 as on the client listener (RFC 6585 §5)
        e = AdminError{431,
                       "invalid_request_error",
                       "request_header_too_large",
                       fmt::format("The request head is larger than {} bytes.", kMaxHeader),
                       {}};
      } else if (const std::string_view got{static_cast<const char*>(buf.data().data()), buf.size()};
                 ec && http::begins_proxy_protocol(got)) {
        const core::Error ce = core::proxy_protocol_unsupported();
        e = AdminError{ce.status, std::string(ce.type), std::string(ce.code), ce.message, {}};
      } else if (const char major = ec == bh::error::bad_version ? http::sent_major_version(got) : 0;
                 major != 0 && major != '1') {
        // HTTP/2 or later on the request line (h2's prior-knowledge preface): 505, as on the client listener.
        const core::Error ce = core::http_version_not_supported(major);
        e = AdminError{ce.status, std::string(ce.type), std::string(ce.code), ce.message, {}};
      } else if (ec == bh::error::buffer_overflow || ext_check.over) {
        e = admin_bad_request(
            "Malformed HTTP request: the chunked body's framing (a chunk-size line, chunk extensions or trailers) "
            "is too large.");
      } else if (ec && parser.obs_fold()) {
        e = admin_bad_request(
            "Malformed HTTP request: a header or trailer line begins with a space or tab (obs-fold, RFC 9112 §5.2); "
            "send "
            "each field on one line.");
      } else if (problem == http::HeadProblem::unsupported_coding) {
        e = AdminError{501,
                       "invalid_request_error",
                       "unsupported_transfer_coding",
                       "Transfer-Encoding other than chunked is not implemented; send the body with Content-Length "
                       "or Transfer-Encoding: chunked alone.",
                       {}};
      } else if (problem == http::HeadProblem::bad_framing) {
        e = admin_bad_request(
            "Malformed HTTP request: Transfer-Encoding must end in a single chunked, and comes with neither "
            "Content-Length nor HTTP/1.0; Content-Length comes once, with one value.");
      } else if (problem == http::HeadProblem::bad_host) {
        e = admin_bad_request(
            "Malformed HTTP request: a request needs exactly one valid Host header (HTTP/1.0: at most one).");
      } else if (problem == http::HeadProblem::bad_target) {
        e = admin_bad_request("Malformed HTTP request: the request target must be a path or an http(s) absolute URI.");
      } else if (problem == http::HeadProblem::unsupported_expectation) {
        e = AdminError{417,
                       "invalid_request_error",
                       "expectation_failed",
                       "The request's Expect field is not supported: the only expectation is 100-continue.",
                       {}};
      }
      res.result(static_cast<unsigned>(e.status));
      res.set(bh::field::content_type, "application/json");
      res.set(bh::field::cache_control, "no-store");
      set_security_fields(res);
      res.keep_alive(false);
      // An answer to HEAD has its length and no content (RFC 9110 §9.3.2): the request line was parsed
      // first, whatever came wrong after it; a line refused before it was whole (over kMaxHeader) began
      // with its method still.
      const bool head = parser.got_some() && !parser.get().target().empty()
                            ? parser.get().method() == bh::verb::head
                            : http::begins_head_request({static_cast<const char*>(buf.data().data()), buf.size()});
      if (head) {
        res.content_length(admin_error_json(e).size());
      } else {
        res.body() = admin_error_json(e);
        res.prepare_payload();
      }
      stream.expires_after(kRequestTimeout);
      auto [wec, wn] = co_await bh::async_write(stream, res, core::use_task);
      log_request(req.method.empty() ? std::string_view("-") : std::string_view(req.method), req.path, client,
                  wec ? 499 : e.status, t0, bytes_in, continued + wn);
      if (wec) co_return;
      co_await linger(stream);
      co_return;
    }
    auto& msg = parser.get();
    req.body = std::move(msg.body());
    // A request refused before its body: the body is never read, so the connection ends with the answer.
    const bool body_unread = refused.has_value();
    // Every Connection line (RFC 9110 §5.3); `close` among them ends it on HTTP/1.0 too.
    bool keep = parser.keep_alive() && !(parser.get().version() < 11 && http::connection_close(parser.get())) &&
                !stopped_ && !body_unread;
    // (No co_await inside a conditional expression: GCC 12 destroys its result too early.)
    std::optional<AdminResponse> answer = std::move(refused);
    if (!head_checked) answer = co_await answer_on_head(req, authorization, authorization_fields, handler);
    trusted = trusted || req.authorized;
    if (trusted) counted.trust();
    AdminResponse r;
    if (answer) {
      r = std::move(*answer);
    } else if (handed_over_ && req.method != "GET" && req.method != "HEAD") {
      // Another instance serves the admin API now (drain()) and owns what a write would change: this one
      // applies none, so none is answered as applied here and then lost or overridden there; the client
      // retries on a new connection, which reaches the new instance. (Checked as the handler would run:
      // a request whose head came before the handover too.)
      const AdminError e{503,
                         "server_error",
                         "service_unavailable",
                         "This Weir instance is handing over to another (a zero-downtime restart) and "
                         "applies no more changes: the request was not applied; retry it (a new "
                         "connection reaches the new instance).",
                         {}};
      r = AdminResponse{e.status, admin_error_json(e)};
      r.headers.emplace_back("Retry-After", "1");
      keep = false;
    } else {
      r = co_await (*handler)(req);
    }
    res.result(static_cast<unsigned>(r.status));
    if (r.status != 304) res.set(bh::field::content_type, r.content_type);
    res.set(bh::field::cache_control, r.cache_control);
    set_security_fields(res);
    for (auto& [name, value] : r.headers) res.set(name, value);
    // RFC 6750 §3.1: invalid_token for a token presented and refused; no error code with none (or another scheme).
    if (r.status == 401) {
      const auto token = auth::bearer_token(authorization);
      res.set(bh::field::www_authenticate, token && !token->empty()
                                               ? "Bearer realm=\"weir-admin\", error=\"invalid_token\""
                                               : "Bearer realm=\"weir-admin\"");
    }
    if (r.status == 405 && res.find(bh::field::allow) == res.end()) {
      std::vector<std::string> ignored;
      res.set(bh::field::allow, router_.match("", req.path, ignored).allow);
    }
    res.keep_alive(keep);
    if (r.status == 304) {
      // No body and no Content-Length (RFC 9110 §15.4.5: it would have to be the 200's).
    } else if (req.method == "HEAD") {
      res.content_length(r.body.size());  // the GET's length, without the body (RFC 9110 §9.3.2)
    } else {
      res.body() = std::move(r.body);
      res.prepare_payload();
    }
    stream.expires_after(kRequestTimeout);
    auto [wec, wn] = co_await bh::async_write(stream, res, core::use_task);
    // bytes_out: what was written, head and body, as on the client listener.
    log_request(req.method, req.path, client, wec ? 499 : r.status, t0, bytes_in, continued + wn,
                r.status == 200 && req.path == "/metrics");
    if (wec) co_return;
    if (body_unread) co_await linger(stream);
    if (!keep) co_return;
  }
}

}  // namespace weir::gateway
