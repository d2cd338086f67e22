// http::Downstream over a real loopback TCP pair: the test thread is the
// client (a blocking socket, read without blocking) and runs the server's
// io_context between its steps. Heads and bodies within limits and
// timeouts, every ReadFailure, keep-alive rules, pipelining through the
// posted close-watch read, the client-gone Listener, response body framing,
// the write backlog of a client that does not read, and byte accounting.
#include "http/downstream.hpp"

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io_test_util.hpp"

namespace weir::http {
namespace {

namespace bh = boost::beast::http;
using namespace std::chrono_literals;
using Head = Downstream::Head;
using test::run_until;
using test::settle;
using test::spawn;

struct CountingListener final : Downstream::Listener {
  int calls = 0;
  void on_client_gone() override { ++calls; }
};

class HttpDownstream : public ::testing::Test {
 protected:
  // Adjust before start().
  core::ServerConfig sc;
  asio::io_context io;
  test::Peer client;
  std::optional<Acceptor> acc;
  std::uint64_t total_out = 0;
  CountingListener listener;
  ParserSpares spares;             // as a worker's: outlives the connection
  std::optional<Downstream> down;  // last: destroyed first

  // Connects the client and wraps the accepted socket. `client_rcvbuf` /
  // `server_sndbuf` (bytes, 0 = default) shrink the socket buffers, so a
  // client that does not read stalls the server's writes early.
  void start(int client_rcvbuf = 0, int server_sndbuf = 0) {
    acc.emplace(io.get_executor(), tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    client.sock.open(tcp::v4());
    if (client_rcvbuf) client.sock.set_option(asio::socket_base::receive_buffer_size(client_rcvbuf));
    client.sock.connect(acc->local_endpoint());
    Socket server = acc->accept();
    if (server_sndbuf) server.set_option(asio::socket_base::send_buffer_size(server_sndbuf));
    down.emplace(std::move(server), sc, &total_out, &spares);
    down->set_listener(&listener);
  }

  // A new connection (same config) for the next step of a test.
  void restart() {
    down.reset();
    boost::system::error_code ignored;
    client.sock.close(ignored);
    client.ec = {};
    client.received.clear();
    listener.calls = 0;
    io.restart();
    start();
  }

  void TearDown() override {
    if (!down) return;
    // Complete whatever a failed test left pending, so no coroutine outlives the object.
    bool done = false;
    spawn(io, down->shutdown(), done);
    run_until(
        io, [&] { return done; }, 2s);
    settle(io);
  }

  std::optional<Head> head(bool first = true, bool draining = false) {
    std::optional<Head> r;
    spawn(io, down->read_head(first, draining), r);
    run_until(io, [&] { return r.has_value(); });
    return r;
  }
  std::optional<bool> body() {
    std::optional<bool> r;
    spawn(io, down->read_body(), r);
    run_until(io, [&] { return r.has_value(); });
    return r;
  }
  std::optional<bool> write_all(std::string_view a, std::string_view b = {}) {
    std::optional<bool> r;
    spawn(io, down->write_all(a, b), r);
    run_until(io, [&] { return r.has_value(); });
    return r;
  }
  // Runs the server until the client has received `n` bytes.
  bool receive(std::size_t n) { return test::receive_at_least(io, client, n); }
};

constexpr std::string_view kGet = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";

// --- heads ---

TEST_F(HttpDownstream, Http11HeadKeepsAliveByDefault) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  EXPECT_EQ(down->request().method(), bh::verb::get);
  EXPECT_EQ(down->request().target(), "/v1/models");
  EXPECT_EQ(down->request()[bh::field::host], "x");
  EXPECT_TRUE(down->http11());
  EXPECT_TRUE(down->keep_alive());
  EXPECT_TRUE(down->body_complete());  // no body
  EXPECT_FALSE(down->head_request());
  EXPECT_TRUE(down->connection_mode().keep_alive);
  EXPECT_FALSE(down->connection_mode().http10);
  EXPECT_EQ(down->failure(), ReadFailure::none);
}

TEST_F(HttpDownstream, AReleasedRequestKeepsItsFramingAndTheNextRequestIsReadWhole) {
  start();
  client.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), true);
  EXPECT_EQ(down->body(), "hello");
  down->release_request();  // a stream past its commit point
  // What the response's framing needs stays; the head, its fields and the body are gone.
  EXPECT_TRUE(down->http11());
  EXPECT_FALSE(down->head_request());
  EXPECT_TRUE(down->keep_alive());
  EXPECT_TRUE(down->connection_mode().keep_alive);
  EXPECT_FALSE(down->connection_mode().http10);
  EXPECT_TRUE(down->body_complete());
  EXPECT_EQ(down->request()[bh::field::host], "");
  EXPECT_EQ(down->request().target(), "");
  EXPECT_EQ(down->target(), "");
  EXPECT_EQ(down->body(), "");
  down->release_request();  // twice: nothing more to give back
  // The next request on the connection takes a parser again (the spare this one left).
  client.send("HEAD /2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  ASSERT_EQ(head(false), Head::request);
  EXPECT_EQ(down->request().target(), "/2");
  EXPECT_EQ(down->target(), "/2");
  EXPECT_TRUE(down->head_request());
  EXPECT_FALSE(down->http11());
  EXPECT_TRUE(down->connection_mode().http10);
  down->release_request();
  EXPECT_TRUE(down->head_request());
  EXPECT_TRUE(down->connection_mode().http10);
}

TEST(HttpParserSpares, AGivenParserStorageIsTakenAgainUpToTheBound) {
  ParserSpares s;
  void* a = s.take();
  void* b = s.take();
  EXPECT_NE(a, b);
  s.give(a);
  EXPECT_EQ(s.take(), a);  // the spare, not a new allocation
  s.give(a);
  s.give(b);
  // Beyond the bound, storage is freed rather than kept (no leak under ASan either way).
  std::vector<void*> many;
  for (int i = 0; i < 40; ++i) many.push_back(s.take());
  for (void* p : many) s.give(p);
}

TEST_F(HttpDownstream, ConnectionCloseEndsKeepAlive) {
  start();
  client.send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  EXPECT_FALSE(down->keep_alive());
  EXPECT_FALSE(down->connection_mode().keep_alive);
  EXPECT_FALSE(down->connection_mode().http10);
}

TEST_F(HttpDownstream, Http10ClosesUnlessItAsksForKeepAlive) {
  start();
  client.send("GET / HTTP/1.0\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  EXPECT_FALSE(down->http11());
  EXPECT_FALSE(down->keep_alive());
  EXPECT_FALSE(down->connection_mode().keep_alive);
  EXPECT_TRUE(down->connection_mode().http10);
}

TEST_F(HttpDownstream, Http10WithConnectionKeepAliveKeepsAlive) {
  start();
  client.send("HEAD / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  EXPECT_TRUE(down->head_request());
  EXPECT_FALSE(down->http11());
  EXPECT_TRUE(down->keep_alive());
  EXPECT_TRUE(down->connection_mode().keep_alive);
  EXPECT_TRUE(down->connection_mode().http10);
  // A second request on the same connection is read too.
  client.send("GET /2 HTTP/1.0\r\n\r\n");
  ASSERT_EQ(head(false), Head::request);
  EXPECT_EQ(down->request().target(), "/2");
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, NoKeepAliveOverridesTheRequest) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->no_keep_alive();
  EXPECT_FALSE(down->keep_alive());
  EXPECT_FALSE(down->connection_mode().keep_alive);
}

TEST_F(HttpDownstream, HeadOverMaxHeaderIsHeadTooLarge) {
  sc.max_header_bytes = 1024;
  start();
  client.send("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
  ASSERT_EQ(head(), Head::failed);
  EXPECT_EQ(down->failure(), ReadFailure::head_too_large);
  EXPECT_FALSE(down->keep_alive());
}

// A request line that does not end within the limit is a URI too long
// (414, as nginx), not header fields too large; so is a whole line over it.
TEST_F(HttpDownstream, RequestLineOverMaxHeaderIsLineTooLong) {
  sc.max_header_bytes = 1024;
  start();
  client.send("GET /" + std::string(2000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(head(), Head::failed);
  EXPECT_EQ(down->failure(), ReadFailure::line_too_long);
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, HeadJustUnderMaxHeaderIsRead) {
  sc.max_header_bytes = 1024;
  start();
  std::string h = "GET / HTTP/1.1\r\nHost: x\r\nX-Big: ";
  h += std::string(1024 - h.size() - 4 - 100, 'a') + "\r\n\r\n";
  client.send(h);
  ASSERT_EQ(head(), Head::request);
  EXPECT_EQ(down->failure(), ReadFailure::none);
}

TEST_F(HttpDownstream, GarbageIsMalformed) {
  for (const std::string bad : {"HELLO\r\n\r\n", "GET / HTTP/01.1\r\n\r\n", "GET / HTTP/1.1\r\nNo colon here\r\n\r\n",
                                "POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", "GET\x01/ HTTP/1.1\r\n\r\n"}) {
    SCOPED_TRACE(bad);
    restart();
    client.send(bad);
    ASSERT_EQ(head(), Head::failed);
    EXPECT_EQ(down->failure(), ReadFailure::malformed);
    EXPECT_FALSE(down->failure_detail().empty());
    EXPECT_FALSE(down->keep_alive());
  }
}

// A major version other than 1 is one Weir does not speak (505), a PROXY protocol header a named 400.
TEST_F(HttpDownstream, OtherMajorVersionsAndProxyProtocolAreNamed) {
  for (const auto& [bad, failure] :
       {std::pair<std::string, ReadFailure>{"GET / HTTP/9.9\r\n\r\n", ReadFailure::version_not_supported},
        {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", ReadFailure::version_not_supported},
        {"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nGET / HTTP/1.1\r\n\r\n", ReadFailure::proxy_protocol}}) {
    SCOPED_TRACE(bad);
    restart();
    client.send(bad);
    ASSERT_EQ(head(), Head::failed);
    EXPECT_EQ(down->failure(), failure);
    if (failure == ReadFailure::version_not_supported) {
      EXPECT_EQ(down->failure_detail(), bad.substr(bad.find("HTTP/") + 5, 1));
    }
    EXPECT_FALSE(down->keep_alive());
  }
}

TEST_F(HttpDownstream, SlowHeadIsHeadTimeout) {
  sc.header_timeout = 200ms;
  start();
  client.send("GET / HTTP/1.1\r\nHo");
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(head(), Head::failed);
  EXPECT_EQ(down->failure(), ReadFailure::head_timeout);
  EXPECT_FALSE(down->keep_alive());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 8s);
}

TEST_F(HttpDownstream, SilentFirstConnectionTimesOutAsClosedNotAsARequest) {
  sc.header_timeout = 200ms;
  start();
  ASSERT_EQ(head(), Head::closed);
}

TEST_F(HttpDownstream, ImmediateCloseOrResetIsClosed) {
  start();
  client.sock.close();
  EXPECT_EQ(head(), Head::closed);

  restart();
  client.reset();
  EXPECT_EQ(head(), Head::closed);
}

TEST_F(HttpDownstream, CloseBetweenRequestsIsClosed) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  client.sock.shutdown(tcp::socket::shutdown_send);
  EXPECT_EQ(head(false), Head::closed);
  EXPECT_EQ(down->failure(), ReadFailure::none);
}

TEST_F(HttpDownstream, KeepAliveIdleTimeoutIsClosed) {
  sc.keepalive_timeout = 200ms;
  sc.header_timeout = 60s;
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  EXPECT_EQ(head(false), Head::closed);  // keepalive_timeout applies to the next request, not header_timeout
}

// The keep-alive deadline fires (its handler has run: the wait is cancelled, its completion not yet run)
// and then the next request is in the socket: a front proxy that reused its pooled connection as Weir's
// keepalive_timeout ended. It is served as the connection's last, not reset unread (the proxy's 502).
class HttpDownstreamIdleDeadline : public HttpDownstream, public ::testing::WithParamInterface<bool> {
 protected:
  std::optional<Head> r;
  // Runs read_head(first=false) past its keep-alive deadline to the watchdog's handler alone, then sends
  // `next`, then runs the read to its end (`finish`; else only what is ready). GetParam(): the wait is the
  // close watch a proxied request posted, not read_head's own read.
  std::optional<Head> late(std::string_view next, bool finish = true) {
    sc.keepalive_timeout = 50ms;
    sc.header_timeout = 60s;
    start();
    client.send(kGet);
    EXPECT_EQ(head(), Head::request);
    if (GetParam()) down->watch_for_close(false);
    spawn(io, down->read_head(false, false), r);
    settle(io);
    EXPECT_FALSE(r.has_value());
    std::this_thread::sleep_for(100ms);  // the deadline passes with nothing sent
    io.restart();
    for (int i = 0; i < 1000 && !down->timed_out(); ++i) io.run_one_for(10ms);  // the deadline's handler
    EXPECT_TRUE(down->timed_out());
    EXPECT_FALSE(r.has_value());  // (the cancelled read's completion has not run)
    if (!next.empty()) client.send(next);
    if (finish)
      run_until(io, [&] { return r.has_value(); });
    else
      settle(io);
    return r;
  }
};

TEST_P(HttpDownstreamIdleDeadline, ARequestHereAsTheDeadlineFiredIsServedAsTheLast) {
  EXPECT_EQ(late(kGet), Head::request);
  EXPECT_FALSE(down->keep_alive());  // Connection: close
  EXPECT_FALSE(down->timed_out());
  EXPECT_FALSE(down->client_gone());
  EXPECT_EQ(down->request().target(), "/v1/models");
}

TEST_P(HttpDownstreamIdleDeadline, NothingHereAsTheDeadlineFiredIsClosed) {
  EXPECT_EQ(late({}), Head::closed);
  EXPECT_EQ(down->failure(), ReadFailure::none);
}

TEST_P(HttpDownstreamIdleDeadline, HalfAHeadHereAsTheDeadlineFiredHasHeaderTimeoutForTheRest) {
  // Its first bytes came in time: the rest of the head is read as any head's, then answered as the last.
  EXPECT_FALSE(late("GET /v1/models HTTP/1.1\r\n", /*finish=*/false).has_value());
  client.send("Host: x\r\n\r\n");
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_EQ(*r, Head::request);
  EXPECT_FALSE(down->keep_alive());
}

INSTANTIATE_TEST_SUITE_P(Wait, HttpDownstreamIdleDeadline, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "CloseWatch" : "ReadHead"; });

TEST_F(HttpDownstream, DrainingEndsAnIdleConnectionButServesABufferedOne) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  EXPECT_EQ(head(false, true), Head::closed);  // nothing buffered: ends at once

  restart();
  client.send(std::string(kGet) + "GET /next HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(head(false, true), Head::request);  // already here: answered, then the connection ends
  EXPECT_EQ(down->request().target(), "/next");
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, BeginDrainEndsAWaitingReadHead) {
  start();
  std::optional<Head> r;
  spawn(io, down->read_head(false, false), r);
  settle(io);
  ASSERT_FALSE(r.has_value());
  down->begin_drain();
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_EQ(*r, Head::closed);
}

TEST_F(HttpDownstream, BeginDrainServesARequestThatCameAsTheWaitEnded) {
  // The request is in the socket, its read's completion not yet run, when the drain cancels the wait: it
  // is served as the connection's last (it was reset unanswered).
  start();
  std::optional<Head> r;
  spawn(io, down->read_head(false, false), r);
  settle(io);
  ASSERT_FALSE(r.has_value());
  client.send(kGet);
  down->begin_drain();  // (before the worker ran the read's completion)
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_EQ(*r, Head::request);
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, BeginDrainServesARequestThatCameWhileTheCloseWatchWaited) {
  // After a proxied request the wait for the next one is the close watch posted during it: the drain's
  // cancel of it read as the client leaving, and the request that had come was reset.
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->watch_for_close(false);
  std::optional<Head> r;
  spawn(io, down->read_head(false, false), r);
  settle(io);
  ASSERT_FALSE(r.has_value());
  client.send(kGet);
  down->begin_drain();  // (before the worker ran the watch's completion)
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_EQ(*r, Head::request);
  EXPECT_FALSE(down->keep_alive());
  EXPECT_FALSE(down->client_gone());
}

TEST_F(HttpDownstream, ARequestWhoseHeadEndsAfterTheDrainBeganIsTheLast) {
  // Half a head when the drain begins: its answer says Connection: close (read_head's `draining` was
  // false when it began, and the drain's no-keep-alive was overwritten at the head's end).
  start();
  std::optional<Head> r;
  spawn(io, down->read_head(true, false), r);
  client.send("GET / HTTP/1.1\r\nHost: x\r\n");
  settle(io);
  down->begin_drain();
  client.send("\r\n");
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_EQ(*r, Head::request);
  EXPECT_FALSE(down->keep_alive());
}

// --- bodies ---

TEST_F(HttpDownstream, AHeadAndBodyTricklingInOneByteAtATimeAreReadWhole) {
  // read_message's two ways to get bytes: a recv at once while bytes flow,
  // a wait when the socket is empty; every split point of head and body.
  start();
  const std::string req = "POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
  std::optional<Head> h;
  spawn(io, down->read_head(true, false), h);
  std::size_t i = 0;
  for (; i < req.size() && !h; ++i) {
    client.send(req.substr(i, 1));
    settle(io);
  }
  ASSERT_EQ(h, Head::request);
  EXPECT_EQ(down->request().target(), "/v1/x");
  std::optional<bool> b;
  spawn(io, down->read_body(), b);
  for (; i < req.size(); ++i) {
    settle(io);
    EXPECT_FALSE(b.has_value());
    client.send(req.substr(i, 1));
  }
  ASSERT_TRUE(run_until(io, [&] { return b.has_value(); }));
  EXPECT_TRUE(*b);
  EXPECT_EQ(down->body(), "hello");
}

TEST_F(HttpDownstream, ContentLengthBodyInTheHeadSegment) {
  start();
  client.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), true);
  EXPECT_EQ(down->body(), "hello world");
  EXPECT_TRUE(down->body_complete());
  EXPECT_TRUE(down->keep_alive());
}

TEST_F(HttpDownstream, ContentLengthBodyArrivingLater) {
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhel");
  ASSERT_EQ(head(), Head::request);
  std::optional<bool> r;
  spawn(io, down->read_body(), r);
  settle(io);
  EXPECT_FALSE(r.has_value());
  client.send("lo w");
  settle(io);
  EXPECT_FALSE(r.has_value());
  client.send("orld");
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_TRUE(*r);
  EXPECT_EQ(down->body(), "hello world");
}

TEST_F(HttpDownstream, ZeroContentLengthBody) {
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  EXPECT_TRUE(down->body_complete());
  ASSERT_EQ(body(), true);
  EXPECT_EQ(down->body(), "");
}

TEST_F(HttpDownstream, ChunkedBody) {
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n");
  ASSERT_EQ(head(), Head::request);
  std::optional<bool> r;
  spawn(io, down->read_body(), r);
  settle(io);
  EXPECT_FALSE(r.has_value());
  client.send("0\r\n\r\n");
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_TRUE(*r);
  EXPECT_EQ(down->body(), "hello world");
}

TEST_F(HttpDownstream, ContentLengthOverMaxBodyIsRefusedBeforeReading) {
  sc.max_body_bytes = 100;
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n");  // the body is never sent
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), false);
  EXPECT_EQ(down->failure(), ReadFailure::body_too_large);
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, ContentLengthAtMaxBodyIsRead) {
  sc.max_body_bytes = 100;
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + std::string(100, 'b'));
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), true);
  EXPECT_EQ(down->body(), std::string(100, 'b'));
}

