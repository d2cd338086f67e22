// TCP types for a worker thread, on the concrete executor of core/async.hpp,
// and the write that tries at once before it waits.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <tuple>
#include <type_traits>

#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>

#include "core/async.hpp"
#include "http/edge_recv.hpp"

namespace weir::http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

using core::Executor;
using core::Task;
using core::Timer;
using core::use_task;
using Socket = asio::basic_stream_socket<tcp, Executor>;
using Acceptor = asio::basic_socket_acceptor<tcp, Executor>;

// Writes all of `buffers` to `sock`, which must be in non-blocking mode
// (sock.non_blocking(true)): first at once, then, for what the socket did
// not take, by waiting for it. Returns (error, bytes written). A socket that
// takes everything at once (the common case) costs one send and no trip
// through the scheduler, where asio::async_write would queue its completion.
template <class ConstBufferSequence>
Task<std::tuple<boost::system::error_code, std::size_t>> write_all_now(Socket& sock,
                                                                       const ConstBufferSequence& buffers) {
  boost::system::error_code ec;
  const std::size_t n = asio::write(sock, buffers, ec);
  if (ec != asio::error::would_block && ec != asio::error::try_again) co_return std::tuple{ec, n};
  boost::beast::buffers_suffix<ConstBufferSequence> rest(buffers);
  rest.consume(n);
  auto [wec, wn] = co_await asio::async_write(sock, rest, use_task);
  co_return std::tuple{wec, n + wn};
}

// "HTTP/1.1 200\r\n" at the start of `buf`: a status line whose reason
// phrase is empty and whose space before it is missing too. RFC 9112 §4
// asks for that space, but a client ignores the reason (§4: it "SHOULD
// ignore the reason-phrase content"), and nginx, curl, Go and Python's
// http.client take the line; Beast refuses it (bad_status). The space is
// put back in place, for the parse to be tried again. False when `buf`
// does not begin so.
inline bool restore_status_line_space(boost::beast::flat_buffer& buf) {
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  {
    const std::string_view b(static_cast<const char*>(buf.data().data()), buf.size());
    if (b.size() < 14 || !b.starts_with("HTTP/1.") || !digit(b[7]) || b[8] != ' ' || !digit(b[9]) || !digit(b[10]) ||
        !digit(b[11]) || b[12] != '\r' || b[13] != '\n')
      return false;
  }
  const std::size_t size = buf.size();
  if (size >= buf.max_size()) return false;  // (no room for the byte: prepare() would throw)
  buf.commit(boost::asio::buffer_copy(buf.prepare(1), boost::asio::buffer(" ", 1)));  // (may move the bytes)
  char* p = static_cast<char*>(buf.data().data());
  std::memmove(p + 13, p + 12, size - 12);
  p[12] = ' ';
  return true;
}

// Bytes of empty lines (CRLF or LF) at the start of `buf`.
inline std::size_t empty_lines_at(const boost::beast::flat_buffer& buf) {
  const auto* p = static_cast<const char*>(buf.data().data());
  std::size_t k = 0;
  while (k < buf.size() && (p[k] == '\n' || (p[k] == '\r' && k + 1 < buf.size() && p[k + 1] == '\n')))
    k += p[k] == '\n' ? 1 : 2;
  return k;
}

// True when `buf` holds an LF that no CR precedes.
inline bool has_bare_lf(const boost::beast::flat_buffer& buf) {
  const std::string_view b(static_cast<const char*>(buf.data().data()), buf.size());
  for (std::size_t i = b.find('\n'); i != std::string_view::npos; i = b.find('\n', i + 1))
    if (i == 0 || b[i - 1] != '\r') return true;
  return false;
}

// True when `buf` holds a whole head (after any empty lines): its blank
// line (CRLF CRLF) is there.
inline bool head_buffered(const boost::beast::flat_buffer& buf) {
  const std::size_t skip = empty_lines_at(buf);
  const std::string_view rest(static_cast<const char*>(buf.data().data()) + skip, buf.size() - skip);
  return rest.find("\r\n\r\n") != std::string_view::npos;
}

