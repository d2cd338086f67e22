// http::async_recv over a real loopback TCP pair: it reads as async_read_some
// does (bytes, EOF, reset, cancel, close), and its edge-triggered discipline
// never loses the end of a stream: a FIN or RST that arrives together with
// the last bytes, where no later epoll edge will come, is still reported.
#include "http/edge_recv.hpp"

#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>

#include "http/io.hpp"
#include "io_test_util.hpp"

namespace weir::http {
namespace {

using boost::system::error_code;
using test::run_until;

class HttpEdgeRecv : public ::testing::Test {
 protected:
  asio::io_context io{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};  // as a worker's
  test::Peer peer;
  std::optional<Socket> sock;

  void SetUp() override {
    Acceptor acc(io.get_executor(), tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    peer.sock.connect(acc.local_endpoint());
    sock.emplace(acc.accept());
    sock->non_blocking(true);
  }

  // What each completed read returned, in order, until `limit` reads or an error.
  struct Reads {
    std::string bytes;
    std::vector<std::size_t> sizes;
    error_code ec;
    bool done = false;
  };

  // A read's completion, as its handler (handler()) records it.
  struct Completion {
    std::optional<std::size_t> got;  // the bytes, once it completed
    error_code ec;
    auto handler() {
      return [this](error_code e, std::size_t n) {
        ec = e;
        got = n;
      };
    }
  };

  // Keeps one async_recv of `size` bytes in flight until an error ends the stream.
  void read_loop(Reads& r, std::size_t size) {
    auto buf = std::make_shared<std::vector<char>>(size);
    async_recv(*sock, asio::buffer(*buf), [this, &r, buf, size](error_code ec, std::size_t n) {
      r.bytes.append(buf->data(), n);
      if (ec) {
        r.ec = ec;
        r.done = true;
        return;
      }
      r.sizes.push_back(n);
      read_loop(r, size);
    });
  }
};

TEST_F(HttpEdgeRecv, ReadsWhatArrivesAfterItWaitsAndLaterBytesToo) {
  Reads r;
  read_loop(r, 64);
  test::settle(io);  // the first recv found nothing: it waits for the edge
  EXPECT_TRUE(r.sizes.empty());
  peer.send("hello");
  ASSERT_TRUE(run_until(io, [&] { return r.bytes == "hello"; }));
  // Drained by a short read: the next read waits for the next edge.
  peer.send(" world");
  ASSERT_TRUE(run_until(io, [&] { return r.bytes == "hello world"; }));
  peer.sock.close();
  ASSERT_TRUE(run_until(io, [&] { return r.done; }));
  EXPECT_EQ(r.ec, asio::error::eof);
  EXPECT_EQ(r.bytes, "hello world");
}

TEST_F(HttpEdgeRecv, AFinThatArrivesWithTheLastBytesIsReported) {
  // The read is queued before the bytes come, so one epoll harvest carries
  // both the bytes and the FIN: the recv returns the bytes (short), and no
  // later edge will announce the EOF behind them.
  Reads r;
  read_loop(r, 64);
  test::settle(io);
  peer.send("last words");
  peer.sock.shutdown(asio::socket_base::shutdown_send);
  ASSERT_TRUE(run_until(io, [&] { return r.done; })) << "the EOF behind the last bytes was lost";
  EXPECT_EQ(r.bytes, "last words");
  EXPECT_EQ(r.ec, asio::error::eof);
}

TEST_F(HttpEdgeRecv, AResetThatArrivesWithTheLastBytesIsReported) {
  Reads r;
  read_loop(r, 64);
  test::settle(io);
  peer.send("partial");
  peer.reset();
  ASSERT_TRUE(run_until(io, [&] { return r.done; })) << "the reset behind the last bytes was lost";
  EXPECT_TRUE(r.ec == asio::error::connection_reset || r.ec == asio::error::eof) << r.ec.message();
}

TEST_F(HttpEdgeRecv, BytesAndFinBeforeTheFirstReadAreAllReported) {
  peer.send("early");
  peer.sock.shutdown(asio::socket_base::shutdown_send);
  Reads r;
  read_loop(r, 64);
  ASSERT_TRUE(run_until(io, [&] { return r.done; }));
  EXPECT_EQ(r.bytes, "early");
  EXPECT_EQ(r.ec, asio::error::eof);
}

TEST_F(HttpEdgeRecv, AStreamLargerThanTheBufferArrivesWhole) {
  std::string big(200'000, 'x');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  Reads r;
  read_loop(r, 4096);
  std::thread writer([&] {
    peer.send(big);
    peer.sock.shutdown(asio::socket_base::shutdown_send);
  });
  const bool ended = run_until(io, [&] { return r.done; });
  writer.join();
  ASSERT_TRUE(ended);
  EXPECT_EQ(r.ec, asio::error::eof);
  EXPECT_EQ(r.bytes, big);
}

TEST_F(HttpEdgeRecv, CancelAndCloseCompleteAWaitingRead) {
  Reads r;
  read_loop(r, 64);
  test::settle(io);
  sock->cancel();
  ASSERT_TRUE(run_until(io, [&] { return r.done; }));
  EXPECT_EQ(r.ec, asio::error::operation_aborted);

  Reads c;
  read_loop(c, 64);
  test::settle(io);
  sock->close();
  ASSERT_TRUE(run_until(io, [&] { return c.done; }));
  EXPECT_EQ(c.ec, asio::error::operation_aborted);

  Reads after;
  read_loop(after, 64);  // on a closed socket
  ASSERT_TRUE(run_until(io, [&] { return after.done; }));
  EXPECT_EQ(after.ec, asio::error::bad_descriptor);
}

TEST_F(HttpEdgeRecv, WorksAfterAsioOwnReadsAndWaitsOnTheSameSocket) {
  // Asio's own operations re-register the descriptor (EPOLLOUT for a write
  // that waits): the edge discipline survives them.
  peer.send("a");
  char one = 0;
  std::optional<std::size_t> got;
  sock->async_read_some(asio::buffer(&one, 1), [&](error_code, std::size_t n) { got = n; });
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  bool waited = false;
  sock->async_wait(tcp::socket::wait_write, [&](error_code) { waited = true; });
  ASSERT_TRUE(run_until(io, [&] { return waited; }));
  Reads r;
  read_loop(r, 64);
  test::settle(io);
  peer.send("bc");
  peer.sock.shutdown(asio::socket_base::shutdown_send);
  ASSERT_TRUE(run_until(io, [&] { return r.done; }));
  EXPECT_EQ(r.bytes, "bc");
  EXPECT_EQ(r.ec, asio::error::eof);
}

TEST_F(HttpEdgeRecv, QuietSinceDrainedTellsWhetherEpollReportedAnythingAfterAShortRead) {
  EXPECT_FALSE(quiet_since_drained(*sock)) << "a fresh socket is not known to be drained";
  std::optional<std::size_t> got;
  char buf[64];
  peer.send("hello");
  async_recv(*sock, asio::buffer(buf), [&](error_code, std::size_t n) { got = n; });
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  EXPECT_EQ(*got, 5u);
  EXPECT_TRUE(quiet_since_drained(*sock)) << "a short read drained it";
  test::settle(io);
  EXPECT_TRUE(quiet_since_drained(*sock)) << "nothing arrived";

  // Bytes arrive with no read waiting: once an epoll_wait has harvested
  // them, the socket is no longer quiet. (A worker's loop always has work
  // pending, so it always waits in epoll; here a guard keeps it waiting.)
  auto guard = asio::make_work_guard(io);
  peer.send("unasked");
  bool harvested = false;
  ASSERT_TRUE(run_until(io, [&] { return harvested = !quiet_since_drained(*sock); })) << harvested;

  // Read them: quiet again; then the peer closes: not quiet.
  got.reset();
  async_recv(*sock, asio::buffer(buf), [&](error_code, std::size_t n) { got = n; });
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  EXPECT_TRUE(quiet_since_drained(*sock));
  peer.sock.close();
  ASSERT_TRUE(run_until(io, [&] { return !quiet_since_drained(*sock); }));

  sock->close();
  EXPECT_FALSE(quiet_since_drained(*sock)) << "a closed socket is not known to be anything";
}

// note_drained: a short recv of the caller's own (read_message's recv tried
// at once) marks the socket drained as async_recv's would, so the next
// async_recv waits for the next edge, and still sees what comes later; but a
// FIN the reactor harvested with the bytes keeps the next read trying at once.
TEST_F(HttpEdgeRecv, NoteDrainedAfterAShortReadOfTheCallersOwn) {
  char buf[64];
  Completion done;
  auto& got = done.got;  // (not a structured binding: clang 14 cannot capture one)
  auto& got_ec = done.ec;
  auto on_read = done.handler();
  // A first read that fills its buffer registers the socket: not known drained.
  peer.send(std::string(8, 'x'));
  async_recv(*sock, asio::buffer(buf, 8), on_read);
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  EXPECT_FALSE(quiet_since_drained(*sock));

  auto guard = asio::make_work_guard(io);
  peer.send("tail");
  error_code ec;
  EXPECT_EQ(sock->read_some(asio::buffer(buf), ec), 4u);
  note_drained(*sock);
  EXPECT_TRUE(quiet_since_drained(*sock)) << "a short read of the caller's own drained it";
  got.reset();
  async_recv(*sock, asio::buffer(buf), on_read);
  test::settle(io);
  EXPECT_FALSE(got.has_value()) << "nothing arrived: the read waits";
  peer.send("more");
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  EXPECT_EQ(std::string(buf, *got), "more");

  // The last bytes and the FIN, harvested together before the caller's recv.
  peer.send("last");
  peer.sock.shutdown(asio::socket_base::shutdown_send);
  ASSERT_TRUE(run_until(io, [&] { return !quiet_since_drained(*sock); }));
  EXPECT_EQ(sock->read_some(asio::buffer(buf), ec), 4u);
  note_drained(*sock);
  EXPECT_FALSE(quiet_since_drained(*sock)) << "the FIN came with the bytes: no later edge will report it";
  got.reset();
  async_recv(*sock, asio::buffer(buf), on_read);
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); })) << "the EOF behind the last bytes was lost";
  EXPECT_EQ(got_ec, asio::error::eof);
}

