// ConnectionPool::sweep against real loopback TCP connections: idle
// connections the server closed (or wrote to unasked) and those past
// max_idle_age are closed; the others stay, newest still taken first.
#include "http/upstream.hpp"

#include <fcntl.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

using namespace weir::http;
using namespace std::chrono_literals;

namespace {

struct Loopback {
  asio::io_context io;
  Acceptor acceptor{io.get_executor()};
  // The server side of each connection, in the order they were made.
  std::vector<Socket> server;

  Loopback() {
    const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    acceptor.open(ep.protocol());
    acceptor.bind(ep);
    acceptor.listen();
  }

  std::unique_ptr<UpstreamConnection> connect() {
    auto c = std::make_unique<UpstreamConnection>(io.get_executor());
    c->socket().connect(acceptor.local_endpoint());
    server.push_back(acceptor.accept());
    return c;
  }
};

// Sweeps until `pool` holds `want` connections or a second passes (a FIN on
// loopback is normally there as close() returns; this only absorbs a slow CI).
std::size_t sweep_until(ConnectionPool& pool, std::chrono::steady_clock::time_point now, std::size_t want) {
  const auto deadline = std::chrono::steady_clock::now() + 1s;
  while (pool.idle() > want && std::chrono::steady_clock::now() < deadline) {
    pool.sweep(now);
    if (pool.idle() > want) std::this_thread::sleep_for(1ms);
  }
  return pool.idle();
}

}  // namespace

TEST(ConnectionPool, SweepClosesConnectionsTheServerClosed) {
  Loopback lo;
  ConnectionPool pool(16, 60s);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<UpstreamConnection*> conns;
  for (int i = 0; i < 6; ++i) {
    auto c = lo.connect();
    conns.push_back(c.get());
    pool.put(std::move(c), t0);
  }
  EXPECT_EQ(pool.sweep(t0), 0u);  // all open and silent: nothing to do
  EXPECT_EQ(pool.idle(), 6u);

  lo.server[1].close();  // FIN
  lo.server[3].set_option(asio::socket_base::linger(true, 0));
  lo.server[3].close();                                                // RST
  asio::write(lo.server[4], asio::buffer("HTTP/1.1 200 OK\r\n", 17));  // unsolicited bytes
  EXPECT_EQ(sweep_until(pool, t0, 3), 3u);

  // The survivors, newest first: 5, 2, 0.
  for (int i : {5, 2, 0}) {
    auto c = pool.take(t0);
    ASSERT_TRUE(c);
    EXPECT_EQ(c.get(), conns[static_cast<std::size_t>(i)]);
  }
  EXPECT_FALSE(pool.take(t0));
}

TEST(ConnectionPool, SweepClosesConnectionsPastMaxIdleAge) {
  Loopback lo;
  ConnectionPool pool(16, 1000ms);
  const auto t0 = std::chrono::steady_clock::now();
  pool.put(lo.connect(), t0);
  pool.put(lo.connect(), t0 + 400ms);
  pool.put(lo.connect(), t0 + 800ms);
  EXPECT_EQ(pool.sweep(t0 + 999ms), 0u);
  EXPECT_EQ(pool.sweep(t0 + 1000ms), 1u);  // the oldest is 1 s old
  EXPECT_EQ(pool.idle(), 2u);
  EXPECT_EQ(pool.sweep(t0 + 2000ms), 2u);
  EXPECT_EQ(pool.idle(), 0u);
}

TEST(ConnectionPool, SweepClosesTheDescriptors) {
  Loopback lo;
  ConnectionPool pool(16, 60s);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    auto c = lo.connect();
    fds.push_back(c->socket().native_handle());
    pool.put(std::move(c), t0);
  }
  for (auto& s : lo.server) s.close();
  EXPECT_EQ(sweep_until(pool, t0, 0), 0u);
  // Weir's side is closed, not left in CLOSE-WAIT (nothing opened since, so
  // the numbers are not reused yet).
  for (int fd : fds) {
    errno = 0;
    EXPECT_EQ(::fcntl(fd, F_GETFD), -1) << fd;
    EXPECT_EQ(errno, EBADF) << fd;
  }
}
