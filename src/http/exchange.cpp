#include "http/exchange.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <tuple>

#include "http/headers.hpp"
#include "http/tls.hpp"

#include <fmt/format.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <boost/beast/http/read.hpp>

namespace weir::http {

namespace bh = boost::beast::http;
using boost::system::error_code;

namespace {
// After this many recvs in a row that filled the buffer (a fast upstream,
// 8 x 16 KiB), the next read first lets the worker's other handlers run (a post).
constexpr unsigned kYieldAfterFullReads = 8;
// No chunk header is this long: carried bytes that still do not parse are garbage.
constexpr std::size_t kMaxCarry = 512;
// The first read of an upstream response (see start()).
constexpr std::size_t kHeadRead = 4096;
// await_end(): how long the body's end may take after the client's stream ended.
constexpr std::chrono::milliseconds kEndGrace{100};
}  // namespace

Exchange::Exchange(Executor ex, std::span<char> scratch) : ex_(ex), scratch_(scratch) {}

Exchange::~Exchange() = default;

void Exchange::use(std::unique_ptr<UpstreamConnection> c) { conn_ = std::move(c); }

Task<UpstreamFailure> Exchange::connect(const tcp::endpoint& ep, const TlsTarget& tls,
                                        std::chrono::milliseconds timeout,
                                        std::chrono::steady_clock::time_point handshake_by) {
  conn_ = std::make_unique<UpstreamConnection>(ex_);
  co_return co_await http::connect(*conn_, ep, tls, timeout, handshake_by);
}

void Exchange::shrink() {
  if (parser_ && parser_->is_header_done()) parser_->get().clear();
  shrink_ = true;
}

void Exchange::cancel() {
  if (conn_) conn_->abort(UpstreamFailure::cancelled);
}

std::unique_ptr<UpstreamConnection> Exchange::release() {
  auto c = std::move(conn_);
  // Bytes after the end of the response put the connection out of step: the
  // next request on it would read them as its answer.
  // (Over TLS those bytes may sit in the TLS layer, not the socket.)
  const bool reusable = c && parser_ && body_done() && parser_->keep_alive() && c->is_open() &&
                        c->aborted_for() == UpstreamFailure::none && !trailing_ && !cut_off_ && !faulty_framing_ &&
                        !(chunks_on_ && chunks_.close_requested()) && c->buffer().size() == 0 &&
                        (c->tls() == nullptr || !tls_holds_bytes(*c->tls()));
  if (c) c->watchdog().disarm();
  if (!reusable) c.reset();  // closes it
  return c;
}

bool Exchange::closing_head_alone() const {
  if (!conn_ || !parser_ || !parser_->is_header_done() || parser_->keep_alive()) return false;
  if (body_done()) return true;  // no body (Content-Length: 0, an empty chunked one): done at its head
  // The head alone decides: a body that ends at the close may be empty (Node's idle 408 is a head and the
  // close), and whether some of it came in the head's segment is the network's doing, not the server's
  // (the same answer split otherwise was resent, where in one segment it passed through).
  return !parser_->chunked() && !parser_->content_length();
}

Task<bool> Exchange::take_end(std::span<char> scratch) {
  // A few reads at most: an upstream that keeps sending after [DONE] is not waited out either.
  no_wait_ = true;
  for (int i = 0; i < 4 && conn_ && parser_ && !body_done(); ++i) {
    const BodyRead r = co_await read(scratch);
    if (r.failure != UpstreamFailure::none || (r.bytes == 0 && !r.end)) break;
  }
  no_wait_ = false;
  co_return done();
}

Task<bool> Exchange::await_end(std::span<char> scratch) {
  if (!conn_ || !parser_ || body_done() || conn_->aborted_for() != UpstreamFailure::none) co_return done();
  const auto idle = idle_;
  idle_ = idle.count() > 0 ? std::min(idle, kEndGrace) : kEndGrace;  // the watchdog's limit on each wait below
  // ... and on them all: one read() goes on through framing that carries no body byte (a trailer section
  // sent a few bytes at a time), so the four reads alone would not bound it.
  end_by_ = std::chrono::steady_clock::now() + 4 * idle_;
  for (int i = 0; i < 4 && conn_ && parser_ && !body_done(); ++i) {
    const BodyRead r = co_await read(scratch);
    if (r.failure != UpstreamFailure::none) break;
  }
  end_by_ = {};
  idle_ = idle;
  co_return done();
}

namespace {

// Writes what is left of `bufs` past its first `done` bytes on `stream`,
// step by step, moving `watchdog`'s deadline to `stall` past each step that
// moved bytes: a slow upload goes on for as long as the upstream takes it,
// one that stops is timed out. Returns the error (none when written whole)
// and the bytes of `bufs` written in all. (References: GCC 12 miscopies
// coroutine parameters passed by value on the stack.)
template <class Stream>
Task<std::tuple<error_code, std::size_t>> write_watched(Stream& stream, const std::array<asio::const_buffer, 2>& bufs,
                                                        const std::size_t& done, core::Watchdog& watchdog,
                                                        const std::chrono::milliseconds& stall) {
  boost::beast::buffers_suffix<std::array<asio::const_buffer, 2>> rest(bufs);
  rest.consume(done);
  std::size_t n = done;
  const std::size_t total = asio::buffer_size(bufs);
  while (n < total) {
    auto [ec, k] = co_await stream.async_write_some(rest, use_task);
    n += k;
    rest.consume(k);
    if (ec) co_return std::tuple{ec, n};
    if (k > 0 && n < total) watchdog.expires_after(stall);
  }
  co_return std::tuple{error_code(), n};
}

}  // namespace

Task<UpstreamFailure> Exchange::start(const Request& r) {
  idle_ = r.idle;
  head_bytes_ = 0;
  need_more_ = false;
  drained_ = true;  // the head's read emptied the socket (or its bytes wait in the buffer)
  full_reads_ = 0;
  yield_ = false;
  carry_len_ = 0;
  shrink_ = false;
  trailing_ = false;
  cut_off_ = false;
  faulty_framing_ = false;
  head_too_large_ = false;
  written_whole_ = false;
  chunks_on_ = false;
  // While the request is written: no step without progress for longer than `stall` (the upstream stopped
  // taking the body). Then the head's own wait (first_byte) from the moment it was written whole, so an
  // upload's length never eats into it. (From the caller's clock read when it gave one: the read after the
  // write below is then the only one here.)
  // (idle alone, not also first_byte: the kernel wakes a writer only once a good part of its send buffer
  // (MiBs) drained, so the steps of an upload the upstream steadily reads can be seconds apart.)
  const auto stall = r.idle;
  if (r.sent_at != std::chrono::steady_clock::time_point{})
    conn_->watchdog().expires_at(r.sent_at + stall);
  else
    conn_->watchdog().expires_after(stall);
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(r.head), asio::buffer(r.body.data(), r.body.size())};
  TlsStream* tls = conn_->tls();
  error_code ec;
  std::size_t written = 0;
  if (tls) {
    // Step by step through the TLS stream (OpenSSL may also need to read while writing).
    std::tie(ec, written) = co_await write_watched(tls->stream, bufs, 0, conn_->watchdog(), stall);
  } else {
    // What the socket takes at once (a request that fits its buffer: all of it), then the rest as it drains.
    ec = {};
    written = asio::write(conn_->socket(), bufs, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again)
      std::tie(ec, written) = co_await write_watched(conn_->socket(), bufs, written, conn_->watchdog(), stall);
  }
  // An upstream may answer before it read the whole body (a 413, an early
  // error) and close: the write then fails while its answer waits in the
  // socket, readable before the reset. It is read and relayed, as Envoy
  // does, not taken for a reset (RFC 9112 §9.3: a client sending a body
  // watches for an error response); with no answer there the read below
  // fails as the write did. The connection is not reused. Over TLS alike:
  // the failure is the socket's (Asio's engine writes OpenSSL's records),
  // and the TLS session reads on (`written`: the plaintext whose records
  // went out whole). A new TLS connection whose server asked for a client
  // certificate is read even when none did: the server's refusal of it (an
  // alert after the handshake, RFC 8446 §4.4.2.4, then a close) may be what
  // failed the request's first write, and the read finds the alert.
  const bool may_have_answered = written > 0 || (tls != nullptr && tls->certificate_requested && conn_->uses == 0);
  if (may_have_answered && (ec == asio::error::broken_pipe || ec == asio::error::connection_reset)) [[unlikely]] {
    cut_off_ = true;
    ec = {};
  }
  // Written: the wait for the answer begins (the caller's measure of the upstream's time, not Weir's), and
  // its timeout with it (never past the request's deadline). A later deadline than the write's is a store.
  written_at_ = std::chrono::steady_clock::now();
  written_whole_ = !ec && !cut_off_;
  {
    auto head_by = written_at_ + r.first_byte;
    if (r.not_after != std::chrono::steady_clock::time_point{} && r.not_after < head_by) head_by = r.not_after;
    conn_->watchdog().expires_at(head_by);
  }
  // Interim responses (1xx but 101, RFC 9110 §15.2: 100 Continue, 103 Early
  // Hints) come before the final one: skip them. Their heads count together
  // against kMaxResponseHead (as Go counts them against its response header
  // limit): an upstream that sends 1xx heads without end fails as one whose
  // head is too large, after at most 64 KiB of them, instead of holding a
  // worker for as long as the response timeout lets it.
  bool space_restored = false;
  std::size_t interim_bytes = 0;
  for (bool interim = true; !ec && interim;) {
    auto fields_store = parser_ ? parser_->get().take_storage() : FlatFields::Storage();  // the last head's room
    parser_.emplace();
    parser_->get().adopt_storage(std::move(fields_store));
    parser_->header_limit(kMaxResponseHead);
    parser_->body_limit(boost::none);
    // The head alone: the bytes the read took are then its size, the limit's measure (head_over_limit).
    parser_->eager(false);
    if (r.head_request) parser_->skip(true);
    // 4 KiB: a small answer (head and body, ~1 KB from vLLM) in one recv; a
    // stream gives the room back (shrink()).
    std::size_t rn = 0;
    if (tls) {
      auto [rec, n] = co_await read_message(tls->stream, conn_->buffer(), *parser_, /*until_head=*/true, kHeadRead);
      ec = rec;
      rn = n;
    } else {
      auto [rec, n] = co_await read_message(conn_->socket(), conn_->buffer(), *parser_, /*until_head=*/true, kHeadRead);
      ec = rec;
      rn = n;
    }
    if (head_over_limit(ec, rn, kMaxResponseHead)) [[unlikely]] {
      ec = bh::error::header_limit;
      head_too_large_ = true;
    }
    if (ec == bh::error::bad_status && !space_restored && restore_status_line_space(conn_->buffer())) {
      space_restored = true;  // ("HTTP/1.1 200\r\n": parsed again, with its space)
      ec = {};
      head_bytes_ += rn;  // (the head's count then has the byte put back: one more than the upstream sent)
      continue;
    }
    // Every byte the upstream sent counts, also an incomplete status line the
    // parser did not consume: it read the request.
    head_bytes_ += rn + conn_->buffer().size();
    const int status = ec ? 0 : parser_->get().result_int();
    interim = status >= 100 && status < 200 && status != 101;
    if (interim) [[unlikely]] {
      space_restored = false;  // (each head's status line may lack its space)
      if ((interim_bytes += rn) > kMaxResponseHead) {
        ec = bh::error::header_limit;  // (UpstreamFailure::protocol: the connection is not reused)
        head_too_large_ = true;
      }
    }
  }
  if (ec) {
    // A new connection whose server refused the client certificate (or its
    // absence) before any byte of an answer: under TLS 1.3 it does so after
    // the client sent its Finished and the request (RFC 8446 §4.4.2.4); a
    // failed handshake all the same, the request never handled (the caller
    // treats it as a connect failure: UpstreamFailure::tls, the reason to
    // stderr). refused_client_certificate() says which failures are that.
    if (TlsStream* t = conn_->tls(); t != nullptr && conn_->uses == 0 && head_bytes_ == 0 &&
                                     conn_->aborted_for() == UpstreamFailure::none &&
                                     refused_client_certificate(*t, ec)) {
      conn_->set_tls_error(
          fmt::format("the server refused the connection after asking for a client certificate "
                      "({}): check pools.NAME.tls.client_cert",
                      ec.message()));
      co_return UpstreamFailure::tls;
    }
    co_return classify(*conn_, ec);
  }
  // The body's framing that came with the head is parsed at once, as before the head's own read was
  // measured: an empty chunked body (its last chunk) is then done at the head (release(), closing_head_alone()).
  // A chunked body is decoded by chunks_ from here on (a HEAD's, a 204's or a 304's is done at its head).
  chunks_on_ = !parser_->is_done() && parser_->chunked();
  if (chunks_on_) {
    chunks_.reset();
    if (conn_->buffer().size() > 0) {
      const auto& raw = conn_->buffer();
      const auto framing =
          chunks_.decode(std::string_view(static_cast<const char*>(raw.data().data()), raw.size()), std::span<char>());
      // (Bad framing: the body's read meets it again.)
      if (framing.status != ChunkDecoder::Status::bad) conn_->buffer().consume(framing.used);
    }
  } else {
    parser_->eager(true);
    if (conn_->buffer().size() > 0 && !parser_->is_done()) {
      error_code later;  // (bad framing: the body's read meets it again, as it did)
      conn_->buffer().consume(parser_->put(conn_->buffer().data(), later));
    }
  }
  // 101 Switching Protocols answers only a request that asked to upgrade
  // (RFC 9110 §15.2.2), and Weir never forwards Upgrade (hop-by-hop): a
  // 101 here is the upstream's error, not a response to relay.
  // A status outside 100-599 is no HTTP status (RFC 9110 §15: three digits,
  // first 1-5); Beast takes any three digits, and "HTTP/1.1 000" relayed
  // would be an invalid status line to the client.
  if (const int status = parser_->get().result_int(); status == 101 || status < 100 || status > 599) [[unlikely]]
    co_return UpstreamFailure::protocol;
  // Transfer-Encoding with Content-Length: Beast frames a coding other than
  // chunked by the Content-Length, where RFC 9112 §6.3 says Transfer-Encoding
  // overrides it and the message "ought to be handled as an error" (it may
  // split the response, and the pooled connection with it).
  // A transfer coding other than chunked (gzip, deflate, compress; identity,
  // which RFC 9112 no longer has): Weir decodes none, and Beast would hand
  // the coded bytes on as the body (a gzip event stream read as events,
  // broken mid-way). Refused at the head, where a retry or fallback may
  // still answer. Chunked applied twice (`chunked, chunked`, RFC 9112 §7.1: a sender MUST NOT) is refused
  // too: Beast takes a list whose first `chunked` is not its last element for no chunked framing and reads
  // the body to the close, so the client would get the chunk framing as content. (One scan of the head's
  // fields for all three.) An HTTP/1.0 answer with Transfer-Encoding has faulty framing (RFC 9112 §6.1): it
  // is read as Beast frames it, and its connection is closed after it.
  unsigned chunked = 0;
  bool coded = false;
  for (const auto& f : parser_->get()) {
    if (f.name() != bh::field::transfer_encoding) continue;
    if (parser_->content_length()) [[unlikely]]
      co_return UpstreamFailure::protocol;
    coded = true;
    for (std::string_view list = f.value(); !list.empty();) {
      const auto comma = list.find(',');
      const std::string_view coding = core::trim_ows(list.substr(0, comma));
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      if (coding.empty()) continue;
      if (!core::iequals(coding, "chunked")) [[unlikely]]
        co_return UpstreamFailure::protocol;
      ++chunked;
    }
  }
  if (chunked > 1) [[unlikely]]
    co_return UpstreamFailure::protocol;
  faulty_framing_ = coded && parser_->get().version() < 11;
  co_return UpstreamFailure::none;
}

