// http::Exchange against a scripted upstream: the test thread accepts the
// exchange's real loopback connection and writes raw response bytes on it,
// in pieces, between runs of the exchange's io_context. Every body framing
// (Content-Length, chunked, close-delimited, none), chunk framing split at
// every byte position, bodies larger than the caller's buffer, every
// failure kind, and when the connection may go back to the pool. Bodies are
// compared byte for byte with what the upstream framed.
#include "http/exchange.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "alloc_counter.hpp"
#include "io_test_util.hpp"

namespace weir::http {
namespace {

namespace bh = boost::beast::http;
using namespace std::chrono_literals;
using test::run_until;
using test::settle;
using test::spawn;
// A plain TCP connection (no TLS client): outlives the coroutines that take it by reference.
const http::TlsTarget kPlain{};

constexpr std::string_view kRequestHead = "POST /v1/completions HTTP/1.1\r\nHost: u:8000\r\nContent-Length: 2\r\n\r\n";
constexpr std::string_view kChunkedHead =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

// Frames `body` as chunks of the given sizes (cycled), with a chunk
// extension on every third one, as a server may.
std::string chunked(std::string_view body, const std::vector<std::size_t>& sizes) {
  std::string out;
  std::size_t i = 0, k = 0;
  while (i < body.size()) {
    const std::size_t n = std::min(sizes[k % sizes.size()], body.size() - i);
    char hex[24];
    std::snprintf(hex, sizeof hex, "%zx", n);
    out += hex;
    if (k % 3 == 2) out += ";ext=\"v\"";
    out += "\r\n";
    out.append(body.substr(i, n));
    out += "\r\n";
    i += n;
    ++k;
  }
  out += "0\r\n\r\n";
  return out;
}

// `n` bytes of every value, CR and LF included.
std::string pattern(std::size_t n, unsigned seed = 7) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::string content_length_response(std::string_view body, std::string_view extra_fields = {}) {
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + std::string(extra_fields) + "\r\n" + std::string(body);
}

class HttpExchange : public ::testing::Test {
 protected:
  asio::io_context io;
  test::Peer up;  // the upstream's side of the connection
  std::optional<asio::ip::tcp::acceptor> acc;
  std::vector<char> scratch = std::vector<char>(16u << 10);  // the worker's receive buffer
  std::optional<Exchange> ex;
  UpstreamConnection* conn = nullptr;  // the exchange's connection, while it holds it

  // What one start() and its reads produced.
  struct Run {
    std::optional<UpstreamFailure> started;  // start()'s result
    std::string body;                        // every body byte read, in order
    UpstreamFailure failure = UpstreamFailure::none;
    bool end = false;
    bool finished = false;  // start() failed, or the read loop returned (end or failure)
    int reads = 0;
    std::size_t max_read = 0;
  };
  Run run;
  bool running = false;  // a begin() coroutine is alive
  UpstreamExchange::Request req;
  std::string req_body = "{}";
  std::vector<char> into;

