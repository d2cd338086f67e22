// One downstream (client) connection's transport: HTTP/1.1 requests read
// within limits and timeouts, responses written (whole, or a body queued
// piece by piece with a bounded backlog), a read kept posted that notices a
// client that leaves, and lingering close (RFC 9112 §9.6). Knows no tenant,
// model, route or OpenAI field: those are the gateway's.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/beast/core/flat_buffer.hpp>

#include "core/async.hpp"
#include "core/buffer_budget.hpp"
#include "core/config.hpp"
#include "core/time.hpp"
#include "http/flat_parser.hpp"
#include "http/forward.hpp"
#include "http/io.hpp"
#include "http/request_check.hpp"
#include "http/response_head.hpp"

namespace weir::http {

// Why reading a request failed; the gateway maps each to a status and an
// error body in one place (gateway/failure.hpp).
enum class ReadFailure : std::uint8_t {
  none,
  malformed,    // unparsable head or body → 400
  obs_fold,     // a field value continued on a next line (obs-fold, RFC 9112 §5.2) → 400
  bad_framing,  // Transfer-Encoding with Content-Length, on HTTP/1.0, not ending in chunked; Content-Length twice → 400
  unsupported_coding,       // a transfer coding other than chunked → 501 (RFC 9112 §6.1)
  bad_host,                 // HTTP/1.1 without Host, with several, or an invalid one → 400 (RFC 9112 §3.2)
  bad_target,               // a request-target neither origin-form nor http(s) absolute-form → 400 (RFC 9112 §3.2)
  unsupported_expectation,  // an Expect other than 100-continue → 417 (RFC 9110 §10.1.1)
  version_not_supported,    // a request line's HTTP major version is not 1 → 505 (RFC 9110 §15.6.6)
  proxy_protocol,           // the connection began with a PROXY protocol header (v1 or v2) → 400
  framing_too_large,        // a chunk-size line or trailer section over the read buffer, or chunk extensions
                            // over server.max_header in all → 400 (RFC 9112 §7.1.1)
  head_timeout,             // the head did not arrive within server.header_timeout → 408
  head_too_large,           // the head is over server.max_header → 431
  line_too_long,            // the request line alone is over server.max_header → 414 (RFC 9110 §15.5.15)
  body_timeout,             // the body did not arrive within server.body_timeout → 408
  body_too_large,           // Content-Length or the chunked body over server.max_body → 413 (sent before reading it)
  over_budget,              // the body (its Content-Length, or a chunk as announced) would take the bytes Weir
                            // buffers over server.max_buffered → 503 gateway_overloaded, before more is read
  client_closed,            // the client left before sending the whole request (head or body) → 499, nothing sent
  drain_cut,                // server.drain_timeout closed the connection mid-request (head or body) → logged as
                            // 503 drain_timeout; nothing can be sent
};

// Storage for request parsers, shared by a worker's connections: a
// connection takes one for a request's head and gives it back when a stream
// commits (Downstream::release_request) or the connection ends, so an open
// stream holds none. One thread; must outlive the connections that use it.
class ParserSpares {
 public:
  ParserSpares() = default;
  ParserSpares(const ParserSpares&) = delete;
  ParserSpares& operator=(const ParserSpares&) = delete;
  ~ParserSpares();
  // Storage for one parser: a spare, else a new allocation.
  void* take();
  // Keeps `p` (from take()) for the next take(), up to kMax spares; frees the rest.
  void give(void* p) noexcept;

 private:
  static constexpr std::size_t kMax = 32;  // ~9 KiB of spares at most
  std::array<void*, kMax> spare_{};
  std::size_t count_ = 0;
};

class Downstream {
 public:
  // Told (once per connection) when the client closes or resets while a
  // request is in flight (watch_for_close), or a write to it fails.
  class Listener {
   public:
    virtual void on_client_gone() = 0;

   protected:
    ~Listener() = default;
  };

  // `sc` must outlive the object; `bytes_out_total` (optional) is bumped by
  // every byte written (the worker's weir_response_bytes_total); `spares`
  // (optional: else each parser is allocated and freed) lends the request
  // parsers and must outlive the object.
  Downstream(Socket sock, const core::ServerConfig& sc, std::uint64_t* bytes_out_total, ParserSpares* spares = nullptr);
  ~Downstream();
  Downstream(const Downstream&) = delete;
  Downstream& operator=(const Downstream&) = delete;