// The read loop, written for the steady state of a long stream: per
// upstream read one recv, run by the reactor when epoll reports the bytes
// (async_recv: no recv that finds the socket empty, no epoll_ctl), and no
// completion queued through the scheduler. A recv lands in the
// worker's scratch buffer and is parsed at once (Beast's parser takes the
// chunk framing off into `into`); only bytes that did not fit `into`, or a
// chunk header split across reads, wait in the connection's buffer.
bool Exchange::begin_recv(std::size_t& carried, BodyRead& r) {
  if (!no_wait_) {
    recv_armed_at_ = std::chrono::steady_clock::now();
    const auto by = recv_armed_at_ + idle_;
    conn_->watchdog().expires_at(end_by_ == std::chrono::steady_clock::time_point{} ? by : std::min(by, end_by_));
  }
  // Bytes carried from the last read (a chunk header split across
  // reads) go first, and the recv lands right after them.
  carried = carry_len_ + conn_->buffer().size();  // one of them is empty
  if (carried + kMaxCarry > scratch_.size()) {
    r.failure = UpstreamFailure::protocol;
    return false;
  }
  if (no_wait_ && conn_->tls()) return false;  // (take_end: no TLS read without a wait)
  return true;
}

asio::mutable_buffer Exchange::room(std::size_t carried) const {
  return asio::buffer(scratch_.data() + carried, scratch_.size() - carried);
}