  void SetUp() override {
    acc.emplace(up.io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    ex.emplace(io.get_executor(), std::span<char>(scratch));
    connect_fresh();
  }

  void TearDown() override {
    if (ex && running) ex->cancel();
    run_until(
        io, [&] { return !running; }, 2s);
    settle(io);
  }

  // A new connection (connected as the worker does, http::connect) for the
  // exchange, accepted as `up`.
  void connect_fresh() {
    auto c = std::make_unique<UpstreamConnection>(io.get_executor());
    std::optional<UpstreamFailure> f;
    const tcp::endpoint ep = acc->local_endpoint();  // outlives the coroutine (it takes a reference)
    spawn(io, http::connect(*c, ep, kPlain, 5s), f);
    ASSERT_TRUE(run_until(io, [&] { return f.has_value(); }));
    ASSERT_EQ(*f, UpstreamFailure::none);
    accept_up();
    conn = c.get();
    ex->use(std::move(c));
  }
  void accept_up() {
    boost::system::error_code ignored;
    up.sock.close(ignored);
    up.ec = {};
    up.received.clear();
    up.sock = acc->accept();
  }

  // Starts the exchange (sends the request, reads the head), then reads the
  // body in `into_size`-byte pieces until it ends or fails (or after
  // `max_reads` reads): in the background, while the test writes the response.
  int max_reads = 1 << 30;
  void begin(std::size_t into_size = 4096, bool head_request = false, std::chrono::milliseconds first_byte = 10s,
             std::chrono::milliseconds idle = 10s) {
    ASSERT_FALSE(running);
    run = {};
    req = UpstreamExchange::Request{
        .head = kRequestHead, .body = req_body, .head_request = head_request, .first_byte = first_byte, .idle = idle};
    into.assign(into_size, '\0');
    running = true;
    asio::co_spawn(
        io.get_executor(),
        [this]() -> core::Task<void> {
          run.started = co_await ex->start(req);
          if (*run.started == UpstreamFailure::none) {
            for (;;) {
              const BodyRead r = co_await ex->read(std::span<char>(into));
              ++run.reads;
              run.max_read = std::max(run.max_read, r.bytes);
              run.body.append(into.data(), r.bytes);
              if (r.failure != UpstreamFailure::none) {
                run.failure = r.failure;
                break;
              }
              if (r.end) {
                run.end = true;
                break;
              }
              if (run.reads >= max_reads) break;
            }
          }
          run.finished = true;
          running = false;
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }

  // Writes `bytes` as the upstream, then lets the exchange take them: runs
  // its io_context until it waits again with its socket emptied (so the
  // next write arrives as a separate recv), or it finished.
  void upstream_writes(std::string_view bytes) {
    up.send(bytes);
    pump();
  }
  void pump() {
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    for (;;) {
      settle(io);
      if (run.finished || !conn || !conn->is_open()) return;
      boost::system::error_code ec;
      if (conn->socket().available(ec) == 0 || ec) return;
      if (std::chrono::steady_clock::now() >= deadline) return;
      io.restart();
      io.run_for(1ms);
    }
  }
  // Writes all of `bytes` without blocking, however slowly the exchange reads.
  void feed(std::string_view bytes) {
    up.sock.non_blocking(true);
    std::size_t sent = 0;
    ASSERT_TRUE(run_until(
        io,
        [&] {
          boost::system::error_code ec;
          if (sent < bytes.size()) {
            sent += up.sock.write_some(asio::buffer(bytes.data() + sent, bytes.size() - sent), ec);
            if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
              ADD_FAILURE() << "upstream write: " << ec.message();
              return true;
            }
          }
          return sent == bytes.size() || run.finished;
        },
        60s));
    up.sock.non_blocking(false);
  }
  bool finish() {
    return run_until(io, [&] { return run.finished; });
  }

  // The bytes the upstream received (the requests the exchange sent).
  std::string request_seen() {
    up.read_available();
    return up.received;
  }

  // Checks a complete, successful run against `body`.
  void expect_body(std::string_view body) {
    ASSERT_TRUE(run.started.has_value());
    EXPECT_EQ(*run.started, UpstreamFailure::none);
    EXPECT_TRUE(run.end);
    EXPECT_EQ(run.failure, UpstreamFailure::none);
    EXPECT_EQ(run.body.size(), body.size());
    EXPECT_TRUE(run.body == body) << "the body differs from what the upstream sent";
    EXPECT_LE(run.max_read, into.size());
    EXPECT_TRUE(ex->done());
  }

  // release(), forgetting `conn` (the exchange no longer holds it).
  std::unique_ptr<UpstreamConnection> release() {
    conn = nullptr;
    return ex->release();
  }
};

// --- framings ---

TEST_F(HttpExchange, ContentLengthBody) {
  begin();
  const std::string head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n";
  upstream_writes(head + "hello world");
  ASSERT_TRUE(finish());
  expect_body("hello world");
  EXPECT_EQ(ex->head().result_int(), 200);
  EXPECT_EQ(ex->head()[bh::field::content_type], "application/json");
  EXPECT_GE(ex->upstream_bytes(), head.size());  // the head, and body bytes that came with it
  EXPECT_EQ(request_seen(), std::string(kRequestHead) + "{}");
  auto c = release();
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->is_open());
}

TEST_F(HttpExchange, ContentLengthBodyInPieces) {
  const std::string body = pattern(5000);
  const std::string resp = content_length_response(body);
  begin(1000);
  upstream_writes(resp.substr(0, 30));  // inside the head
  upstream_writes(resp.substr(30, 100));
  upstream_writes(resp.substr(130, 2000));
  upstream_writes(resp.substr(2130));
  ASSERT_TRUE(finish());
  expect_body(body);
  EXPECT_TRUE(release());
}

TEST_F(HttpExchange, ChunkedBody) {
  const std::string body = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
  begin();
  upstream_writes(std::string(kChunkedHead) + chunked(body, {20, 3, 17, 100}));
  ASSERT_TRUE(finish());
  expect_body(body);
  EXPECT_EQ(ex->head()[bh::field::content_type], "text/event-stream");
  EXPECT_TRUE(release());
}

TEST_F(HttpExchange, ChunkedBodyWithTrailers) {
  begin();
  upstream_writes(std::string(kChunkedHead) + "5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n");
  ASSERT_TRUE(finish());
  expect_body("hello");
  EXPECT_TRUE(release());
}

// A trailer's Connection: close ends the connection's use, as the head's does (Beast read it there too).
TEST_F(HttpExchange, ATrailerConnectionCloseIsNotReused) {
  begin();
  upstream_writes(std::string(kChunkedHead) + "5\r\nhello\r\n0\r\nConnection: close\r\n\r\n");
  ASSERT_TRUE(finish());
  expect_body("hello");
  EXPECT_FALSE(release());
}

// Every split of a small chunked response into two writes (the head, a
// chunk size, its CRLF or the last chunk cut anywhere), for buffers of 1
// byte, a few bytes and more than the whole body.
class HttpExchangeSplit : public HttpExchange, public ::testing::WithParamInterface<std::size_t> {};

TEST_P(HttpExchangeSplit, ChunkedResponseSplitAtEveryBytePosition) {
  const std::string body = "data: {\"a\":1}\n\ndata: [DONE]\n\n\r\n0\r\n";  // framing look-alikes in the data
  const std::string resp = std::string(kChunkedHead) + chunked(body, {1, 16, 10, 3});
  for (std::size_t k = 1; k < resp.size(); ++k) {
    SCOPED_TRACE("split at " + std::to_string(k) + " of " + std::to_string(resp.size()));
    if (k > 1) connect_fresh();
    begin(GetParam());
    upstream_writes(resp.substr(0, k));
    EXPECT_FALSE(run.finished);
    upstream_writes(resp.substr(k));
    ASSERT_TRUE(finish());
    expect_body(body);
    ASSERT_TRUE(release()) << "a complete keep-alive response";
    if (HasFailure()) break;
  }
}

TEST_P(HttpExchangeSplit, ChunkedResponseOneByteAtATime) {
  const std::string body = pattern(300);
  const std::string resp = std::string(kChunkedHead) + chunked(body, {1, 0x1f, 0x100, 2});
  begin(GetParam());
  for (char c : resp) upstream_writes(std::string_view(&c, 1));
  ASSERT_TRUE(finish());
  expect_body(body);
  EXPECT_TRUE(release());
}

TEST_P(HttpExchangeSplit, ChunkedResponseAtRandomSplits) {
  const std::string body = pattern(700, 3);
  const std::string resp = std::string(kChunkedHead) + chunked(body, {5, 0x80, 1, 0x11, 300});
  std::mt19937 rng(11);
  for (int round = 0; round < 40; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    if (round > 0) connect_fresh();
    begin(GetParam());
    std::size_t at = 0;
    while (at < resp.size()) {
      const std::size_t n = std::min<std::size_t>(1 + rng() % 40, resp.size() - at);
      upstream_writes(resp.substr(at, n));
      at += n;
    }
    ASSERT_TRUE(finish());
    expect_body(body);
    ASSERT_TRUE(release());
    if (HasFailure()) break;
  }
}

INSTANTIATE_TEST_SUITE_P(IntoSizes, HttpExchangeSplit, ::testing::Values(1, 7, 4096),
                         [](const auto& info) { return "into" + std::to_string(info.param); });

TEST_F(HttpExchange, CloseDelimitedBody) {
  const std::string body = pattern(3000);
  begin(1024);
  upstream_writes("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n" + body.substr(0, 1000));
  EXPECT_FALSE(run.finished);
  upstream_writes(body.substr(1000));
  EXPECT_FALSE(run.finished);  // no end until the close
  up.sock.shutdown(asio::ip::tcp::socket::shutdown_send);
  ASSERT_TRUE(finish());
  expect_body(body);
  EXPECT_FALSE(release()) << "a close-delimited response leaves nothing to reuse";
}

TEST_F(HttpExchange, Http10ResponseWithoutLengthIsCloseDelimited) {
  begin();
  upstream_writes("HTTP/1.0 200 OK\r\n\r\nsome bytes");
  up.sock.shutdown(asio::ip::tcp::socket::shutdown_send);  // FIN (a close() with the request unread would be an RST)
  ASSERT_TRUE(finish());
  expect_body("some bytes");
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, ContentLengthBodyLargerThanIntoComesBackOverManyReads) {
  const std::string body = pattern(1u << 20);
  begin(1000);
  feed(content_length_response(body));
  ASSERT_TRUE(finish());
  expect_body(body);
  EXPECT_GE(run.reads, static_cast<int>(body.size() / 1000));
  EXPECT_TRUE(release());
}

TEST_F(HttpExchange, ChunkedBodyLargerThanIntoComesBackOverManyReads) {
  const std::string body = pattern(1u << 20, 5);
  // Chunks smaller, equal to and larger than the scratch buffer and `into`.
  const std::string resp =
      std::string(kChunkedHead) + chunked(body, {1, 100, 999, 1000, 1001, 4096, 16384, 16385, 70000, 7});
  for (std::size_t into_size : {std::size_t{1000}, std::size_t{20000}}) {
    SCOPED_TRACE("into " + std::to_string(into_size));
    if (into_size != 1000) connect_fresh();
    begin(into_size);
    feed(resp);
    ASSERT_TRUE(finish());
    expect_body(body);
    EXPECT_GE(run.reads, static_cast<int>(body.size() / into_size));
    EXPECT_TRUE(release());
  }
}

TEST_F(HttpExchange, OneByteIntoOverAChunkedBody) {
  const std::string body = pattern(64u << 10, 9);
  begin(1);
  feed(std::string(kChunkedHead) + chunked(body, {8192, 3, 20000}));
  ASSERT_TRUE(finish());
  expect_body(body);
  EXPECT_GE(run.reads, static_cast<int>(body.size()));
}

TEST_F(HttpExchange, ShrinkKeepsTheStatusAndTheBodyIntact) {
  const std::string body = pattern(5000, 21);
  const std::string resp = std::string(kChunkedHead) + chunked(body, {1, 700, 3, 2000});
  for (std::size_t k : {std::size_t{90}, std::size_t{200}, std::size_t{1500}}) {  // cuts in and after chunk headers
    SCOPED_TRACE("split at " + std::to_string(k));
    if (k != 90) connect_fresh();
    begin(256);
    upstream_writes(resp.substr(0, kChunkedHead.size()));
    ASSERT_TRUE(run.started.has_value());
    ex->shrink();  // the head was forwarded
    EXPECT_EQ(ex->head().result_int(), 200);
    upstream_writes(resp.substr(kChunkedHead.size(), k));
    upstream_writes(resp.substr(kChunkedHead.size() + k));
    ASSERT_TRUE(finish());
    expect_body(body);
    EXPECT_TRUE(release());
    if (HasFailure()) break;
  }
}

// --- no body ---

TEST_F(HttpExchange, HeadRequestHasNoBodyAndTheConnectionIsReused) {
  begin(4096, /*head_request=*/true);
  upstream_writes("HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n");
  ASSERT_TRUE(finish());
  expect_body("");
  auto c = release();
  ASSERT_TRUE(c);
  // The same connection serves the next exchange.
  conn = c.get();
  ex->use(std::move(c));
  begin();
  upstream_writes(content_length_response("again"));
  ASSERT_TRUE(finish());
  expect_body("again");
  EXPECT_EQ(request_seen(), std::string(kRequestHead) + "{}" + std::string(kRequestHead) + "{}");
}

TEST_F(HttpExchange, NoContentAndNotModifiedHaveNoBody) {
  for (std::string_view resp :
       {"HTTP/1.1 204 No Content\r\n\r\n", "HTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\n\r\n"}) {
    SCOPED_TRACE(resp);
    if (resp[9] == '3') connect_fresh();
    begin();
    upstream_writes(resp);
    ASSERT_TRUE(finish());
    expect_body("");
    EXPECT_TRUE(release());
  }
}

// --- failures ---

TEST_F(HttpExchange, UpstreamResetMidBodyIsReset) {
  const std::string body = pattern(100);
  begin();
  upstream_writes(content_length_response(body).substr(0, content_length_response(body).size() - 90));
  EXPECT_FALSE(run.finished);
  up.reset();
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.failure, UpstreamFailure::reset);
  EXPECT_EQ(run.body, body.substr(0, 10));
  EXPECT_FALSE(run.end);
  EXPECT_FALSE(ex->done());
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, UpstreamClosingEarlyIsReset) {
  for (const std::string& partial :
       {content_length_response("0123456789").substr(0, content_length_response("0123456789").size() - 5),
        std::string(kChunkedHead) + "a\r\n01234"}) {
    SCOPED_TRACE(partial);
    if (partial.find("chunked") != std::string::npos) connect_fresh();
    begin();
    upstream_writes(partial);
    up.sock.shutdown(asio::ip::tcp::socket::shutdown_send);  // FIN before the body's end
    ASSERT_TRUE(finish());
    EXPECT_EQ(run.failure, UpstreamFailure::reset);
    EXPECT_FALSE(release());
  }
}

TEST_F(HttpExchange, GarbageChunkSizeIsProtocol) {
  begin();
  upstream_writes(std::string(kChunkedHead) + "5\r\nhello\r\nzz\r\nworld\r\n0\r\n\r\n");
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.failure, UpstreamFailure::protocol);
  EXPECT_EQ(run.body, "hello");  // what came before the garbage
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, ChunkHeaderThatNeverEndsIsProtocolNotAnUnboundedWait) {
  begin();
  upstream_writes(kChunkedHead);
  up.send("5;" + std::string(40000, 'e'));  // a chunk extension with no end
  pump();
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.failure, UpstreamFailure::protocol);
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, UnparsableHeadIsProtocol) {
  begin();
  upstream_writes("SSH-2.0-OpenSSH_9.2\r\n\r\n");
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.started, UpstreamFailure::protocol);
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, IdleTimeoutWhileReadingIsTimeout) {
  begin(4096, false, 10s, /*idle=*/200ms);
  upstream_writes(std::string(kChunkedHead) + "5\r\nhello\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.failure, UpstreamFailure::timeout);
  EXPECT_EQ(run.body, "hello");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 8s);
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, FirstByteTimeoutIsTimeout) {
  begin(4096, false, /*first_byte=*/200ms);
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.started, UpstreamFailure::timeout);
  EXPECT_EQ(ex->upstream_bytes(), 0u);
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, ResetBeforeAnyAnswerIsResetWithNoUpstreamBytes) {
  begin();
  settle(io);
  up.reset();
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.started, UpstreamFailure::reset);
  EXPECT_EQ(ex->upstream_bytes(), 0u);
}