TEST_F(HttpDownstream, ExpectContinueOverMaxBodyIsRefusedWithoutA100) {
  sc.max_body_bytes = 100;
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), false);
  EXPECT_EQ(down->failure(), ReadFailure::body_too_large);
  // The next bytes the client gets are the answer, not "100 Continue".
  ASSERT_EQ(write_all("X"), true);
  ASSERT_TRUE(receive(1));
  EXPECT_EQ(client.received, "X");
}

TEST_F(HttpDownstream, ExpectContinueWithinMaxBodyGetsA100ThenTheBody) {
  sc.max_body_bytes = 100;
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  std::optional<bool> r;
  spawn(io, down->read_body(), r);
  constexpr std::string_view k100 = "HTTP/1.1 100 Continue\r\n\r\n";
  ASSERT_TRUE(receive(k100.size()));
  EXPECT_EQ(client.received, k100);
  EXPECT_FALSE(r.has_value());  // waits for the body the client now sends
  client.send("hello");
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_TRUE(*r);
  EXPECT_EQ(down->body(), "hello");
  EXPECT_TRUE(down->keep_alive());
}

// RFC 9110 §10.1.1: "A server that receives a 100-continue expectation in an
// HTTP/1.0 request MUST ignore that expectation." (Regression: read_body
// once sent "HTTP/1.1 100 Continue" whatever the request's version.)
TEST_F(HttpDownstream, Http10ExpectContinueIsIgnored) {
  start();
  client.send("POST / HTTP/1.0\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), true);
  EXPECT_EQ(down->body(), "hello");
  ASSERT_EQ(write_all("X"), true);
  ASSERT_TRUE(receive(1));
  EXPECT_EQ(client.received, "X");
}

TEST_F(HttpDownstream, ChunkedBodyOverMaxBodyIsBodyTooLarge) {
  sc.max_body_bytes = 100;
  start();
  // All of it in one segment with the head, so it is parsed from the buffer.
  client.send(
      "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "40\r\n" +
      std::string(64, 'a') + "\r\n40\r\n" + std::string(64, 'b') + "\r\n0\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), false);
  EXPECT_EQ(down->failure(), ReadFailure::body_too_large);
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, ChunkedBodyOverMaxBodyArrivingLaterIsBodyTooLarge) {
  sc.max_body_bytes = 100;
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  std::optional<bool> r;
  spawn(io, down->read_body(), r);
  settle(io);
  client.send("40\r\n" + std::string(64, 'a') + "\r\n");
  settle(io);
  client.send("40\r\n" + std::string(64, 'b') + "\r\n");
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_FALSE(*r);
  EXPECT_EQ(down->failure(), ReadFailure::body_too_large);
}

// server.max_buffered (core/buffer_budget.hpp): a body is charged to the process's budget before its bytes are
// read, its Content-Length at once, a chunked body each chunk as its size comes; over the budget it is
// over_budget (503), and the charge comes back when the request ends.
TEST_F(HttpDownstream, ContentLengthOverTheBufferBudgetIsRefusedBeforeReading) {
  sc.max_buffered_bytes = 1000;
  const std::uint64_t before = core::process_buffers.used();
  const std::uint64_t refused = core::process_buffers.refused(core::BufferBudget::Use::request_body);
  core::BufferCharge other;  // another request's body holds 600 of the 1000
  ASSERT_TRUE(other.cover(600, 0, core::BufferBudget::Use::request_body));
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\nExpect: 100-continue\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), false);
  EXPECT_EQ(down->failure(), ReadFailure::over_budget);
  EXPECT_FALSE(down->keep_alive());
  EXPECT_EQ(core::process_buffers.used(), before + 600);
  EXPECT_EQ(core::process_buffers.refused(core::BufferBudget::Use::request_body), refused + 1);
  // The next bytes the client gets are the answer, not "100 Continue".
  ASSERT_EQ(write_all("X"), true);
  ASSERT_TRUE(receive(1));
  EXPECT_EQ(client.received, "X");
}