bool Exchange::recv_now(std::size_t carried, error_code& ec, std::size_t& n) {
  auto& sock = conn_->socket();
  // (take_end: a recv now, whatever the reactor last saw: the bytes may be in, their edge not yet harvested.)
  bool wait = !no_wait_ && drained_ && quiet_since_drained(sock);
  if (!wait) {
    n = sock.read_some(room(carried), ec);
    wait = ec == asio::error::would_block || ec == asio::error::try_again;
  }
  return !wait;
}

Task<std::pair<error_code, std::size_t>> Exchange::recv_tls(std::size_t carried) {
  // TLS: OpenSSL may hold decrypted bytes the socket no longer shows
  // as readable, so no readiness wait of our own: the stream's read
  // returns what it has or waits for the next record. Not into the
  // shared scratch: when OpenSSL already holds the bytes, Asio's SSL
  // stream writes them into the buffer at once but completes as if
  // posted, and the worker's other exchanges use the scratch meanwhile
  // (found by bench/run tls: 16 streams, records arriving together).
  // So into the connection's own buffer, copied on resumption.
  TlsStream* tls = conn_->tls();
  if (!tls->read_buf) tls->read_buf = std::make_unique<char[]>(TlsStream::kReadBuf);
  const std::size_t want = std::min(TlsStream::kReadBuf, scratch_.size() - carried);
  auto [tec, tn] = co_await tls->stream.async_read_some(asio::buffer(tls->read_buf.get(), want), use_task);
  if (tn > 0) std::memcpy(scratch_.data() + carried, tls->read_buf.get(), tn);
  // A close without close_notify ends nothing the framing cannot judge (a
  // length or chunks left short is a partial message either way), except a
  // body delimited by the close: there it is the one sign the body was cut
  // (RFC 8446 §6.1), a reset, never its end.
  if (tec == boost::asio::ssl::error::stream_truncated && parser_ && parser_->is_header_done() && !parser_->is_done() &&
      !parser_->content_length() && !parser_->chunked())
    co_return std::pair<error_code, std::size_t>(error_code(asio::error::connection_reset), tn);
  co_return std::pair<error_code, std::size_t>(is_tls_close(tec) ? error_code(asio::error::eof) : tec, tn);
}