TEST_F(HttpExchange, APartialHeadBeforeTheResetCountsAsUpstreamBytes) {
  begin();
  upstream_writes("HTTP/1.1 200 OK\r\nContent-");
  up.reset();
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.started, UpstreamFailure::reset);
  EXPECT_GT(ex->upstream_bytes(), 0u);
}

// Attempts::on_exchange_failure re-sends a request on a reused connection
// that failed with 0 upstream_bytes() (the upstream "answered nothing").
// An upstream that sent part of its status line before the reset did
// answer: it read the request, so it must not be sent again. (Regression:
// upstream_bytes() once counted only the bytes Beast's parser consumed,
// none of an incomplete status line.)
TEST_F(HttpExchange, APartialStatusLineBeforeTheResetCountsAsUpstreamBytes) {
  begin();
  upstream_writes("HTTP/1.1 20");
  up.reset();
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.started, UpstreamFailure::reset);
  EXPECT_GT(ex->upstream_bytes(), 0u);
}

TEST_F(HttpExchange, CancelWhileAReadWaitsIsCancelled) {
  begin();
  upstream_writes(std::string(kChunkedHead) + "5\r\nhello\r\n");
  settle(io);
  ASSERT_FALSE(run.finished);
  ex->cancel();
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.failure, UpstreamFailure::cancelled);
  EXPECT_EQ(run.body, "hello");
  EXPECT_FALSE(release());
  // The upstream sees the connection close (and so stops generating).
  ASSERT_TRUE(run_until(io, [&] { return !up.read_available(); }));
}