  void set_listener(Listener* l) { listener_ = l; }
  // The limits and timeouts this connection runs with (its configuration generation's).
  const core::ServerConfig& config() const { return sc_; }
  // The client's address as text ("203.0.113.7", "2001:db8::1"; an
  // IPv4-mapped IPv6 one as its IPv4 form), as the X-Forwarded-For Weir
  // sends upstream ends with. Read from the socket on the first call (one
  // getpeername and inet_ntop per connection, no allocation); empty when
  // it cannot be read (the socket closed).
  std::string_view peer_address();
  // Whether the peer is a front proxy of server.trusted_proxies (its
  // X-Forwarded-For, X-Real-IP and Forwarded are believed). Read once per
  // connection; false when the list is empty or the peer cannot be read.
  bool peer_trusted();
  // The request's client, as text as peer_address() writes it: the peer,
  // or, from a trusted peer, the client its X-Forwarded-For names
  // (http/client_address.hpp's resolve_client, read with the head by
  // read_head). The access log's `client`. With server.trusted_proxies
  // empty it costs what peer_address() does, once per connection.
  std::string_view client_address() {
    return client_len_ > 0 ? std::string_view(client_.data(), client_len_) : peer_address();
  }

  // --- reading ---

  enum class Head : std::uint8_t {
    request,  // a head is parsed: request()
    closed,   // the connection ended between requests (EOF, reset, idle timeout, drain): not a request
    failed,   // a malformed, too slow or too large head: failure(); answer it, then lingering_close()
  };
  // Waits for the next request head: within server.header_timeout for the
  // first request of the connection, server.keepalive_timeout for the
  // next ones. `draining`: a connection with nothing buffered ends instead.
  // A head Beast parses is then checked for what RFC 9112 asks of a server
  // (http/request_check.hpp: framing, Host, target form); a failed one
  // never keeps the connection alive.
  Task<Head> read_head(bool first, bool draining);
  // The request's head; after release_request(), an empty one (its version
  // and method stay readable through http11() and head_request()).
  const RequestHead& request() const;
  // The request-target in origin-form ("/p?q", RFC 9112 §3.2.1): an
  // absolute-form target ("http://h/p?q", §3.2.2) without its scheme and
  // authority. Valid from a read_head() that returned Head::request until the next
  // (or release_request()); after a Head::failed one, set when the head was
  // read whole and refused for its framing, Host or Expect (else empty).
  std::string_view target() const { return target_; }
  // Whether the last read_head() read a head whole with a usable target
  // (target() non-empty): the request then has a route, method and id to
  // answer and log with, refused or not. False after a malformed, oversized,
  // timed-out or bad-target head.
  bool head_read() const noexcept { return !target_.empty(); }
  // When the last read_head()'s head began: its first bytes were here (a new
  // connection: when reading began). For the log of a head that failed.
  core::Watchdog::Clock::time_point head_started() const noexcept { return head_started_; }
  // How long this request (since its head's first bytes) waited on its
  // client: for its head's later pieces and its body's (read_head,
  // read_body), and for the socket to take its answer (write_all, drain).
  // The client's pace, not Weir's work: the access log's added_us leaves it
  // out. A stream's write loop waiting in the background is not counted
  // (the relay goes on meanwhile); its last wait, drain(), is.
  core::Watchdog::Clock::duration client_waited() const noexcept { return client_wait_; }
  // A wait for the client made outside this class (a stream held back while its client is behind):
  // client_waited() counts it.
  void count_client_wait(core::Watchdog::Clock::duration d) noexcept { client_wait_ += d; }
  // After a read_head() that failed without head_read(): its request line
  // ("METHOD SP target SP ..."), as far as it came, for the log only (never
  // trusted for routing): rebuilt from what the parser read of it, else
  // the received bytes that were not parsed. `scratch` holds a rebuilt one.
  std::string_view refused_request_line(std::string& scratch) const;
  // The request's body; complete once body_complete() (else after read_body()).
  // After release_request(): empty.
  std::string& body() { return parser_ ? parser_->get().body() : body_store_; }
  bool body_complete() const { return !parser_ || parser_->is_done(); }
  // The rest of a Content-Length body is already in the input buffer (read
  // with the head): read_body() takes it without a system call or a wait.
  // (A chunked body's end cannot be told without parsing it: false.)
  bool body_buffered() const {
    if (body_complete()) return true;
    if (!parser_->is_header_done() || parser_->chunked()) return false;
    const auto left = parser_->content_length_remaining();
    return left && *left <= in_.size();
  }
  // Body storage kept across requests (capacity only). The gateway lends a
  // spare one before read_body() when there is none, and takes it back
  // (give_body_storage) once the request no longer needs its body.
  bool has_body_storage() const { return body_store_.capacity() > std::string().capacity(); }
  // Between requests: frees the body storage when it holds more than
  // `max_bytes` of capacity (a large or decoded body), so an idle kept-alive
  // connection holds none of it (else up to server.max_body each), and the
  // last head when its fields' buffer is larger than a next head would
  // keep (FlatFields::kKeepBytes; else up to server.max_header each), and
  // the input buffer a large head grew, when no read is posted into it.
  void trim_storage(std::size_t max_bytes);
  void lend_body_storage(std::string s) { body_store_ = std::move(s); }
  // Reads the body within server.max_body and server.body_timeout, answering
  // "Expect: 100-continue" first. false: failure() says why (a body too
  // large is refused before it is read, from its Content-Length).
  // The body is charged to the process's buffer budget (core::process_buffers,
  // server.max_buffered) before its bytes are read: its Content-Length at
  // once, a chunked body each chunk as its size is announced; over the budget
  // it fails with ReadFailure::over_budget and the connection closes. The
  // charge is given back when the request ends (trim_storage,
  // release_request, the next read_head).
  Task<bool> read_body();
  // Grows the body's charge to `bytes` (a body decoded from gzip takes more
  // than it came as); false, nothing charged, over server.max_buffered.
  bool charge_body(std::uint64_t bytes) {
    return body_charge_.cover(bytes, sc_.max_buffered_bytes, core::BufferBudget::Use::request_body);
  }
  ReadFailure failure() const { return failure_; }
  // The bytes of this request taken from the connection: its head (as far
  // as it was parsed) and the part of its body read_body() parsed, framing
  // included. Bytes Weir never parsed (a body left unread by a request
  // refused on its head, which then closes the connection; what a lingering
  // close discards) are not the request's. The access log's bytes_in.
  std::uint64_t bytes_in() const { return bytes_in_; }
  // The parser's or socket's message for a malformed request (for the error body).
  std::string failure_detail() const {
    return failure_ == ReadFailure::version_not_supported ? std::string(1, version_major_) : failure_ec_.message();
  }

