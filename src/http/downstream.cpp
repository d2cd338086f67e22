#include "http/downstream.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <memory>
#include <tuple>

#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>

#include "http/client_address.hpp"
#include "http/headers.hpp"
#include "http/request_check.hpp"

namespace weir::http {

namespace bh = boost::beast::http;
using boost::system::error_code;

namespace {
// The posted read waits for a close or the start of a pipelined request:
// 64 bytes do (the rest of a pipelined request is read with it later), and
// an open stream then holds no more than that (per-connection buffers are
// most of a stream's memory).
constexpr std::size_t kMonitorRead = 64;
// The close watch's poll once the read buffer is full (Downstream::post_poll).
constexpr auto kClosePoll = std::chrono::milliseconds(100);
// Input buffer capacity a connection keeps after a request's body: a head and
// a small body (most requests) fit, so their reads allocate nothing.
constexpr std::size_t kKeepInput = 4096;
// lingering_close(): the longest silence between two reads.
constexpr std::chrono::seconds kLingerIdle{2};
// Room in the read buffer beyond server.max_header: one read (read_message
// reads at most 64 KiB at a time).
constexpr std::size_t kReadRoom = 64 * 1024;

ReadFailure failure_of(HeadProblem p) {
  switch (p) {
    case HeadProblem::bad_framing:
      return ReadFailure::bad_framing;
    case HeadProblem::unsupported_coding:
      return ReadFailure::unsupported_coding;
    case HeadProblem::bad_host:
      return ReadFailure::bad_host;
    case HeadProblem::bad_target:
      return ReadFailure::bad_target;
    case HeadProblem::unsupported_expectation:
      return ReadFailure::unsupported_expectation;
    case HeadProblem::none:
      break;
  }
  return ReadFailure::none;
}
}  // namespace

ParserSpares::~ParserSpares() {
  for (std::size_t i = 0; i < count_; ++i) ::operator delete(spare_[i]);
}

void* ParserSpares::take() { return count_ > 0 ? spare_[--count_] : ::operator new(sizeof(Downstream::RequestParser)); }

void ParserSpares::give(void* p) noexcept {
  if (count_ < kMax)
    spare_[count_++] = p;
  else
    ::operator delete(p);
}

Downstream::Downstream(Socket sock, const core::ServerConfig& sc, std::uint64_t* bytes_out_total, ParserSpares* spares)
    : sock_(std::move(sock)),
      sc_(sc),
      bytes_out_total_(bytes_out_total),
      in_(sc.max_header_bytes + kReadRoom),
      watchdog_(sock_.get_executor(),
                [this] {
                  if (stall_watch_) return check_stall();
                  timed_out_ = true;
                  // The idle wait's close watch ends by the deadline, not by the client leaving: read_head
                  // then serves a request that came meanwhile, or closes.
                  if (idle_ && reading_) monitor_cancelled_ = true;
                  error_code ignored;
                  sock_.cancel(ignored);
                }),
      spares_(spares) {
  error_code ignored;
  sock_.set_option(tcp::no_delay(true), ignored);
  sock_.non_blocking(true, ignored);  // flush() and write_all() try a send before they wait
}

Downstream::~Downstream() {
  watchdog_.stop();
  drop_parser();
}

const RequestHead& Downstream::request() const {
  static const RequestHead none;  // released: no fields
  return parser_ ? parser_->get() : none;
}

void Downstream::renew_parser() {
  FlatFields::Storage fields_store;
  if (parser_) {
    body_store_.swap(parser_->get().body());       // keep the body storage's capacity
    fields_store = parser_->get().take_storage();  // and the head's: a kept-alive connection's heads allocate nothing
    std::destroy_at(parser_);
  } else {
    void* storage = spares_ ? spares_->take() : ::operator new(sizeof(RequestParser));
    parser_ = static_cast<RequestParser*>(storage);
  }
  try {
    std::construct_at(parser_);
    parser_->get().adopt_storage(std::move(fields_store));
  } catch (...) {
    spares_ ? spares_->give(parser_) : ::operator delete(parser_);
    parser_ = nullptr;
    throw;
  }
}

void Downstream::drop_parser() noexcept {
  if (!parser_) return;
  std::destroy_at(parser_);
  spares_ ? spares_->give(parser_) : ::operator delete(parser_);
  parser_ = nullptr;
}

void Downstream::trim_storage(std::size_t max_bytes) {
  body_charge_.release();  // (the request is over: its body is no longer held for it)
  if (body_store_.capacity() > max_bytes) std::string().swap(body_store_);
  // (A request with no body never reached read_body's shrink of in_.)
  if (!reading_ && in_.size() == 0 && in_.capacity() > kKeepInput) in_.shrink_to_fit();
  if (!parser_) return;
  if (parser_->get().storage_bytes() > FlatFields::kKeepBytes) {
    release_request();
    return;
  }
  if (parser_->get().body().capacity() > max_bytes) std::string().swap(parser_->get().body());
}

void Downstream::release_request() {
  target_ = {};  // (a view into the parser's head)
  drop_parser();
  body_charge_.release();  // (the body went with it)
}

void Downstream::ChunkHeaders::operator()(std::uint64_t size, std::string_view extensions, error_code& ec) {
  ext(size, extensions, ec);
  if (ec || size == 0) return;
  // (Beast checked the size against server.max_body first: the sum stays within it.)
  announced += size;
  if (self->charge_body(announced)) return;
  over_budget = true;
  ec = bh::error::body_limit;
}

void Downstream::begin_request() {
  bytes_out_ = 0;
  interim_out_ = 0;
  count_total_ = true;
  chunked_ = http11();
  ended_ = false;
}

Task<Downstream::Head> Downstream::read_head(bool first, bool draining) {
  in_flight_ = false;  // the posted read (if any) is this request's, not a watch to renew
  end_stall_watch();   // the last answer is the kernel's now; the watchdog times this wait
  if (reading_) {
    // (Empty lines are no request: RFC 9112 §2.2, a CRLF after a body.)
    if (in_.size() > empty_lines_at(in_)) {
      // The next request is already buffered (pipelined): the posted read
      // would wait for bytes the client will not send before it gets its
      // answer. Stop it and serve what we have.
      monitor_cancelled_ = true;
      error_code ignored;
      sock_.cancel(ignored);
      if (poll_) poll_->cancel();
    } else {
      // The posted read of the previous request is still waiting: it is the
      // start of this request (or the client's goodbye).
      idle_ = true;
      watchdog_.expires_after(sc_.keepalive_timeout);
    }
    while (reading_) {
      if (!done_.take_wake()) co_await done_.park();
    }
  }
  // Empty lines after the last request are dropped, so a connection that
  // sent only those is idle. Never while a read into in_ is pending: a
  // consume that empties a flat_buffer moves its write position.
  in_.consume(empty_lines_at(in_));
  // The idle deadline passed as the next request came (a front proxy reusing its connection as
  // keepalive_timeout ends, or a worker that ran late): a request already here, in the buffer or the
  // socket, is served as the connection's last (Connection: close), not reset unread; the proxy could
  // not have known it was late. Nothing here: the connection closes, as before.
  bool last = false;
  if (timed_out_ && idle_ && rescue_waiting()) last = true;
  if (peer_gone_ || closed_ || timed_out_) co_return Head::closed;
  // Draining: a connection with no byte of a next request (a kept-alive one,
  // or a new one that has sent nothing yet) is idle, and ends. One whose
  // request is in its socket already, not yet read (a new one the drain
  // itself took from the accept queue, a kept-alive one whose request came
  // as the drain began) is served: what is there is taken without a wait.
  if ((draining || drain_started_) && in_.size() == 0 && !take_waiting()) co_return Head::closed;

  failure_ = ReadFailure::none;
  failure_ec_ = {};
  target_ = {};
  bytes_in_ = 0;
  client_len_ = 0;
  const auto new_parser = [this] {
    renew_parser();
    parser_->header_limit(sc_.max_header_bytes);
    chunk_headers_ = {.self = this, .ext = {.left = sc_.max_header_bytes, .over = false}};
    parser_->on_chunk_header(chunk_headers_);  // a reference: no allocation
    // No body limit while the head is read: Beast would reject a large
    // Content-Length as a header error; read_body() answers it with 413.
    parser_->body_limit(boost::none);
  };
  new_parser();
  version_ = 0;
  head_method_ = false;
  body_charge_.release();  // (the last request's body is over)
  body_store_.clear();
  const bool waited = in_.size() == 0;
  if (waited) {
    // Between two requests: keepalive_timeout until the next head's first
    // bytes; the head itself has header_timeout (below), so a head sent a
    // byte at a time holds a kept-alive connection no longer than a new one
    // (nginx's client_header_timeout). A new connection is idle until its
    // first byte too (a drain closes it at once, as a kept-alive one), and
    // has header_timeout from its accept to its head's end, as before.
    idle_ = true;
    watchdog_.expires_after(first ? sc_.header_timeout : sc_.keepalive_timeout);
    const auto room = in_.prepare(std::max<std::size_t>(512, in_.capacity() - in_.size()));
    auto [rec, rn] = co_await async_recv(sock_, room, use_task);
    if (!rec && rn > 0) {
      in_.commit(rn);
      // The deadline passed after these bytes came, before this resumed: served, as the last (above).
      if (timed_out_ && rescue_waiting()) last = true;
    } else if (rec == asio::error::operation_aborted && drain_started_ && !timed_out_ && take_waiting()) {
      // The drain ended the wait as the request came: it is served, as its connection's last.
    } else if (!(rec == asio::error::operation_aborted && timed_out_ && rescue_waiting())) {
      idle_ = false;
      watchdog_.disarm();
      co_return Head::closed;  // the client closed or idled out between requests: no request
    } else {
      last = true;  // the idle deadline ended the wait as the request came (above)
    }
    idle_ = false;
  }
  head_started_ = core::Watchdog::Clock::now();
  client_wait_ = {};
  // The peer, read while the connection is surely open (a client that resets it leaves none to read):
  // once per connection, for the access log's client and the X-Forwarded-For sent upstream.
  peer_address();
  // A head already here whole is parsed at once: it keeps the later
  // deadline (moving one earlier may re-arm the worker's timer, a system call).
  // (A new connection's deadline runs on from its accept.)
  // (From head_started_: its clock read serves both.)
  if (!first || last)
    watchdog_.expires_at(head_started_ + (head_buffered(in_) ? sc_.keepalive_timeout : sc_.header_timeout));
  else if (!waited)
    watchdog_.expires_at(head_started_ + sc_.header_timeout);
  idle_ = false;
  // A full buffer here is a close watch's 64 bytes (after a stream): the rest
  // of the request is waiting, and one read of what the connection keeps
  // (kKeepInput) takes a usual head and body (else 512, then the body: two).
  const std::size_t head_read =
      in_.size() > 0 && in_.size() == in_.capacity() && in_.size() < kKeepInput ? kKeepInput - in_.size() : 512;
  auto [ec, n] =
      co_await read_message(sock_, in_, *parser_, /*until_head=*/true, head_read, /*empty_lines=*/true, &client_wait_);
  // HTTP/1.2 to 1.9 (Beast's parser refuses a minor over 1, taking none of the head): read as HTTP/1.1,
  // RFC 9110 §2.5. Read again from the buffer, where Beast left the whole head it has so far.
  if (ec && ec == bh::error::bad_version &&
      take_higher_minor_as_11({static_cast<char*>(in_.data().data()), in_.size()})) [[unlikely]] {
    new_parser();
    std::tie(ec, n) = co_await read_message(sock_, in_, *parser_, /*until_head=*/true, head_read,
                                            /*empty_lines=*/true, &client_wait_);
  }
  watchdog_.disarm();
  bytes_in_ = n;  // (the head as far as it was parsed; empty lines before it are no request's)
  if (ec && !parser_->is_header_done()) [[unlikely]] {
    // A head the parser refused (a bad request line or field, one over the limit): answered, then the
    // connection closes. Or one the client left or reset part-way, or that timed out. The parser stopped
    // where it failed or at its last whole line, but the head was taken from the connection: counted to
    // its end where it is here, else all that came of it.
    const std::string_view rest{static_cast<const char*>(in_.data().data()), in_.size()};
    const auto end = rest.find("\r\n\r\n");
    bytes_in_ += end == std::string_view::npos ? rest.size() : end + 4;
  }
  // (The head's own size is the limit's measure: Beast's check lets one past it.)
  if (head_over_limit(ec, n, sc_.max_header_bytes)) ec = bh::error::header_limit;
  if (parser_->is_header_done()) {
    version_ = parser_->get().version();
    head_method_ = parser_->get().method() == bh::verb::head;
    if (!sc_.trusted_proxies.empty()) note_client();
  } else if (parser_->got_some() && !parser_->get().target().empty()) {
    // A head refused after its request line (a bad field, too large): Beast
    // parsed the line first, and the answer to a HEAD has no content still.
    head_method_ = parser_->get().method() == bh::verb::head;
  } else if (ec) {
    // Refused before its request line was whole (a line over the limit: 414): the method came first, and a
    // HEAD's answer has no content still (the client would read the body as the next answer).
    head_method_ = begins_head_request({static_cast<const char*>(in_.data().data()), in_.size()});
  }
  if (!ec) {
    const auto& req = parser_->get();
    if (const HeadProblem p = check_request_head(req); p != HeadProblem::none) [[unlikely]] {
      // Framing that cannot be trusted, or a head RFC 9112 says to refuse:
      // answered, then the connection closes (the bytes after it are no request).
      keep_alive_ = false;
      failure_ = failure_of(p);
      // A valid target names the route, whose shape the error then takes (gateway read phase).
      if (p != HeadProblem::bad_target) target_ = origin_form(req.target(), target_buf_);
      co_return Head::failed;
    }
    target_ = origin_form(req.target(), target_buf_);
    // The parser's verdict reads every Connection field line (RFC 9110 §5.3); the
    // message's keep_alive() only the first, so a second line's "close" was missed.
    // keepalive_timeout 0: no wait for a next request, so every answer says
    // Connection: close (RFC 9112 §9.6), never a silent close after it.
    // (drain_started_: a drain that began while this head was read.)
    // (Beast reads `close` on HTTP/1.1 itself; on 1.0 a keep-alive beside it won: read here, 1.0 only.)
    keep_alive_ = parser_->keep_alive() && !(version_ < 11 && connection_close(parser_->get())) && !draining &&
                  !drain_started_ && !last && sc_.keepalive_timeout.count() > 0;
    co_return Head::request;
  }
  // A connection that closes or idles out between requests is not a request
  // (a reset after part of a head is: as a close with FIN there, it is logged).
  const bool nothing = n == 0 && in_.size() == 0 && !parser_->got_some();
  if (closed_ && !nothing) {
    // The drain deadline closed it in the middle of a head: a request that
    // began, logged as one nothing could be answered to (as in read_body).
    keep_alive_ = false;
    failure_ec_ = ec;
    failure_ = ReadFailure::drain_cut;
    co_return Head::failed;
  }
  if (ec == bh::error::end_of_stream || closed_ || (timed_out_ && nothing) ||
      (ec == asio::error::connection_reset && nothing) || ec == asio::error::eof || ec == asio::error::bad_descriptor)
    co_return Head::closed;
  keep_alive_ = false;
  failure_ec_ = ec;
  if (ec == bh::error::partial_message || ec == asio::error::connection_reset) {
    // Closed or reset in the middle of a head: a request the client left
    // (499, nothing can be answered), not a malformed one (400).
    peer_gone_ = true;
    failure_ = ReadFailure::client_closed;
  } else if (timed_out_) {
    timed_out_ = false;
    failure_ = ReadFailure::head_timeout;
  } else if (ec == bh::error::header_limit) {
    // A request line over the limit: its URI is what is too long (414), not the header fields (431).
    // (From the bytes when Beast has no target yet: it had not parsed a line that did not come whole
    // with the first read, however short.)
    failure_ = request_line_over(parser_->got_some() && !parser_->get().target().empty(),
                                 {static_cast<const char*>(in_.data().data()), in_.size()}, sc_.max_header_bytes)
                   ? ReadFailure::line_too_long
                   : ReadFailure::head_too_large;
  } else if (ec == bh::error::buffer_overflow) {
    failure_ = ReadFailure::framing_too_large;
  } else if (const std::string_view got{static_cast<const char*>(in_.data().data()), in_.size()};
             begins_proxy_protocol(got)) {
    failure_ = ReadFailure::proxy_protocol;
  } else if (ec == bh::error::bad_version && (version_major_ = sent_major_version(got)) != 0 && version_major_ != '1') {
    failure_ = ReadFailure::version_not_supported;
  } else if (parser_->obs_fold()) {
    failure_ = ReadFailure::obs_fold;
  } else {
    failure_ = ReadFailure::malformed;
  }
  co_return Head::failed;
}

Task<bool> Downstream::read_body() {
  auto& req = parser_->get();
  end_stall_watch();                        // (the watchdog times the body, and a 100 Continue's write as a whole)
  parser_->body_limit(sc_.max_body_bytes);  // chunked bodies are cut here too
  if (auto cl = parser_->content_length(); cl && *cl > sc_.max_body_bytes) {
    // Refuse before reading: the client may not even send the body (Expect).
    keep_alive_ = false;
    failure_ = ReadFailure::body_too_large;
    co_return false;
  }
  // Charged whole before it is read (AppendStringBody reserves it whole): refused, as above, before the client
  // sends it.
  if (auto cl = parser_->content_length(); cl && !charge_body(*cl)) {
    keep_alive_ = false;
    failure_ = ReadFailure::over_budget;
    co_return false;
  }
  // RFC 9110 §10.1.1 (an HTTP/1.0 request's 100-continue is ignored).
  if (expects_continue(req)) {
    watchdog_.expires_after(sc_.write_timeout);
    auto [ec, n] = co_await asio::async_write(sock_, asio::buffer(kContinue), use_task);
    watchdog_.disarm();
    // (The interim response is bytes written to the client: the log's bytes_out and weir_response_bytes_total.)
    count_out(n);
    interim_out_ = n;
    if (ec) {
      peer_gone_ = true;
      keep_alive_ = false;
      failure_ = ReadFailure::client_closed;
      co_return false;
    }
  }
  // Reuse the connection's (or a lent) body storage: AppendStringBody reserves Content-Length.
  req.body().swap(body_store_);
  req.body().clear();
  // A chunked body's trailer fields are dropped by the parser (FlatParser:
  // RFC 9110 §6.5.1, RFC 9112 §7.1.2, never merged into the header
  // section), so no credential, encoding, deadline or forwarded field can
  // arrive after the head was checked.
  // A small body usually came with the head: read_message parses it from in_
  // with no system call, and waits only for a part that is still missing.
  if (!parser_->is_done()) watchdog_.expires_after(sc_.body_timeout);
  auto [ec, n] = co_await read_message(sock_, in_, *parser_, /*until_head=*/false, 512, false, &client_wait_);
  watchdog_.disarm();
  bytes_in_ += n;  // the body's bytes as they came (a chunked body's framing included), as far as they were parsed
  // A large body grew the input buffer (reads of up to 64 KiB): a kept-alive
  // connection does not hold that between requests.
  if (in_.size() == 0 && in_.capacity() > kKeepInput) in_.shrink_to_fit();
  if (!ec) co_return true;
  keep_alive_ = false;
  failure_ec_ = ec;
  if (chunk_headers_.over_budget) {
    failure_ = ReadFailure::over_budget;
  } else if (ec == bh::error::body_limit) {
    failure_ = ReadFailure::body_too_large;
  } else if (ec == bh::error::buffer_overflow || chunk_headers_.ext.over) {
    failure_ = ReadFailure::framing_too_large;
  } else if (timed_out_) {
    timed_out_ = false;
    failure_ = ReadFailure::body_timeout;
  } else if (closed_) {
    failure_ = ReadFailure::drain_cut;  // the drain deadline closed it: nothing can be answered
  } else if (ec == bh::error::partial_message || ec == bh::error::end_of_stream ||
             ec == asio::error::connection_reset || ec == asio::error::eof) {
    peer_gone_ = true;
    failure_ = ReadFailure::client_closed;
  } else if (parser_->obs_fold()) {
    failure_ = ReadFailure::obs_fold;  // an obs-folded trailer line, refused as in the head
  } else {
    failure_ = ReadFailure::malformed;
  }
  co_return false;
}

std::string_view Downstream::refused_request_line(std::string& scratch) const {
  // Beast parses the request line as soon as it is whole, before the rest of
  // the head: a head refused later (too large, a malformed field, a timeout)
  // has its method and target in the parser, not in the buffer.
  if (parser_ && parser_->got_some()) {
    const auto& req = parser_->get();
    if (!req.target().empty()) {
      scratch.assign(req.method_string()).append(" ").append(req.target()).append(" ");
      return scratch;
    }
  }
  return {static_cast<const char*>(in_.data().data()), in_.size()};
}

void Downstream::watch_for_close(bool release_buffer) {
  in_flight_ = true;
  if (release_buffer && !reading_ && in_.size() == 0) in_.shrink_to_fit();
  post_watch();
}

void Downstream::post_watch() {
  if (reading_ || peer_gone_ || closed_) return;
  // The read takes what room the buffer already has (a pipelined or next
  // request then usually arrives whole, in this one recv), at least kMonitorRead.
  // Never past the buffer's bound (prepare() would throw): a buffer that
  // full holds a whole pipelined request to serve next, and a write notices
  // the client leaving.
  const std::size_t free = in_.max_size() - in_.size();
  if (free == 0) return post_poll();
  reading_ = true;
  const auto room = in_.prepare(std::min(free, std::max(kMonitorRead, in_.capacity() - in_.size())));
  // The request was read to a short recv: the socket is drained, and
  // async_recv waits for the next edge without a recv that finds it empty.
  async_recv(sock_, room, [this](error_code ec, std::size_t n) {
    reading_ = false;
    const bool cancelled = monitor_cancelled_;
    monitor_cancelled_ = false;
    if (!ec) {
      in_.commit(n);  // the start of a pipelined request (or a CRLF after the body): keep it
      // Still in flight: watch on, so a client that leaves after sending
      // more is noticed at once too, not at the next write (the upstream
      // would generate on meanwhile, and a plain answer be logged as 200).
      if (in_flight_ && !cancelled) post_watch();
    } else if (!(cancelled && ec == asio::error::operation_aborted)) {
      on_gone();
    }
    done_.wake();
  });
}

void Downstream::post_poll() {
  // in_ holds all a pipelined request may (its head and the start of its
  // body), so no more bytes can be taken before the next request: whether
  // the client left is read from the socket's TCP state instead, which a FIN
  // (CLOSE_WAIT) or a reset (CLOSE) changes with the bytes still unread. A
  // client pipelining that much is rare: a poll every kClosePoll.
  if (!poll_) poll_ = std::make_unique<core::Timer>(sock_.get_executor());
  reading_ = true;
  poll_->expires_after(kClosePoll);
  poll_->async_wait([this](error_code ec) {
    reading_ = false;
    const bool cancelled = monitor_cancelled_;
    monitor_cancelled_ = false;
    if (!ec && !cancelled && !closed_ && !peer_gone_ && sock_.is_open()) {
      if (!established())
        on_gone();
      else if (in_flight_)
        post_watch();
    }
    done_.wake();
  });
}

std::string_view Downstream::peer_address() {
  if (!peer_read_) {
    peer_read_ = true;
    const auto a = sock_.is_open() ? socket_peer(sock_.native_handle()) : std::nullopt;
    if (a) {
      peer_ip_ = *a;
      peer_len_ = static_cast<std::uint8_t>(core::format_ip(*a, peer_));
    }
  }
  return {peer_.data(), peer_len_};
}

bool Downstream::peer_trusted() {
  if (peer_trusted_ < 0)
    peer_trusted_ = !sc_.trusted_proxies.empty() && !peer_address().empty() && in_any(sc_.trusted_proxies, peer_ip_);
  return peer_trusted_ > 0;
}

void Downstream::note_client() {
  client_len_ = 0;
  if (!peer_trusted()) return;
  const core::IpAddress a = resolve_client(parser_->get(), peer_ip_, sc_.trusted_proxies);
  if (a != peer_ip_) client_len_ = static_cast<std::uint8_t>(core::format_ip(a, client_));
}

bool Downstream::established() {
  tcp_info info{};
  socklen_t len = sizeof info;
  return ::getsockopt(sock_.native_handle(), IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
         info.tcpi_state == TCP_ESTABLISHED;
}

bool Downstream::left_by_now() {
  if (peer_gone_ || closed_ || !sock_.is_open()) return peer_gone_;
  if (!established()) on_gone();
  return peer_gone_;
}

void Downstream::on_gone() {
  const bool first = !peer_gone_;
  peer_gone_ = true;
  if (first && listener_) listener_->on_client_gone();
}

Task<void> Downstream::lingering_close() {
  error_code ec;
  sock_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) co_return;
  // Read and discard what the client still sends, so that closing does not
  // reset the connection before the client has read the answer (RFC 9112
  // §9.6): until the client closes (or an error), each read within 2 s, the
  // whole within server.body_timeout (as long as reading the body would
  // have taken), as nginx's lingering_timeout and lingering_time bound it.
  // No count of bytes ends it: a client (or a proxy: nginx forwarding a
  // body) that writes the whole body before it reads the answer would meet
  // the reset of a close with its bytes unread, and take it for a failure
  // (nginx answers its client 502 for Weir's 413 or 401), however many
  // bytes Weir had read before.
  const auto until = core::Watchdog::Clock::now() + sc_.body_timeout;
  end_stall_watch();  // the watchdog times the reads below
  std::array<char, 8192> sink;
  for (;;) {
    const auto now = core::Watchdog::Clock::now();
    if (reading_ || now >= until) break;
    watchdog_.expires_after(std::min<core::Watchdog::Clock::duration>(kLingerIdle, until - now));
    auto [rec, n] = co_await sock_.async_read_some(asio::buffer(sink), use_task);
    if (rec || n == 0) break;
  }
  watchdog_.disarm();
}

void Downstream::close() {
  keep_alive_ = false;
  closed_ = true;
  error_code ignored;
  sock_.close(ignored);
}

void Downstream::begin_drain() {
  drain_started_ = true;
  // An answer that has not begun (a 100 Continue is no beginning: its
  // final head is still to come) says Connection: close. One that went out
  // promising keep-alive is followed by the next request only when that is
  // here already (read_head): then that one is the last, and says close.
  if (bytes_out_ == interim_out_) keep_alive_ = false;
  // Waiting for a next request: the wait ends; read_head serves what came, or closes. (That wait may be
  // the close watch posted during the last request: its cancel is the drain's, not the client leaving.)
  if (idle_ && !closed_) {
    if (reading_) monitor_cancelled_ = true;
    error_code ignored;
    sock_.cancel(ignored);
    if (poll_) poll_->cancel();
  }
}

bool Downstream::rescue_waiting() {
  if (peer_gone_ || closed_ || (in_.size() == 0 && !take_waiting())) return false;
  timed_out_ = false;
  return true;
}

bool Downstream::take_waiting() {
  error_code ec;
  const std::size_t n = sock_.receive(in_.prepare(kKeepInput), 0, ec);  // (non-blocking: would_block when empty)
  if (ec || n == 0) return false;
  in_.commit(n);
  return true;
}

void Downstream::force_close() {
  closed_ = true;
  error_code ignored;
  sock_.cancel(ignored);
  sock_.shutdown(tcp::socket::shutdown_both, ignored);
}

Task<void> Downstream::shutdown() {
  // Nothing may still reference this object: wait out the posted read (or
  // poll) and the write loop (closing the socket completes them).
  error_code ignored;
  sock_.close(ignored);
  if (poll_) poll_->cancel();
  while (reading_) {
    if (!done_.take_wake()) co_await done_.park();
  }
  while (writing_) {
    if (!done_.take_wake()) co_await done_.park();
  }
}

}  // namespace weir::http