TEST_F(HttpExchange, CancelWhileWaitingForTheHeadIsCancelled) {
  begin();
  settle(io);
  ASSERT_FALSE(run.finished);
  ex->cancel();
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.started, UpstreamFailure::cancelled);
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, FreshConnectThroughTheExchange) {
  // connect() opens its own connection (replacing the one SetUp gave it).
  std::optional<UpstreamFailure> f;
  conn = nullptr;
  const tcp::endpoint ep = acc->local_endpoint();
  spawn(io, ex->connect(ep, kPlain, 5s), f);
  ASSERT_TRUE(run_until(io, [&] { return f.has_value(); }));
  ASSERT_EQ(*f, UpstreamFailure::none);
  accept_up();
  begin();
  up.send(content_length_response("fresh"));
  ASSERT_TRUE(finish());
  expect_body("fresh");
  EXPECT_TRUE(release());
}

TEST_F(HttpExchange, ConnectToNobodyIsConnectRefused) {
  asio::ip::tcp::acceptor closed(up.io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const tcp::endpoint ep(closed.local_endpoint());
  closed.close();
  std::optional<UpstreamFailure> f;
  conn = nullptr;
  spawn(io, ex->connect(ep, kPlain, 5s), f);
  ASSERT_TRUE(run_until(io, [&] { return f.has_value(); }));
  EXPECT_EQ(*f, UpstreamFailure::connect_refused);
}

// --- release ---

TEST_F(HttpExchange, ReleaseIsNullBeforeTheResponseIsComplete) {
  // (release() is called once no read is pending: after the response, or after cancel().)
  max_reads = 1;
  begin();
  const std::string resp = content_length_response("0123456789");
  upstream_writes(resp.substr(0, resp.size() - 5));
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.body, "01234");
  EXPECT_FALSE(run.end);
  EXPECT_FALSE(ex->done());
  EXPECT_FALSE(release());
  // It was closed, not kept: the upstream sees the end.
  ASSERT_TRUE(run_until(io, [&] { return !up.read_available(); }));
}