// async_recv_drained queues on a drained socket without re-arming it (no
// epoll_ctl, no writability wake-up): it must still see every later arrival.
// The socket is registered for writability first (a write that waited), as
// an upstream connection is after its connect.
TEST_F(HttpEdgeRecv, ADrainedReadSeesBytesAndTheEndThatComeLater) {
  bool writable = false;
  sock->async_wait(Socket::wait_write, [&](error_code) { writable = true; });
  ASSERT_TRUE(run_until(io, [&] { return writable; }));

  char buf[64];
  Completion done;
  auto& got = done.got;  // (not a structured binding: clang 14 cannot capture one)
  auto& got_ec = done.ec;
  auto on_read = done.handler();
  // Drained by a short read of its own.
  peer.send("hello");
  async_recv(*sock, asio::buffer(buf), on_read);
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  ASSERT_TRUE(quiet_since_drained(*sock));
  got.reset();
  async_recv_drained(*sock, asio::buffer(buf), on_read);
  auto guard = asio::make_work_guard(io);
  test::settle(io);
  EXPECT_FALSE(got.has_value()) << "nothing arrived: the read waits";
  peer.send("world");
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  EXPECT_EQ(std::string(buf, *got), "world");

  // Drained by the caller's own recv (EAGAIN), the reactor not told.
  error_code ec;
  EXPECT_EQ(sock->receive(asio::buffer(buf), 0, ec), 0u);
  EXPECT_EQ(ec, asio::error::would_block);
  got.reset();
  async_recv_drained(*sock, asio::buffer(buf), on_read);
  test::settle(io);
  EXPECT_FALSE(got.has_value());
  peer.send("again");
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  EXPECT_EQ(std::string(buf, *got), "again");

  // The end of the stream, after a drained read queued.
  got.reset();
  async_recv_drained(*sock, asio::buffer(buf), on_read);
  test::settle(io);
  EXPECT_FALSE(got.has_value());
  peer.sock.close();
  ASSERT_TRUE(run_until(io, [&] { return got.has_value(); }));
  EXPECT_EQ(got_ec, asio::error::eof);
}