  bool http11() const { return version_ >= 11; }
  // Gives the request's parser (~300 bytes) back to the worker and frees its
  // head's fields (one buffer, 512 bytes or more) and body: a stream past
  // its commit point needs only the version, method and keep-alive, which
  // stay. request() is empty after, as are body() and target(); the next
  // read_head() takes a parser again.
  void release_request();
  bool head_request() const { return head_method_; }
  // Whether the connection serves another request after this one.
  bool keep_alive() const { return keep_alive_; }
  void no_keep_alive() { keep_alive_ = false; }
  ConnectionMode connection_mode() const { return {keep_alive_, version_ != 0 && version_ < 11}; }

  // Keeps a read posted while a request is in flight, so a client that
  // closes is noticed at once (Listener::on_client_gone); the bytes it reads
  // (a pipelined request) become the start of the next request.
  // `release_buffer`: the request will run long (a stream): free the room
  // its head needed meanwhile (one allocation more for the next request).
  // Bytes that arrive meanwhile do not end the watch: it goes on until the
  // next read_head() (or the buffer is full).
  void watch_for_close(bool release_buffer = false);
  bool client_gone() const { return peer_gone_; }
  // client_gone(), asking the kernel first (one getsockopt: TCP_INFO's state
  // is no longer ESTABLISHED once the client's FIN or RST came): for a wait
  // before the close watch is posted (a JWKS refetch, a key lookup).
  bool left_by_now();

  // --- writing ---