TEST_F(HttpExchange, ReleaseIsNullAfterConnectionClose) {
  begin();
  upstream_writes(content_length_response("done", "Connection: close\r\n"));
  ASSERT_TRUE(finish());
  expect_body("done");
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, ReleaseIsNullAfterAnHttp10ResponseWithoutKeepAlive) {
  begin();
  upstream_writes("HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\ndone");
  ASSERT_TRUE(finish());
  expect_body("done");
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, ReleaseIsNullAfterAFailure) {
  begin();
  upstream_writes(std::string(kChunkedHead) + "zz\r\n");
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.failure, UpstreamFailure::protocol);
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, ReleasedConnectionHasNoDeadlineLeft) {
  begin(4096, false, 10s, /*idle=*/100ms);
  upstream_writes(content_length_response("ok"));
  ASSERT_TRUE(finish());
  auto c = release();
  ASSERT_TRUE(c);
  // Idle in a pool for longer than the idle timeout: still open, not aborted.
  asio::steady_timer t(io, 400ms);
  bool waited = false;
  t.async_wait([&](auto) { waited = true; });
  ASSERT_TRUE(run_until(io, [&] { return waited; }));
  EXPECT_TRUE(c->is_open());
  EXPECT_EQ(c->aborted_for(), UpstreamFailure::none);
}

