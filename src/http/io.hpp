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