bool Exchange::end_recv(error_code ec, std::size_t n, std::size_t carried, BodyRead& r, std::string_view& in) {
  Parser& rp = *parser_;
  auto& raw = conn_->buffer();
  if (ec == asio::error::eof) {
    // A body that ends at close (no length, not chunked) is complete now.
    ec = {};
    if (chunks_on_) {
      if (!chunks_.done()) ec = bh::error::partial_message;
    } else {
      if (rp.got_some()) rp.put_eof(ec);
      if (!ec && !rp.is_done()) ec = bh::error::partial_message;
    }
    if (ec)
      r.failure = classify(*conn_, ec);
    else
      r.end = true;
    return false;
  }
  if (ec) {
    r.failure = classify(*conn_, ec);
    return false;
  }
  full_reads_ = n < scratch_.size() - carried ? 0 : full_reads_ + 1;
  drained_ = full_reads_ == 0;
  if (full_reads_ >= kYieldAfterFullReads) {
    full_reads_ = 0;
    yield_ = true;
  }
  if (carry_len_ > 0) {
    std::memcpy(scratch_.data(), carry_.data(), carry_len_);
    carry_len_ = 0;
  } else {
    asio::buffer_copy(asio::buffer(scratch_.data(), carried), raw.data());
    raw.consume(carried);
  }
  need_more_ = false;
  in = std::string_view(scratch_.data(), carried + n);
  return true;
}