// Bytes after a complete response (a server that sent more than its
// Content-Length, or answered twice) mean the connection is out of step:
// the next request on it would read them as its response. ConnectionPool
// drops an idle connection holding unsolicited bytes it can see in the
// socket (take(), sweep()); bytes that arrived in the same recv as the end
// of the response are already out of it, so release() must refuse the
// connection. (Regression: they were dropped, or left in the buffer that
// ConnectionPool::put clears, and the connection was reused.)
TEST_F(HttpExchange, BytesBeyondTheResponseMakeTheConnectionUnreusable) {
  const std::string extra = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale";
  // In the segment of the head (parsed from the connection's buffer).
  begin();
  upstream_writes(content_length_response("ok") + extra);
  ASSERT_TRUE(finish());
  expect_body("ok");
  EXPECT_FALSE(release());
  // In the segment of the body's end (parsed from the scratch buffer).
  connect_fresh();
  begin();
  const std::string resp = content_length_response("0123456789");
  upstream_writes(resp.substr(0, resp.size() - 3));
  upstream_writes(resp.substr(resp.size() - 3) + extra);
  ASSERT_TRUE(finish());
  expect_body("0123456789");
  EXPECT_FALSE(release());
}

// RFC 9110 §15.2: a client (here, the proxy) must accept interim 1xx
// responses before the final one (a server may send 103 Early Hints
// unasked). (Regression: start() took the 103 as the response, done() and
// bodiless, and never read the final one.)
TEST_F(HttpExchange, InterimResponsesBeforeTheFinalOneAreSkipped) {
  begin();
  upstream_writes("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" +
                  content_length_response("ok"));
  ASSERT_TRUE(finish());
  EXPECT_EQ(ex->head().result_int(), 200);
  expect_body("ok");
}