  // Writes `a` then `b` (a whole response) within server.write_timeout;
  // false when the client is gone.
  Task<bool> write_all(std::string_view a, std::string_view b = {});
  // Queues bytes to send as they are (a response head).
  void queue(std::string_view raw) { out_ += raw; }
  // Queues `bytes` of the response body: one chunk (RFC 9112 §7.1) for an
  // HTTP/1.1 client, as they are for HTTP/1.0 (its body ends at close).
  // Empty `bytes` queue nothing (an empty chunk would end the body).
  void queue_body(std::string_view bytes);
  // Queues the last chunk (HTTP/1.1; nothing for HTTP/1.0), unless
  // send_body(bytes, /*last=*/true) sent it already.
  void queue_end();
  // Sends what is queued: at once if the socket takes it, the rest by a
  // write loop in the background (one write in flight at a time).
  void flush();
  // queue(raw) + flush(), and queue_body(bytes) + flush(), without a copy
  // when nothing is queued and the socket takes it all (a client that keeps
  // up): a stream then keeps no output buffer of its own.
  // `last`: nothing follows in this response, so the last chunk goes out in
  // the same write (one send less per stream); queue_end() then adds nothing.
  void send(std::string_view raw);
  void send_body(std::string_view bytes, bool last = false);
  // Waits until the write loop is idle (all sent, or the client gone); the
  // wait counts in client_waited().
  Task<void> drain();
  bool writing() const { return writing_; }
  bool write_failed() const { return write_failed_; }
  bool queue_empty() const { return out_.empty(); }
  // Bytes queued and not yet taken by the socket (the slow-client measure).
  std::size_t backlog() const { return out_.size() + wbuf_.size() - std::min(wsent_, wbuf_.size()); }
  // The bytes the stream's buffers hold: the backlog and what of the write loop's buffer has gone out (it is
  // freed whole once sent). What the slow-client bound counts: it bounds memory.
  std::size_t held() const { return out_.size() + wbuf_.size(); }
  // Bytes written to the client since begin_request().
  std::uint64_t bytes_out() const { return bytes_out_; }
  // A count that moves whenever the client makes progress on what it was
  // sent: a write the socket took, or bytes it acknowledged (TCP_INFO's
  // tcpi_bytes_acked: a full socket wakes a writer only once a third of its
  // send buffer is free, which a steady slow reader may take long to make).
  // Only its changes mean anything. One getsockopt.
  std::uint64_t progress();
  // Bytes written to the socket the client's TCP has not acknowledged (the
  // kernel's send queue: unsent or in flight), which held() does not see:
  // the kernel takes writes until its send buffer (autotuned to 4 MiB) is
  // full, so a client that stops reading is first behind there. An
  // estimate from the last reading (TCP_INFO's tcpi_bytes_acked), read
  // again (one getsockopt) only when it passes `recheck_over` bytes: a
  // client that keeps up costs one call per that many bytes written.
  std::uint64_t unacked(std::uint64_t recheck_over);
  // Unacknowledged bytes (unacked()) a response may leave in the kernel
  // before server.write_timeout's clock runs for them: more than a client
  // that keeps up has in flight between two readings, far less than a
  // stopped client leaves there (its socket's send buffer).
  static constexpr std::uint64_t kUnackedAllowance = 32 * 1024;
  // A deadline (head, body or a write) passed. For a write: the client took
  // nothing for server.write_timeout while bytes waited for it (Weir's queue,
  // or over kUnackedAllowance unacknowledged): Weir cut it off (the socket's
  // operations cancelled, Listener::on_client_gone told).
  bool timed_out() const { return timed_out_; }

  // Starts a request's accounting (bytes_out) and framing (HTTP version).
  void begin_request();
  // This request's bytes go to bytes_out() but not to `bytes_out_total`
  // (until the next begin_request): a /metrics scrape, which writes no
  // access-log line, so the total adds up to the log's bytes_out.
  void leave_out_of_total() { count_total_ = false; }
  bool left_out_of_total() const { return !count_total_; }

  // --- closing ---