bool Exchange::parse_into(std::string_view in, bool from_raw, std::span<char> into, BodyRead& r) {
  auto& raw = conn_->buffer();
  // Parse what we have: framing off, body bytes into `into`.
  std::size_t off = 0;
  std::size_t got = 0;
  const bool bad = !parse_body(in, into.subspan(r.bytes), off, got);
  r.bytes += got;
  const bool done = body_done();
  if (done && off < in.size()) trailing_ = true;  // bytes beyond the response
  if (from_raw) {
    raw.consume(off);
  } else if (off < in.size() && !done) {
    const std::size_t left = in.size() - off;
    if (need_more_ && left <= carry_.size()) {
      // A piece of framing (a chunk's CRLF and the next size line, usually
      // just "\r\n"): kept inline, so a stream that gave its buffer back
      // (shrink()) does not take one again for it.
      std::memcpy(carry_.data(), in.data() + off, left);
      carry_len_ = static_cast<std::uint8_t>(left);
    } else {
      asio::buffer_copy(raw.prepare(left), asio::buffer(in.data() + off, left));
      raw.commit(left);
    }
  }
  if (bad) {
    r.failure = UpstreamFailure::protocol;
    return false;
  }
  if (done) r.end = true;
  if (shrink_ && raw.size() == 0) raw.shrink_to_fit();
  if (r.bytes > 0 || r.end) return false;
  if (from_raw && off == 0 && !need_more_) need_more_ = true;  // nothing parsed from the carried bytes: read more
  return true;
}

