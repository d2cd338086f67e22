// One HTTP/1.1 request/response exchange with a model server over a pooled
// or fresh UpstreamConnection: the direct ResponseSource.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include <boost/beast/http/buffer_body.hpp>

#include "http/chunked.hpp"
#include "http/edge_recv.hpp"
#include "http/flat_parser.hpp"
#include "http/response_source.hpp"
#include "http/upstream.hpp"

namespace weir::http {

class Exchange final : public UpstreamExchange {
 public:
  // `scratch` is the worker's receive buffer (>= 4 KiB), used only between
  // one recv and the end of its synchronous parse, never across a
  // suspension: an open stream holds no read buffer of its own.
  Exchange(Executor ex, std::span<char> scratch);
  ~Exchange() override;

  // --- UpstreamExchange ---
  void use(std::unique_ptr<UpstreamConnection> c) override;
  Task<UpstreamFailure> connect(const tcp::endpoint& ep, const TlsTarget& tls, std::chrono::milliseconds timeout,
                                std::chrono::steady_clock::time_point handshake_by = {}) override;
  std::string_view connect_error() const override { return conn_ ? conn_->tls_error() : std::string_view(); }
  Task<UpstreamFailure> start(const Request& r) override;
  std::size_t upstream_bytes() const override { return head_bytes_; }
  bool head_too_large() const override { return head_too_large_; }
  std::chrono::steady_clock::time_point written_at() const override { return written_at_; }
  bool written_whole() const override { return written_whole_; }
  bool closing_head_alone() const override;
  std::unique_ptr<UpstreamConnection> release() override;

  // --- ResponseSource ---
  const ResponseHead& head() const override { return parser_->get(); }
  bool done() const override { return parser_ && body_done(); }
  Task<BodyRead> read(std::span<char> into) override;
  void cancel() override;
  void shrink() override;
  // Plain TCP: non-blocking reads of what the socket already holds. TLS:
  // only what the connection's buffer holds (a record may be half in: no
  // read of the socket without a wait).
  Task<bool> take_end(std::span<char> scratch) override;
  Task<bool> await_end(std::span<char> scratch) override;

  // read() in steps, for a caller that awaits the recv in its own coroutine
  // frame (a stream's relay): no frame of read()'s is made per read, or held
  // while the stream waits for its next event. read_step(into, r) runs the
  // read until it returns (done: `r` is read()'s result) or must wait:
  //   recv      the socket is drained: co_await recv_drained(), then hand
  //             its (error, bytes) to read_step(into, r, ec, n), which goes on
  //             the same way;
  //   recv_tls, yield  a TLS read, or a turn for the worker's other
  //             connections: co_await read_from(step, into, r).
  // `r` is untouched until the step that returns done. read(into) is
  // read_from(Step::start, into, {}).
  enum class Step : std::uint8_t { start, done, recv, recv_tls, yield };
  Step read_step(std::span<char> into, BodyRead& r);
  Step read_step(std::span<char> into, BodyRead& r, boost::system::error_code ec, std::size_t n);
  auto recv_drained() { return async_recv_drained(conn_->socket(), room(carried_), core::use_task); }
  Task<BodyRead> read_from(Step step, std::span<char> into, BodyRead r);
  // When the last read armed its idle deadline to wait for the upstream's
  // bytes (a read_step() that did not return done armed it): the start of
  // that wait, for a caller that measures it without a clock read of its own.
  std::chrono::steady_clock::time_point recv_armed_at() const { return recv_armed_at_; }
  // The reader waits before its next read (its client is behind): the upstream is not waited for, so its
  // idle deadline (pools.X.timeouts.idle, armed by the last read) is off until the next read arms it again.
  void hold_idle() {
    if (conn_) conn_->watchdog().disarm();
  }

 private:
  // A chunked body's trailer fields are dropped, not added to the head
  // (FlatParser): a buffered answer is sent after its whole body, and would
  // otherwise carry the upstream's trailers as headers (Set-Cookie,
  // Content-Type, Location).
  using Parser = FlatParser<false, boost::beast::http::buffer_body>;

