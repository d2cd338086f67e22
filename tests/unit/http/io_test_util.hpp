// Test-only helpers for tests that run an io_context in the test thread
// against real loopback sockets: run it until a condition holds or a
// deadline passes (a broken behaviour fails the test, it never hangs it),
// spawn a coroutine and keep its result, and a plain blocking peer socket
// (the client, or a scripted upstream) on its own io_context that is never run.
#pragma once

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include "core/async.hpp"

namespace weir::test {

namespace asio = boost::asio;

// Generous: the machine is shared and slow. Only a broken behaviour waits this long.
inline constexpr std::chrono::seconds kDeadline{10};

// Runs `io` in short slices until `done()` holds or `limit` passes; returns done().
template <class Pred>
bool run_until(asio::io_context& io, Pred done, std::chrono::steady_clock::duration limit = kDeadline) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    io.restart();
    if (io.run_for(std::chrono::milliseconds(2)) == 0 && io.stopped())
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // no work at all: do not spin hot
  }
  return true;
}

// Runs the handlers that are ready until none is (the coroutines reached
// their next suspension); bounded, in case something keeps re-posting.
inline void settle(asio::io_context& io) {
  for (int i = 0; i < 10'000; ++i) {
    io.restart();
    if (io.poll() == 0) return;
  }
}

// co_spawns `t` on `io`; its result lands in `out` when it completes.
template <class T>
void spawn(asio::io_context& io, core::Task<T> t, std::optional<T>& out) {
  asio::co_spawn(io.get_executor(), std::move(t), [&out](std::exception_ptr e, T v) {
    if (e) std::rethrow_exception(e);
    out = std::move(v);
  });
}
inline void spawn(asio::io_context& io, core::Task<void> t, bool& done) {
  asio::co_spawn(io.get_executor(), std::move(t), [&done](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
    done = true;
  });
}

// A blocking peer socket; reads are non-blocking (read_available), so the
// test thread can interleave them with running the gateway's io_context.
struct Peer {
  asio::io_context io;
  asio::ip::tcp::socket sock{io};
  std::string received;          // every byte read so far
  boost::system::error_code ec;  // the read error that ended the stream (eof, reset), if any

  void send(std::string_view s) { asio::write(sock, asio::buffer(s.data(), s.size())); }

  // Reads what is there now into `received`; false once the stream ended (ec says how).
  bool read_available() {
    if (ec) return false;
    sock.non_blocking(true);
    char buf[16384];
    for (;;) {
      boost::system::error_code rec;
      const std::size_t n = sock.read_some(asio::buffer(buf), rec);
      if (rec == asio::error::would_block || rec == asio::error::try_again) return true;
      if (rec) {
        ec = rec;
        return false;
      }
      received.append(buf, n);
    }
  }

  // Closes with an RST (SO_LINGER 0) instead of a FIN.
  void reset() {
    boost::system::error_code ignored;
    sock.set_option(asio::socket_base::linger(true, 0), ignored);
    sock.close(ignored);
  }
};

// Runs `io` while reading `peer` until it has received at least `n` bytes
// (or its stream ended, or the deadline passed). Returns whether it got them.
inline bool receive_at_least(asio::io_context& io, Peer& peer, std::size_t n) {
  return run_until(io,
                   [&] {
                     const bool open = peer.read_available();
                     return peer.received.size() >= n || !open;
                   }) &&
         peer.received.size() >= n;
}

}  // namespace weir::test