// An upstream that sends interim heads without end (a flood of 103s: Weir
// read 11.5 million of them in 4 s) fails as one whose head is too large once
// they pass kMaxResponseHead in all (the 502 of an oversized head), not after
// the response timeout; the connection is not reused. (Regression: each head
// was checked on its own, their number unbounded.)
TEST_F(HttpExchange, InterimHeadsOverTheHeadLimitInAllFailAsAHeadTooLarge) {
  const std::string hint = "HTTP/1.1 103 Early Hints\r\n\r\n";
  std::string flood;
  while (flood.size() <= kMaxResponseHead) flood += hint;
  begin();
  feed(flood + content_length_response("ok"));
  ASSERT_TRUE(finish());
  EXPECT_EQ(run.started, UpstreamFailure::protocol);
  EXPECT_TRUE(ex->head_too_large());
  EXPECT_FALSE(release());
}

// Each head's status line may lack its space and reason ("HTTP/1.1 103\r\n"), the interim ones' too.
TEST_F(HttpExchange, InterimAndFinalStatusLinesWithoutAReasonAreRead) {
  begin();
  upstream_writes("HTTP/1.1 103\r\n\r\nHTTP/1.1 100\r\n\r\nHTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok");
  ASSERT_TRUE(finish());
  EXPECT_EQ(ex->head().result_int(), 200);
  expect_body("ok");
}

// Up to the limit in all, they are skipped as any interim response is.
TEST_F(HttpExchange, InterimHeadsWithinTheHeadLimitInAllAreSkipped) {
  const std::string hint = "HTTP/1.1 103 Early Hints\r\n\r\n";
  std::string flood;
  while (flood.size() + hint.size() <= kMaxResponseHead) flood += hint;
  begin();
  feed(flood + content_length_response("ok"));
  ASSERT_TRUE(finish());
  EXPECT_EQ(ex->head().result_int(), 200);
  EXPECT_FALSE(ex->head_too_large());
  expect_body("ok");
}