bool Exchange::parse_body(std::string_view in, std::span<char> into, std::size_t& used, std::size_t& got) {
  used = 0;
  got = 0;
  if (chunks_on_) {
    const auto d = chunks_.decode(in, into);
    used = d.used;
    got = d.out;
    need_more_ = d.status == ChunkDecoder::Status::need_more;  // a partial chunk header: read on
    return d.status != ChunkDecoder::Status::bad;
  }
  Parser& rp = *parser_;
  bool ok = true;
  while (used < in.size() && !rp.is_done() && got < into.size()) {
    rp.get().body().data = into.data() + got;
    rp.get().body().size = into.size() - got;
    error_code pec;
    const std::size_t n = rp.put(asio::buffer(in.data() + used, in.size() - used), pec);
    used += n;
    const std::size_t put = into.size() - got - rp.get().body().size;
    got += put;
    if (pec == bh::error::need_more) {  // a partial chunk header: read on
      need_more_ = true;
      break;
    }
    if (pec && pec != bh::error::need_buffer) {
      ok = false;
      break;
    }
    if (n == 0 && put == 0 && !pec) break;
  }
  rp.get().body().data = nullptr;  // `into` is the caller's, not the parser's
  return ok;
}

Exchange::Step Exchange::read_step(std::span<char> into, BodyRead& r) { return advance(into, r, nullptr); }