  // Stops sending, reads and discards what the client still sends (2 s or 1 MiB).
  Task<void> lingering_close();
  // Closes the socket now (a client that left mid-stream, or was cut off); closed() turns true.
  void close();
  // Drain (Worker::drain, on every connection): a request whose answer has
  // not begun is the connection's last (Connection: close); a connection
  // waiting for a request ends that wait, and then serves one already in
  // its socket (as its last), else closes. After an answer that went out
  // promising keep-alive, a next request already here is served as the
  // last; none here: the connection closes.
  void begin_drain();
  // Drain deadline: closes the connection whatever it is doing.
  void force_close();
  bool closed() const { return closed_; }
  // Closes the socket and waits out the posted read and the write loop.
  Task<void> shutdown();

 private:
  friend class ParserSpares;
  using RequestParser = FlatParser<true, AppendStringBody>;
  // A parser for a new request: the connection's own, made anew in place,
  // else one in a spare's storage (spares_) or a new allocation.
  void renew_parser();
  // Destroys the parser; its storage goes to spares_ (or is freed).
  void drop_parser() noexcept;
  void start_write();
  void start_write_loop();
  void write_more();  // the loop's next write of wbuf_ from wsent_
  void wrote_more(boost::system::error_code ec, std::size_t n);
  // server.write_timeout while bytes wait for the client (the stall watch):
  // from now, unless it runs already. The watchdog then looks every
  // write_timeout / 4 (check_stall), so it costs nothing per write.
  // `read`: takes the client's acknowledged bytes as the first look's
  // baseline (one getsockopt; false: just read).
  void watch_stall(bool read = true);
  // The stall watch's look (the watchdog's expiry while stall_watch_): the
  // client's acknowledged bytes read again; nothing outstanding ends the
  // watch, no progress for write_timeout cuts the client off, else it looks
  // again.
  void check_stall();
  // Ends the stall watch (its deadline too): the watchdog times something else next.
  void end_stall_watch() {
    if (!stall_watch_) return;
    stall_watch_ = false;
    watchdog_.disarm();
  }
  // After a write the socket took: when the estimate of unacknowledged bytes
  // passes kUnackedAllowance, reads them (one getsockopt) and watches the
  // client while they stay over it. A client that keeps up: a compare per
  // write, a getsockopt per kUnackedAllowance bytes.
  void note_unacked() {
    if (!stall_watch_ && written_ - std::min(acked_seen_, written_) > kUnackedAllowance) watch_unacked();
  }
  void watch_unacked();
  // Tries one scatter write of `parts` now; queues what the socket did not take.
  template <std::size_t N>
  void send_now(const std::array<std::string_view, N>& parts);
  void post_watch();  // posts the watch's read (watch_for_close)
  // Takes what the socket holds now into in_, without a wait: true when some came.
  bool take_waiting();
  // After the watchdog's deadline ended an idle wait (timed_out_): true when a request is here anyway (in
  // in_, or taken from the socket now) and the connection still open; timed_out_ is then cleared.
  bool rescue_waiting();
  void post_poll();  // or, with in_ full, its poll of the TCP state
  void on_gone();
  // The connection's TCP state is ESTABLISHED (one getsockopt): no FIN or RST from the client yet.
  bool established();

  Socket sock_;
  const core::ServerConfig& sc_;
  std::uint64_t* bytes_out_total_;