// The plain http:// path pays nothing for TLS (issue 12): a stream's reads
// on a plain connection allocate nothing in steady state.
TEST_F(HttpExchange, SteadyStateReadsOnAPlainConnectionDoNotAllocate) {
  if (!test::AllocationScope::available()) GTEST_SKIP() << "no counting operator new in this binary";
  const std::string event = "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n";
  const std::string framed = chunked(event, {event.size()});
  const std::string one = framed.substr(0, framed.size() - 5);  // without the last-chunk "0\r\n\r\n"
  begin();
  upstream_writes(kChunkedHead);
  for (int i = 0; i < 8; ++i) upstream_writes(one);  // warm-up: buffers and coroutine frames recycled
  std::size_t allocations = 0;
  {
    test::AllocationScope scope;
    for (int i = 0; i < 64; ++i) upstream_writes(one);
    allocations = scope.count();
  }
  upstream_writes("0\r\n\r\n");
  ASSERT_TRUE(finish());
  EXPECT_TRUE(run.end);
  EXPECT_EQ(run.body.size(), event.size() * 72);
  EXPECT_EQ(allocations, 0u);
}

// --- take_end: the body's end when it has already arrived, never a wait ---

TEST_F(HttpExchange, TakeEndReadsOnlyWhatHasArrived) {
  max_reads = 1;
  begin();
  upstream_writes(std::string(kChunkedHead) + "5\r\nhello\r\n");
  ASSERT_TRUE(finish());
  ASSERT_EQ(run.body, "hello");
  ASSERT_FALSE(run.end);
  std::vector<char> sink(4096);
  // Nothing more has arrived: false at once (no wait for the upstream).
  std::optional<bool> ended;
  spawn(io, ex->take_end(std::span<char>(sink)), ended);
  ASSERT_TRUE(run_until(
      io, [&] { return ended.has_value(); }, 1s));
  EXPECT_FALSE(*ended);
  EXPECT_FALSE(ex->done());
  // Bytes after it (events past [DONE]) and the last chunk arrive: taken and discarded, the body is done.
  up.send("6\r\n world\r\n0\r\n\r\n");
  ASSERT_TRUE(run_until(io, [&] {
    boost::system::error_code ec;
    return conn->socket().available(ec) >= 16;
  }));
  ended.reset();
  spawn(io, ex->take_end(std::span<char>(sink)), ended);
  ASSERT_TRUE(run_until(
      io, [&] { return ended.has_value(); }, 1s));
  EXPECT_TRUE(*ended);
  EXPECT_TRUE(ex->done());
  EXPECT_TRUE(release());  // a whole response: the connection can be pooled
}

// await_end's wait is bounded as a whole, not per read: a trailer section dripping a few bytes at a time
// (each within the grace) yields no body byte, and one read() would otherwise go on through all of it.
TEST_F(HttpExchange, AwaitEndIsBoundedAsAWholeAgainstADrippingTrailer) {
  max_reads = 1;
  begin();
  upstream_writes(std::string(kChunkedHead) + "5\r\nhello\r\n0\r\n");
  ASSERT_TRUE(finish());
  ASSERT_EQ(run.body, "hello");
  std::vector<char> sink(4096);
  std::optional<bool> ended;
  spawn(io, ex->await_end(std::span<char>(sink)), ended);
  // A trailer field a few bytes every 20 ms, for far longer than the grace (100 ms per wait, four waits):
  // the wait ends while the drip goes on.
  int sent = 0;
  for (; sent < 150 && !ended; ++sent) {
    up.send(sent == 0 ? "X-Drip: " : "ab");
    run_until(
        io, [&] { return ended.has_value(); }, 20ms);
  }
  ASSERT_TRUE(ended.has_value()) << "still waiting after " << sent << " pieces";
  EXPECT_FALSE(*ended);
  EXPECT_FALSE(release());
}

TEST_F(HttpExchange, TakeEndAfterAnUpstreamCloseIsFalseAndTheConnectionIsNotKept) {
  max_reads = 1;
  begin();
  upstream_writes(std::string(kChunkedHead) + "5\r\nhello\r\n");
  ASSERT_TRUE(finish());
  boost::system::error_code ignored;
  up.sock.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  std::vector<char> sink(4096);
  std::optional<bool> ended;
  // (Until the FIN is in, false for want of bytes; after it, false for a body cut short.)
  spawn(io, ex->take_end(std::span<char>(sink)), ended);
  ASSERT_TRUE(run_until(
      io, [&] { return ended.has_value(); }, 1s));
  EXPECT_FALSE(*ended);
  EXPECT_FALSE(ex->done());
  ex->cancel();
  EXPECT_FALSE(release());
}

}  // namespace
}  // namespace weir::http