Exchange::Step Exchange::read_step(std::span<char> into, BodyRead& r, error_code ec, std::size_t n) {
  const Recv got{ec, n};
  return advance(into, r, &got);
}

Exchange::Step Exchange::advance(std::span<char> into, BodyRead& r, const Recv* got) {
  for (;;) {
    std::string_view in;
    bool from_raw = false;
    if (got != nullptr) {
      // The recv that Step::recv or Step::recv_tls waited for.
      const bool more = end_recv(got->ec, got->n, carried_, r, in);
      got = nullptr;
      if (!more) break;
    } else {
      if (body_done()) {
        r.end = true;
        break;
      }
      from_raw = conn_->buffer().size() > 0 && !need_more_;
      if (from_raw) {
        const auto& raw = conn_->buffer();
        in = std::string_view(static_cast<const char*>(raw.data().data()), raw.size());
      } else {
        std::size_t carried = 0;
        if (!begin_recv(carried, r)) break;
        carried_ = static_cast<std::uint32_t>(carried);
        if (conn_->tls()) [[unlikely]]
          return Step::recv_tls;
        // The recv lands in the worker's scratch, shared by every exchange
        // of the worker: it must be parsed before any other handler runs.
        // So either a recv now, in place, or a wait that recvs in the
        // reactor's handling of epoll's next edge and resumes at once
        // (async_recv_drained), never a recv whose completion is queued.
        // Edge-triggered (http/edge_recv.hpp): after a short read with no
        // event since, the wait starts with no system call.
        if (yield_ && !no_wait_) {
          // A fast upstream: let the worker's other connections run first.
          yield_ = false;
          return Step::yield;
        }
        error_code ec;
        std::size_t n = 0;
        const bool wait = !recv_now(carried, ec, n);
        if (wait && no_wait_) break;  // nothing has arrived
        if (wait) {
          drained_ = true;
          return Step::recv;
        }
        if (!end_recv(ec, n, carried, r, in)) break;
      }
    }
    if (!parse_into(in, from_raw, into, r)) break;
  }
  if (r.end || r.failure != UpstreamFailure::none) conn_->watchdog().disarm();
  return Step::done;
}

// Not a coroutine: the task it returns is read_from's.
Task<BodyRead> Exchange::read(std::span<char> into) { return read_from(Step::start, into, BodyRead{}); }

Task<BodyRead> Exchange::read_from(Step step, std::span<char> into, BodyRead r) {
  while (step != Step::done) {
    error_code ec;
    std::size_t n = 0;
    if (step == Step::recv) {
      std::tie(ec, n) = co_await recv_drained();
    } else if (step == Step::recv_tls) {
      std::tie(ec, n) = co_await recv_tls(carried_);
    } else {
      if (step == Step::yield) co_await asio::post(ex_, asio::deferred);
      step = read_step(into, r);
      continue;
    }
    step = read_step(into, r, ec, n);
  }
  co_return r;
}

}  // namespace weir::http