TEST_F(HttpDownstream, ABodyWithinTheBufferBudgetIsChargedUntilTheRequestEnds) {
  sc.max_buffered_bytes = 1000;
  const std::uint64_t before = core::process_buffers.used();
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 400\r\n\r\n" + std::string(400, 'b'));
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), true);
  EXPECT_EQ(core::process_buffers.used(), before + 400);
  down->trim_storage(16 * 1024);  // the request is over
  EXPECT_EQ(core::process_buffers.used(), before);
}

TEST_F(HttpDownstream, AChunkedBodyIsRefusedAtTheChunkThatWouldPassTheBufferBudget) {
  sc.max_buffered_bytes = 100;
  const std::uint64_t before = core::process_buffers.used();
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  std::optional<bool> r;
  spawn(io, down->read_body(), r);
  settle(io);
  client.send("40\r\n" + std::string(64, 'a') + "\r\n");
  settle(io);
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(core::process_buffers.used(), before + 64);
  client.send("40\r\n");  // 128 announced: refused before its bytes come
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_FALSE(*r);
  EXPECT_EQ(down->failure(), ReadFailure::over_budget);
  down->release_request();
  EXPECT_EQ(core::process_buffers.used(), before);
}

TEST_F(HttpDownstream, MalformedChunkedBodyIsMalformed) {
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), false);
  EXPECT_EQ(down->failure(), ReadFailure::malformed);
}