// True when a head read with Beast's header_limit at `limit` bytes is over
// that limit: Beast refused it (http::error::header_limit), or its read
// ended without error (`ec`) having taken more than `limit` bytes
// (`head_bytes`: the bytes the parser took, from the head's first line to
// its empty line). Beast counts the limit from where each parse step begins,
// not from the head's first byte, so a head whose first lines were parsed in
// an earlier read (the request or status line, some fields) passes it by as
// much. The head's own size is the measure, as each limit is documented: a
// head of `limit` bytes passes, one byte more does not. Shared by the client
// listener (server.max_header), the admin listener (16 KiB) and an
// upstream's response head (http/exchange.cpp).
inline bool head_over_limit(const boost::system::error_code& ec, std::size_t head_bytes, std::size_t limit) {
  return ec == boost::beast::http::error::header_limit || (!ec && head_bytes > limit);
}

// Reads from `sock` (non-blocking mode) into `buf` and feeds Beast's
// `parser` until its head (`until_head`) or its whole message is parsed
// (RFC 9112 framing, Beast's limits: header_limit, body_limit). Returns
// (error, bytes the parser consumed), with the errors of Beast's
// async_read_header / async_read: http::error::end_of_stream (the peer
// closed before sending a byte), partial_message (closed mid-message),
// header_limit, body_limit, buffer_overflow, or the socket's (a timeout that
// closed or cancelled the socket: bad_descriptor, operation_aborted).
//
// Why not Beast's composed reads: each read that completes at once (the
// common case, where the rest of a request came with its first bytes) is
// queued through the scheduler, and Asio 1.26 polls epoll once (epoll_wait,
// timeout 0) for every queued completion: about 3 extra system calls per
// request. Here what is buffered is parsed first; a recv is tried at once
// only while bytes are flowing (something was buffered on entry, or the last
// recv filled its buffer); otherwise, and when that recv finds the socket
// empty, async_read_some waits for readiness. A read takes the buffer's free
// capacity and at least `min_read` bytes (Beast's 512 by default); at least
// twice the last read when that one filled its buffer (bytes keep coming);
// and, for a body of known length, what is still missing plus `min_read` (so
// a 2 KB prompt is one recv, not five of 512 bytes, and a read that returns
// less than asked shows the socket drained); at most 64 KiB.
//
// A plain socket's read that returns less than asked marks it drained
// (async_recv when its recv runs; note_drained, http/edge_recv.hpp, after the
// recv tried at once), so the connection's next async_recv waits for epoll's
// next edge instead of trying a recv that finds nothing.
//
// `Stream` is the Socket, or a TLS stream over one (asio::ssl::stream):
// that one is read only through its async_read_some (OpenSSL buffers
// records the socket's readiness does not show); its close without
// close_notify comes back as ssl::error::stream_truncated (http::classify
// takes it for a reset).
//
// `empty_lines`: a request's read, where empty lines (CRLF, or a bare LF)
// before the request-line are skipped, as RFC 9112 §2.2 asks of a server (a
// client that ends a body with an extra CRLF). They are not counted in the
// bytes used: a connection that sent only empty lines sent no request. A CR
// that ends the bytes so far waits for the next byte (a bare CR is invalid:
// the parser sees it), so the outcome does not depend on how they arrive.
//
// `waited` (optional): the time spent waiting for the peer's bytes (each
// wait for readiness, from before it to its bytes) is added to it: the
// peer's pace, not the reader's work. Two clock reads per wait, none when the
// bytes were already there.
template <class Stream, class Parser>
Task<std::tuple<boost::system::error_code, std::size_t>> read_message(
    Stream& sock, boost::beast::flat_buffer& buf, Parser& parser, bool until_head, std::size_t min_read = 512,
    bool empty_lines = false, std::chrono::steady_clock::duration* waited = nullptr) {
  namespace bh = boost::beast::http;
  using boost::system::error_code;
  const auto complete = [&] { return until_head ? parser.is_header_done() : parser.is_done(); };
  constexpr std::size_t kMaxRead = 65536;
  std::size_t used = 0;
  std::size_t floor = min_read;
  bool try_now = buf.size() > 0;
  for (;;) {
    if (complete()) co_return std::tuple{error_code{}, used};
    bool wait_cr = false;
    if (empty_lines && buf.size() > 0 && !parser.got_some()) {
      buf.consume(empty_lines_at(buf));
      wait_cr = buf.size() == 1 && *static_cast<const char*>(buf.data().data()) == '\r';
    }
    if (buf.size() > 0 && !wait_cr) {
      error_code ec;
      const std::size_t n = parser.put(buf.data(), ec);
      buf.consume(n);
      used += n;
      if (complete()) co_return std::tuple{error_code{}, used};  // (a buffer_body's need_buffer after its head)
      if (ec && ec != bh::error::need_more) co_return std::tuple{ec, used};
      // A chunked body's parser that needs more with bytes left is inside
      // its framing (a chunk-size line, the CRLF after a chunk's data, the
      // last chunk and its trailers; never chunk data, which it takes as it
      // comes): left bytes that hold a bare LF can never complete it.
      // Refused now (RFC 9112 §7.1), not after body_timeout.
      if (ec == bh::error::need_more && !until_head && parser.is_header_done() && parser.chunked() && buf.size() > 0 &&
          has_bare_lf(buf))
        co_return std::tuple{error_code(bh::error::bad_chunk), used};
      if (n > 0 && buf.size() > 0) continue;
    }
    if (buf.size() >= buf.max_size()) co_return std::tuple{error_code(bh::error::buffer_overflow), used};
    std::size_t want = std::max(buf.capacity() - buf.size(), floor);
    if (!until_head && parser.is_header_done() && !parser.chunked()) {
      if (const auto left = parser.content_length_remaining(); left && *left > buf.size())
        want = std::max<std::uint64_t>(want, std::min<std::uint64_t>(*left - buf.size() + min_read, kMaxRead));
    }
    want = std::min({want, kMaxRead, buf.max_size() - buf.size()});
    error_code ec;
    std::size_t n = 0;
    constexpr bool plain = std::is_same_v<Stream, Socket>;
    bool own_recv = false;  // the bytes came from the recv tried at once, not from async_recv
    if constexpr (plain) {
      if (try_now) {
        n = sock.read_some(buf.prepare(want), ec);
        own_recv = true;
      }
    }
    if (!plain || !try_now || ec == asio::error::would_block || ec == asio::error::try_again) {
      own_recv = false;
      const auto wait_from = waited ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      if constexpr (plain) {
        // Edge-triggered: a socket a short read drained is not tried again
        // before epoll reports new bytes (http/edge_recv.hpp).
        auto [rec, rn] = co_await async_recv(sock, buf.prepare(want), use_task);
        ec = rec;
        n = rn;
      } else {
        auto [rec, rn] = co_await sock.async_read_some(buf.prepare(want), use_task);
        ec = rec;
        n = rn;
      }
      if (waited) *waited += std::chrono::steady_clock::now() - wait_from;
    }
    if (ec == asio::error::eof) {
      if (!parser.got_some()) co_return std::tuple{error_code(bh::error::end_of_stream), used};
      ec = {};
      parser.put_eof(ec);
      if (!ec && !complete()) ec = bh::error::partial_message;
      co_return std::tuple{ec, used};
    }
    if (ec) co_return std::tuple{ec, used};
    buf.commit(n);
    try_now = n == want;
    if (try_now) {
      floor = std::min(kMaxRead, want * 2);
    } else if constexpr (plain) {
      // The recv tried at once marks nothing: say it drained the socket, now, before anything else runs.
      // Never after an async_recv: it marked the socket itself when its recv ran, and its completion may
      // have been queued behind an epoll_wait that harvested later bytes; marking it drained here would
      // erase that harvest, and the next read would wait for an edge that already came (a hang until the
      // idle timeout: an upstream answer sent in two pieces, the second right after the first was read).
      if (own_recv) note_drained(sock);
    }
  }
}

}  // namespace weir::http
