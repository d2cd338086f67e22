// Concrete Asio types for a worker thread. Every socket, timer and coroutine
// on the request path uses the io_context's own executor type instead of the
// type-erased any_io_executor (whose copies show up in Beast profiles).
#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace weir::http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

using Executor = asio::io_context::executor_type;
template <class T = void>
using Task = asio::awaitable<T, Executor>;
using Socket = asio::basic_stream_socket<tcp, Executor>;
using Acceptor = asio::basic_socket_acceptor<tcp, Executor>;
using Timer = asio::basic_waitable_timer<std::chrono::steady_clock,
                                         asio::wait_traits<std::chrono::steady_clock>, Executor>;

// Completion token: `auto [ec, n] = co_await sock.async_read_some(buf, use_task);`
// Errors come back as values; nothing on the request path throws.
inline constexpr auto use_task = asio::as_tuple(asio::use_awaitable_t<Executor>{});

}  // namespace weir::http

#include <tuple>

#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>

namespace weir::http {

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

}  // namespace weir::http