TEST_F(HttpDownstream, ChunkExtensionsOverMaxHeaderAreFramingTooLarge) {
  // Beast's body_limit counts chunk data only: extensions are counted
  // against server.max_header, in one chunk or spread over many.
  sc.max_header_bytes = 1024;
  sc.max_body_bytes = 1 << 20;
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4c;e=" + std::string(2000, 'a') +
              "\r\n");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), false);
  EXPECT_EQ(down->failure(), ReadFailure::framing_too_large);
  EXPECT_FALSE(down->keep_alive());

  restart();
  std::string many = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 20; ++i) many += "1;e=" + std::string(100, 'a') + "\r\nz\r\n";
  client.send(many);
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), false);
  EXPECT_EQ(down->failure(), ReadFailure::framing_too_large);
}

TEST_F(HttpDownstream, ChunkExtensionsWithinMaxHeaderAreRead) {
  sc.max_header_bytes = 1024;
  start();
  client.send(
      "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n0;last\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), true);
  EXPECT_EQ(down->body(), "hello");
}

TEST_F(HttpDownstream, AChunkSizeLineOverTheReadBufferIsFramingTooLargeNotHeld) {
  // 32 MiB of leading zeros was held whole: the read buffer is bounded
  // (server.max_header + 64 KiB) and a line that does not fit is refused.
  sc.max_header_bytes = 1024;
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  std::optional<bool> r;
  spawn(io, down->read_body(), r);
  settle(io);
  const std::string zeros(16 * 1024, '0');
  for (int i = 0; i < 8 && !r; ++i) {
    client.send(zeros);
    settle(io);
  }
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_FALSE(*r);
  EXPECT_EQ(down->failure(), ReadFailure::framing_too_large);
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, TransferEncodingNotEndingInChunkedIsBadFramingAndCloses) {
  // RFC 9112 §6.3: Beast framed these by Content-Length (or as bodiless),
  // and the bytes after became the next request (smuggling).
  for (const std::string bad :
       {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\nContent-Length: 5\r\n\r\nhello",
        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n",
        "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"}) {
    SCOPED_TRACE(bad);
    restart();
    client.send(bad);
    ASSERT_EQ(head(), Head::failed);
    EXPECT_EQ(down->failure(), ReadFailure::bad_framing);
    EXPECT_FALSE(down->keep_alive());
  }
  restart();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n");
  ASSERT_EQ(head(), Head::failed);
  EXPECT_EQ(down->failure(), ReadFailure::unsupported_coding);
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, Http11WithoutOneValidHostIsBadHost) {
  for (const std::string bad : {"GET / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                                "GET / HTTP/1.1\r\nHost: a b/c\r\n\r\n"}) {
    SCOPED_TRACE(bad);
    restart();
    client.send(bad);
    ASSERT_EQ(head(), Head::failed);
    EXPECT_EQ(down->failure(), ReadFailure::bad_host);
    EXPECT_FALSE(down->keep_alive());
  }
}

TEST_F(HttpDownstream, AbsoluteFormTargetIsServedByItsPath) {
  start();
  client.send("GET http://evil.example/v1/models?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  EXPECT_EQ(down->target(), "/v1/models?x=1");
  client.send("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(head(false), Head::request);
  EXPECT_EQ(down->target(), "/v1/models");
  client.send("GET * HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(head(false), Head::failed);
  EXPECT_EQ(down->failure(), ReadFailure::bad_target);
}

TEST_F(HttpDownstream, ClientClosingMidBodyIsClientClosed) {
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789");
  ASSERT_EQ(head(), Head::request);
  std::optional<bool> r;
  spawn(io, down->read_body(), r);
  settle(io);
  EXPECT_FALSE(r.has_value());
  client.sock.shutdown(tcp::socket::shutdown_send);
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_FALSE(*r);
  EXPECT_EQ(down->failure(), ReadFailure::client_closed);
  EXPECT_TRUE(down->client_gone());
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, ClientResettingMidBodyIsClientClosed) {
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel");
  ASSERT_EQ(head(), Head::request);
  std::optional<bool> r;
  spawn(io, down->read_body(), r);
  settle(io);
  client.reset();
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_FALSE(*r);
  EXPECT_EQ(down->failure(), ReadFailure::client_closed);
}

TEST_F(HttpDownstream, SlowBodyIsBodyTimeout) {
  sc.body_timeout = 200ms;
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), false);
  EXPECT_EQ(down->failure(), ReadFailure::body_timeout);
  EXPECT_FALSE(down->keep_alive());
}

TEST_F(HttpDownstream, LentBodyStorageIsUsedAndKept) {
  start();
  EXPECT_FALSE(down->has_body_storage());
  std::string store;
  store.reserve(4096);
  const char* data = store.data();
  down->lend_body_storage(std::move(store));
  EXPECT_TRUE(down->has_body_storage());
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), true);
  EXPECT_EQ(down->body(), "abc");
  EXPECT_EQ(down->body().data(), data);  // the lent storage, not a new allocation
}

// --- pipelining and the close watch ---

TEST_F(HttpDownstream, TwoPipelinedRequestsInOneWriteAreReadInTurn) {
  start();
  client.send(
      "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
      "GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  EXPECT_EQ(down->request().target(), "/a");
  ASSERT_EQ(body(), true);
  EXPECT_EQ(down->body(), "hello");
  down->begin_request();
  down->watch_for_close();  // posted while /b is already buffered
  settle(io);
  EXPECT_EQ(listener.calls, 0);
  ASSERT_EQ(head(false), Head::request);
  EXPECT_EQ(down->request().target(), "/b");
  EXPECT_EQ(down->request().method(), bh::verb::get);
  EXPECT_TRUE(down->keep_alive());
  EXPECT_FALSE(down->client_gone());
  EXPECT_EQ(listener.calls, 0);
  // The connection still works: and a third request after that.
  down->watch_for_close();
  client.send("GET /c HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(head(false), Head::request);
  EXPECT_EQ(down->request().target(), "/c");
  EXPECT_EQ(listener.calls, 0);
}

TEST_F(HttpDownstream, ARequestReadByTheCloseWatchIsTheNextRequest) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  down->watch_for_close();
  settle(io);
  // Longer than the watch's one read (512 bytes): the rest comes through read_head.
  const std::string next = "GET /next HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(3000, 'p') + "\r\n\r\n";
  client.send(next);
  settle(io);
  EXPECT_EQ(listener.calls, 0);
  ASSERT_EQ(head(false), Head::request);
  EXPECT_EQ(down->request().target(), "/next");
  EXPECT_EQ(down->request()["X-Pad"].size(), 3000u);
  EXPECT_EQ(listener.calls, 0);
}

TEST_F(HttpDownstream, ReadHeadWaitsOnThePostedWatchForTheNextRequest) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->watch_for_close();
  settle(io);
  std::optional<Head> r;
  spawn(io, down->read_head(false, false), r);
  settle(io);
  EXPECT_FALSE(r.has_value());
  client.send("GET /later HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_EQ(*r, Head::request);
  EXPECT_EQ(down->request().target(), "/later");
}

TEST_F(HttpDownstream, KeepAliveTimeoutWhileTheWatchIsPostedIsClosed) {
  sc.keepalive_timeout = 200ms;
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->watch_for_close();
  settle(io);
  EXPECT_EQ(head(false), Head::closed);
}

TEST_F(HttpDownstream, WatchForCloseTellsTheListenerOnceWhenTheClientCloses) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  down->watch_for_close();
  down->watch_for_close();  // a second call while posted changes nothing
  settle(io);
  EXPECT_EQ(listener.calls, 0);
  EXPECT_FALSE(down->client_gone());
  client.sock.close();
  ASSERT_TRUE(run_until(io, [&] { return listener.calls > 0; }));
  EXPECT_TRUE(down->client_gone());
  // Writes to the departed client fail; the listener is not told again.
  for (int i = 0; i < 50 && !down->write_failed(); ++i) {
    down->queue_body(std::string(64 << 10, 'x'));
    down->flush();
    bool drained = false;
    spawn(io, down->drain(), drained);
    run_until(io, [&] { return drained; });
  }
  EXPECT_TRUE(down->write_failed());
  down->watch_for_close();  // no-op once gone
  settle(io);
  EXPECT_EQ(listener.calls, 1);
  EXPECT_EQ(head(false), Head::closed);
  EXPECT_EQ(listener.calls, 1);
}

TEST_F(HttpDownstream, WatchForCloseTellsTheListenerWhenTheClientResets) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->watch_for_close();
  settle(io);
  client.reset();
  ASSERT_TRUE(run_until(io, [&] { return listener.calls > 0; }));
  settle(io);
  EXPECT_EQ(listener.calls, 1);
  EXPECT_TRUE(down->client_gone());
}

