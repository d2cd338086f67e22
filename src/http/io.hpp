// TCP types for a worker thread, on the concrete executor of core/async.hpp,
// and the write that tries at once before it waits.
#pragma once

#include <tuple>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>

#include "core/async.hpp"

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

}  // namespace weir::http