  // read_step() in parts.
  struct Recv {
    boost::system::error_code ec;
    std::size_t n;
  };
  // read_step's loop, from its top or (`got`) from the recv a step waited for.
  Step advance(std::span<char> into, BodyRead& r, const Recv* got);
  // Before a recv: arms the idle deadline (not for take_end()); `carried` =
  // bytes kept from the last read, which the recv lands after. False when
  // read() returns now: they leave no room (r.failure set), or take_end()
  // on a TLS connection (no read without a wait).
  bool begin_recv(std::size_t& carried, BodyRead& r);
  // scratch_ after the `carried` bytes: where a recv lands.
  boost::asio::mutable_buffer room(std::size_t carried) const;
  // A plain connection's recv now, unless the socket is known drained (a
  // wait then, not for take_end()). False when the recv must wait for
  // readiness (async_recv_drained); else (ec, n) is the recv's.
  bool recv_now(std::size_t carried, boost::system::error_code& ec, std::size_t& n);
  // A TLS connection's recv of up to scratch_.size() - `carried` bytes into
  // scratch_ after the carried ones: (error, bytes).
  Task<std::pair<boost::system::error_code, std::size_t>> recv_tls(std::size_t carried);
  // After a recv of `n` bytes (error `ec`): `in` = the bytes to parse
  // (carried ones first). False when the read ends here (r.end or r.failure set).
  bool end_recv(boost::system::error_code ec, std::size_t n, std::size_t carried, BodyRead& r, std::string_view& in);
  // Parses `in` (the connection's buffer when `from_raw`) into `into`,
  // counting in `r`. False when read() returns r now.
  bool parse_into(std::string_view in, bool from_raw, std::span<char> into, BodyRead& r);
  // The body's framing taken off `in` into `into`: Beast's parser, or a
  // chunked body's ChunkDecoder. `used`/`got`: bytes taken from `in`, put in
  // `into`. need_more_ set when the bytes past `used` are an incomplete piece
  // of framing. False when the framing is bad.
  bool parse_body(std::string_view in, std::span<char> into, std::size_t& used, std::size_t& got);
  // The whole response was read (parser_ holds a head).
  bool body_done() const { return chunks_on_ ? chunks_.done() : parser_->is_done(); }

  Executor ex_;
  std::span<char> scratch_;
  std::unique_ptr<UpstreamConnection> conn_;
  std::optional<Parser> parser_;
  // A chunked body is decoded here once the head is read (chunks_on_), not by parser_ (http/chunked.hpp).
  ChunkDecoder chunks_;
  std::chrono::milliseconds idle_{0};
  std::chrono::steady_clock::time_point written_at_{};     // written_at()
  std::chrono::steady_clock::time_point recv_armed_at_{};  // recv_armed_at()
  std::chrono::steady_clock::time_point end_by_{};         // await_end(): no wait past it (none when default)
  std::size_t head_bytes_ = 0;
  std::uint32_t carried_ = 0;     // bytes the pending recv lands after (begin_recv's `carried`)
  bool written_whole_ = false;    // written_whole()
  bool need_more_ = false;        // the carried bytes are an incomplete piece of framing: read more first
  bool drained_ = false;          // the last recv emptied the socket: wait for readiness before the next
  bool yield_ = false;            // the next read lets other handlers run first (after kYieldAfterFullReads full reads)
  unsigned full_reads_ = 0;       // recvs in a row that filled the buffer (a fast upstream)
  bool shrink_ = false;           // shrink(): free the connection's read buffer once it is empty
  std::uint8_t carry_len_ = 0;    // bytes in carry_
  std::array<char, 32> carry_{};  // a short piece of framing the parser needs more after (need_more_)
  bool trailing_ = false;         // the upstream sent bytes beyond the response: do not reuse the connection
  bool cut_off_ = false;          // the request's write failed after some bytes (an early answer is read): not reused
  bool faulty_framing_ = false;   // an HTTP/1.0 answer with Transfer-Encoding (RFC 9112 §6.1): not reused
  bool head_too_large_ = false;   // head_too_large()
  bool no_wait_ = false;          // take_end(): read() returns what has arrived, never waits
  bool chunks_on_ = false;        // the body is chunked: chunks_ decodes it
};

}  // namespace weir::http