// --- writing ---

TEST_F(HttpDownstream, QueueBodyFramesChunksForHttp11) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  const std::string h = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  down->queue(h);
  down->queue_body("hello");
  down->queue_body(std::string(300, 'x'));  // 0x12c
  down->queue_body("data: {\"a\":1}\n\n");  // 15 bytes: 0xf
  down->queue_end();
  EXPECT_FALSE(down->queue_empty());
  down->flush();
  const std::string want =
      h + "5\r\nhello\r\n12c\r\n" + std::string(300, 'x') + "\r\nf\r\ndata: {\"a\":1}\n\n\r\n0\r\n\r\n";
  ASSERT_TRUE(receive(want.size())) << client.received.size() << " of " << want.size() << ": " << client.received;
  bool drained = false;
  spawn(io, down->drain(), drained);
  ASSERT_TRUE(run_until(io, [&] { return drained; }));
  EXPECT_EQ(client.received, want);
  EXPECT_EQ(down->bytes_out(), want.size());
  EXPECT_EQ(total_out, want.size());
  EXPECT_EQ(down->backlog(), 0u);
  EXPECT_TRUE(down->queue_empty());
  EXPECT_FALSE(down->write_failed());
}

TEST_F(HttpDownstream, QueueBodyIsRawForHttp10) {
  start();
  client.send("GET / HTTP/1.0\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  down->queue("HTTP/1.1 200 OK\r\n\r\n");
  down->queue_body("hello ");
  down->queue_body("world");
  down->queue_end();  // nothing: the body ends at close
  down->flush();
  const std::string want = "HTTP/1.1 200 OK\r\n\r\nhello world";
  ASSERT_TRUE(receive(want.size()));
  settle(io);
  client.read_available();
  EXPECT_EQ(client.received, want);
  EXPECT_EQ(down->bytes_out(), want.size());
}

TEST_F(HttpDownstream, WriteAllSendsBothPartsAndCountsThem) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  ASSERT_EQ(write_all("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", "ok"), true);
  const std::string want = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  ASSERT_TRUE(receive(want.size()));
  EXPECT_EQ(client.received, want);
  EXPECT_EQ(down->bytes_out(), want.size());
  EXPECT_EQ(total_out, want.size());

  // begin_request() restarts the request's count; the worker's total goes on.
  client.send(kGet);
  ASSERT_EQ(head(false), Head::request);
  down->begin_request();
  EXPECT_EQ(down->bytes_out(), 0u);
  ASSERT_EQ(write_all("abc"), true);
  EXPECT_EQ(down->bytes_out(), 3u);
  EXPECT_EQ(total_out, want.size() + 3);
}