  Listener* listener_ = nullptr;
  // Bounded (server.max_header + one 64 KiB read): a head is parsed whole
  // within max_header, a body piece by piece, so no parse step needs more;
  // a chunk-size line or trailer section that does not fit is refused
  // (buffer_overflow) instead of held (the class of CVE-2023-39326).
  boost::beast::flat_buffer in_;
  std::string_view target_;  // target(): into the parser's head or target_buf_
  std::string target_buf_;   // an absolute-form target's origin-form when it needs a "/" added
  // The parser's chunk-header callback: each chunk's extensions checked (bounded, no control bytes), and
  // its size charged to the body's buffer charge before its bytes are read.
  struct ChunkHeaders {
    Downstream* self = nullptr;
    ChunkExtCheck ext;
    std::uint64_t announced = 0;  // the chunk sizes announced so far
    bool over_budget = false;     // a chunk would have taken the budget over server.max_buffered
    void operator()(std::uint64_t size, std::string_view extensions, boost::system::error_code& ec);
  };
  ChunkHeaders chunk_headers_;
  core::BufferCharge body_charge_;  // what this request's body holds of server.max_buffered
  core::Watchdog watchdog_;
  core::Watchdog::Clock::time_point head_started_{};  // read_head(): when the head's first bytes were here
  core::Watchdog::Clock::duration client_wait_{};     // client_waited(): since head_started_
  RequestParser* parser_ = nullptr;  // from read_head() until release_request() or the connection's end
  ParserSpares* spares_;
  std::string body_store_;
  unsigned version_ = 0;      // the request's HTTP version (11 = 1.1) once its head is parsed, else 0
  bool head_method_ = false;  // the request is a HEAD: its response has no body
  ReadFailure failure_ = ReadFailure::none;
  boost::system::error_code failure_ec_;
  char version_major_ = 0;  // ReadFailure::version_not_supported: the major digit sent
  bool timed_out_ = false;
  bool keep_alive_ = true;
  bool idle_ = false;
  bool closed_ = false;
  bool drain_started_ = false;  // begin_drain() was called
  bool chunked_ = true;
  bool ended_ = false;  // the last chunk went out with the body (send_body last)

  bool reading_ = false;    // the watch's read (or its poll_) is pending
  bool in_flight_ = false;  // a request is in flight: watch_for_close() until the next read_head()
  // The watch once in_ is full of pipelined bytes (nothing more may be
  // read): the socket's TCP state, every kClosePoll, made on first use.
  std::unique_ptr<core::Timer> poll_;
  bool peer_gone_ = false;
  bool monitor_cancelled_ = false;
  // Wakes the one coroutine waiting for the posted read or the write loop to
  // finish (each waits in a loop on its own flag, so one waiter serves both).
  // One waiter at a time: the connection's own coroutine (read_head, drain,
  // shutdown), never two at once. Resumed in place, as the completion
  // handlers' last act (a keep-alive request then costs no epoll_wait(0)).
  core::Waiter done_;

  bool writing_ = false;
  bool write_failed_ = false;
  std::string out_;
  std::string wbuf_;
  std::size_t wsent_ = 0;  // bytes of wbuf_ the write loop has sent
  // The watchdog's deadline is the stall watch's next look (watch_stall), from
  // a response's first write the client falls behind on until the next
  // request's head is awaited (read_head) or the connection lingers.
  bool stall_watch_ = false;
  bool all_waiting_ = false;    // write_all() waits for room for the rest of its answer
  std::uint64_t bytes_in_ = 0;  // this request's bytes parsed: head, then body (bytes_in())
  std::uint64_t bytes_out_ = 0;
  std::uint64_t interim_out_ = 0;  // of bytes_out_: the interim 100 Continue's (the answer has not begun)
  std::uint64_t written_ = 0;      // bytes written to the socket over the connection's life
  std::uint64_t acked_seen_ = 0;   // tcpi_bytes_acked at the last reading (unacked, progress)
  // The client's last progress the stall watch knows of: when a reading
  // first found its acknowledged bytes moved, a write loop's write the socket
  // took, or (no progress before) when the watch began.
  core::TimePoint acked_moved_at_{};
  bool count_total_ = true;  // this request's bytes count in bytes_out_total_ (leave_out_of_total)
  // A write of `n` bytes: the request's bytes_out, the connection's count, the listener's total.
  void count_out(std::size_t n) {
    bytes_out_ += n;
    written_ += n;
    if (bytes_out_total_ && count_total_) *bytes_out_total_ += n;
  }
  // One reading of tcpi_bytes_acked into acked_seen_ (and acked_moved_at_); false when the kernel does not say.
  bool read_acked();
  std::array<char, 46> peer_{};  // peer_address(): INET6_ADDRSTRLEN
  std::uint8_t peer_len_ = 0;
  bool peer_read_ = false;
  core::IpAddress peer_ip_{};      // peer_address()'s, when peer_len_ > 0
  std::int8_t peer_trusted_ = -1;  // peer_trusted(): -1 not read yet
  core::IpText client_{};          // client_address() when it is not the peer
  std::uint8_t client_len_ = 0;    // 0: the client is the peer
  // After a head is parsed: client_ from its X-Forwarded-For, when the peer is trusted.
  void note_client();
};

}  // namespace weir::http