// read_message's async_recv may recv at once (bytes already there) and post its
// completion; bytes that arrive before that completion runs are harvested by
// an epoll_wait in between. Marking the socket drained when the completion
// runs (as for a recv of read_message's own) erased that harvest: the next
// read waited for an edge that had come, and an upstream answer split in two
// hung until its idle timeout (the translation conformance test's split
// points, on a busy host). Every step order between the two sends is tried.
TEST_F(HttpEdgeRecv, ReadMessageSeesBytesHarvestedBeforeItsPostedCompletionRuns) {
  namespace bh = boost::beast::http;
  auto guard = asio::make_work_guard(io);
  for (int steps = 0; steps < 6; ++steps) {
    for (int round = 0; round < 20; ++round) {
      if (steps + round > 0) {  // a new connection each time
        sock.reset();
        peer.sock.close();
        peer.sock = decltype(peer.sock)(peer.io);
        SetUp();
      }
      bh::response_parser<bh::string_body> parser;
      boost::beast::flat_buffer buf;
      std::optional<std::tuple<error_code, std::size_t>> out;
      peer.send("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234");
      test::spawn(io, read_message(*sock, buf, parser, /*until_head=*/false), out);
      for (int i = 0; i < steps; ++i) {
        io.restart();
        io.poll_one();
      }
      peer.send("56789");
      ASSERT_TRUE(run_until(
          io, [&] { return out.has_value(); }, std::chrono::seconds(2)))
          << "the second piece's edge was lost (" << steps << " steps before it was sent)";
      EXPECT_FALSE(std::get<0>(*out)) << std::get<0>(*out).message();
      EXPECT_EQ(parser.get().body(), "0123456789");
    }
  }
}

}  // namespace
}  // namespace weir::http