TEST_F(HttpDownstream, BacklogGrowsWhenTheClientDoesNotReadAndWritesFailAfterItResets) {
  start(/*client_rcvbuf=*/4096, /*server_sndbuf=*/4096);
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  down->watch_for_close();
  const std::size_t piece = 64 << 10;
  const std::size_t pieces = 64;  // 4 MiB
  for (std::size_t i = 0; i < pieces; ++i) {
    down->queue_body(std::string(piece, static_cast<char>('a' + i % 26)));
    down->flush();
    settle(io);
  }
  settle(io);
  const std::size_t framed = pieces * (piece + std::string_view("10000\r\n\r\n").size());
  EXPECT_TRUE(down->writing());
  EXPECT_GT(down->backlog(), 2u << 20);  // the sockets hold far less than 4 MiB
  EXPECT_LE(down->backlog(), framed);
  EXPECT_EQ(down->backlog() + down->bytes_out(), framed);  // every byte is either taken or waiting
  EXPECT_EQ(total_out, down->bytes_out());
  EXPECT_FALSE(down->write_failed());
  EXPECT_EQ(listener.calls, 0);

  client.reset();
  ASSERT_TRUE(run_until(io, [&] { return down->write_failed(); }));
  bool drained = false;
  spawn(io, down->drain(), drained);
  ASSERT_TRUE(run_until(io, [&] { return drained; }));
  EXPECT_FALSE(down->writing());
  EXPECT_EQ(down->backlog(), 0u);
  EXPECT_TRUE(down->client_gone());
  settle(io);
  EXPECT_EQ(listener.calls, 1);
  // More bytes for a client that is gone are dropped.
  down->queue_body("late");
  down->flush();
  EXPECT_EQ(down->backlog(), 0u);
}

TEST_F(HttpDownstream, WriteAllToAResetClientFails) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  client.reset();
  std::optional<bool> ok;
  for (int i = 0; i < 50; ++i) {  // the first write may still be taken by the socket
    ok = write_all(std::string(64 << 10, 'x'));
    ASSERT_TRUE(ok.has_value());
    if (!*ok) break;
  }
  EXPECT_EQ(ok, false);
  EXPECT_TRUE(down->write_failed());
  EXPECT_TRUE(down->client_gone());
}

TEST_F(HttpDownstream, SendAndSendBodyFrameLikeQueueAndFlush) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  const std::string h = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  down->send(h);
  down->send_body("hello");
  down->send_body(std::string(300, 'x'));
  down->queue_end();
  down->flush();
  const std::string want = h + "5\r\nhello\r\n12c\r\n" + std::string(300, 'x') + "\r\n0\r\n\r\n";
  ASSERT_TRUE(receive(want.size()));
  settle(io);
  client.read_available();
  EXPECT_EQ(client.received, want);
  EXPECT_EQ(down->bytes_out(), want.size());
  EXPECT_EQ(total_out, want.size());
  EXPECT_TRUE(down->queue_empty());
  EXPECT_EQ(down->backlog(), 0u);
}

TEST_F(HttpDownstream, SendBodyIsRawForHttp10) {
  start();
  client.send("GET / HTTP/1.0\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  down->send("HTTP/1.1 200 OK\r\n\r\n");
  down->send_body("hello ");
  down->send_body("world");
  const std::string want = "HTTP/1.1 200 OK\r\n\r\nhello world";
  ASSERT_TRUE(receive(want.size()));
  EXPECT_EQ(client.received, want);
  EXPECT_EQ(down->bytes_out(), want.size());
}

// send()/send_body() write at once when they can and hand the rest to the
// write loop; mixed with queue_body() and with a client that reads a little
// at a time, every byte still arrives once, in order.
TEST_F(HttpDownstream, SendBodyKeepsOrderThroughTheWriteLoop) {
  start(/*client_rcvbuf=*/4096, /*server_sndbuf=*/4096);
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  std::string want = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  down->send(want);
  for (int i = 0; i < 300; ++i) {
    std::string piece(static_cast<std::size_t>(1 + (i * 997) % 9000), static_cast<char>('A' + i % 26));
    piece += std::to_string(i);  // every piece distinct
    char hex[24];
    std::snprintf(hex, sizeof hex, "%zx", piece.size());
    want += std::string(hex) + "\r\n" + piece + "\r\n";
    if (i % 3 == 0) {
      down->queue_body(piece);
      down->flush();
    } else {
      down->send_body(piece);
    }
    if (i % 7 == 0) {  // the client takes a little now and then
      settle(io);
      client.read_available();
    }
  }
  down->queue_end();
  down->flush();
  want += "0\r\n\r\n";
  EXPECT_EQ(down->backlog() + down->bytes_out(), want.size());  // every byte taken or waiting
  ASSERT_TRUE(receive(want.size()));
  bool drained = false;
  spawn(io, down->drain(), drained);
  ASSERT_TRUE(run_until(io, [&] { return drained; }));
  settle(io);
  client.read_available();
  EXPECT_EQ(client.received.size(), want.size());
  EXPECT_TRUE(client.received == want) << "the bytes arrived out of order or changed";
  EXPECT_EQ(down->bytes_out(), want.size());
  EXPECT_EQ(down->backlog(), 0u);
}

// The write loop's last write completes and finds more queued meanwhile,
// which the socket then takes at once: a drain() parked on the loop wakes
// (it stayed parked, and the write deadline armed, until write_timeout: the
// stream's end and its log line waited, or the deadline cut a live stream).
TEST_F(HttpDownstream, ADrainParkedOnTheWriteLoopWakesWhenTheLastBytesGoOutAtOnce) {
  sc.write_timeout = std::chrono::milliseconds(30'000);
  start(/*client_rcvbuf=*/4096, /*server_sndbuf=*/4096);
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  const std::string big(1 << 20, 'x');
  down->send_body(big);  // more than the sockets hold: the write loop takes the rest
  ASSERT_TRUE(down->writing());
  down->send_body("tail");  // queued behind the loop's write
  down->queue_end();
  down->flush();
  bool drained = false;
  spawn(io, down->drain(), drained);
  settle(io);
  ASSERT_FALSE(drained);
  const std::string want_tail = "4\r\ntail\r\n0\r\n\r\n";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(run_until(
      io,
      [&] {
        client.read_available();
        return drained;
      },
      5s))
      << "drain() still parked after every byte was taken";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  client.read_available();
  EXPECT_TRUE(client.received.ends_with(want_tail));
  EXPECT_FALSE(down->writing());
  EXPECT_FALSE(down->client_gone());
  EXPECT_EQ(down->backlog(), 0u);
}

// A client that stops reading after the kernel took what Weir wrote (its
// send buffer autotunes to MiBs): no write of Weir's waits, and nothing more
// is written (an upstream gone quiet), yet server.write_timeout cuts it off
// (never before it passed), and the listener is told, as for a client that
// left. It was cut only at a later write (never, behind a silent upstream).
TEST_F(HttpDownstream, AClientThatStopsReadingIsCutAtWriteTimeoutThoughNothingMoreIsWritten) {
  sc.write_timeout = std::chrono::milliseconds(400);
  start(/*client_rcvbuf=*/4096);
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  down->watch_for_close();
  down->send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  down->send_body(std::string(256 << 10, 'x'));
  ASSERT_TRUE(run_until(io, [&] { return down->client_gone(); }))
      << "not cut off; " << down->backlog() << " bytes queued, writing " << down->writing();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, sc.write_timeout);
  EXPECT_TRUE(down->timed_out());
  settle(io);
  EXPECT_EQ(listener.calls, 1);
}

// The watch's other side: a client that reads what it is sent is never cut,
// though the stream outlasts write_timeout many times, bytes sit
// unacknowledged between its reads, and it then waits on a silence (nothing
// written) longer than write_timeout.
TEST_F(HttpDownstream, AClientThatReadsIsNotCutThoughTheStreamOutlastsWriteTimeout) {
  sc.write_timeout = std::chrono::milliseconds(300);
  start(/*client_rcvbuf=*/4096);
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  down->watch_for_close();
  std::size_t sent = 0;
  auto read_for = [&](std::chrono::milliseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    run_until(io, [&] {
      client.read_available();
      return std::chrono::steady_clock::now() >= until;
    });
  };
  for (int i = 0; i < 12; ++i) {
    const std::string piece(64 << 10, static_cast<char>('a' + i));
    down->send(piece);
    sent += piece.size();
    read_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(receive(sent));
  read_for(std::chrono::milliseconds(1000));  // silence: the watch ends, nothing is cut
  EXPECT_EQ(client.received.size(), sent);
  EXPECT_FALSE(down->client_gone());
  EXPECT_FALSE(down->timed_out());
  EXPECT_EQ(listener.calls, 0);
}

TEST_F(HttpDownstream, SendBodyToAClientThatResetIsDropped) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->begin_request();
  down->watch_for_close();
  client.reset();
  ASSERT_TRUE(run_until(io, [&] { return down->client_gone(); }));
  for (int i = 0; i < 50 && !down->write_failed(); ++i) {
    down->send_body(std::string(64 << 10, 'x'));
    bool drained = false;
    spawn(io, down->drain(), drained);
    run_until(io, [&] { return drained; });
  }
  EXPECT_TRUE(down->write_failed());
  down->send_body("late");
  down->send("late");
  EXPECT_EQ(down->backlog(), 0u);
  settle(io);
  EXPECT_EQ(listener.calls, 1);
}

TEST_F(HttpDownstream, WatchForCloseReleasingTheBufferStillReadsTheNextRequest) {
  start();
  client.send(kGet);
  ASSERT_EQ(head(), Head::request);
  down->watch_for_close(/*release_buffer=*/true);
  settle(io);
  const std::string next = "GET /next HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(3000, 'p') + "\r\n\r\n";
  client.send(next);
  ASSERT_EQ(head(false), Head::request);
  EXPECT_EQ(down->request().target(), "/next");
  EXPECT_EQ(down->request()["X-Pad"].size(), 3000u);
  // With a pipelined request already buffered, nothing is released or lost.
  client.send(std::string(kGet) + "GET /third HTTP/1.1\r\nHost: x\r\n\r\n");
  down->watch_for_close(true);
  ASSERT_EQ(head(false), Head::request);
  EXPECT_EQ(down->request().target(), "/v1/models");
  down->watch_for_close(true);
  settle(io);
  ASSERT_EQ(head(false), Head::request);
  EXPECT_EQ(down->request().target(), "/third");
  // And the close is still noticed.
  down->watch_for_close(true);
  settle(io);
  client.sock.close();
  ASSERT_TRUE(run_until(io, [&] { return listener.calls == 1; }));
}

// --- closing ---

TEST_F(HttpDownstream, LingeringCloseSendsEofAndReadsWhatTheClientStillSends) {
  sc.max_body_bytes = 10;
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n");
  ASSERT_EQ(head(), Head::request);
  ASSERT_EQ(body(), false);
  const std::string answer = "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(write_all(answer), true);
  bool lingered = false;
  spawn(io, down->lingering_close(), lingered);
  // The client gets the answer, then EOF, while it may still send its body.
  ASSERT_TRUE(run_until(io, [&] {
    client.read_available();
    return client.ec == asio::error::eof;
  }));
  EXPECT_EQ(client.received, answer);
  EXPECT_FALSE(lingered);
  client.send(std::string(100, 'b'));
  settle(io);
  client.sock.close();
  ASSERT_TRUE(run_until(io, [&] { return lingered; }));
}

TEST_F(HttpDownstream, ForceCloseEndsAReadInProgress) {
  start();
  client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n01234");
  ASSERT_EQ(head(), Head::request);
  std::optional<bool> r;
  spawn(io, down->read_body(), r);
  settle(io);
  ASSERT_FALSE(r.has_value());
  down->force_close();
  ASSERT_TRUE(run_until(io, [&] { return r.has_value(); }));
  EXPECT_FALSE(*r);
  EXPECT_TRUE(down->closed());
  EXPECT_EQ(head(false), Head::closed);
}

}  // namespace
}  // namespace weir::http
