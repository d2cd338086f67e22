// http::fetch_text against a scripted server on loopback: the whole body of
// a Content-Length, chunked or close-delimited answer; 0 on a cut answer.
// http::KeptConnection (the trace exporter's POSTs): one connection kept
// across POSTs and opened again when the server closed it; status,
// Retry-After and body; the body limit, refusals and timeouts.
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "http/probe.hpp"
#include "io_test_util.hpp"

namespace {

using namespace weir;
namespace asio = boost::asio;

// Serves `answer` to the one request fetch_text sends, then closes (or, with
// `cut`, closes before the whole answer is out: the deadline must not matter).
std::optional<int> fetch(const std::string& answer, std::string& body, std::string* request = nullptr) {
  asio::io_context io, peer_io;
  asio::ip::tcp::acceptor acc(peer_io, {asio::ip::address_v4::loopback(), 0});
  acc.non_blocking(true);
  const http::ProbeRequest req{.addr = acc.local_endpoint(),
                               .host_header = "127.0.0.1:1",
                               .path = "/metrics",
                               .timeout = std::chrono::milliseconds(2000)};
  const std::size_t max_bytes = 1 << 20;
  std::optional<int> status;
  test::spawn(io, http::fetch_text(io.get_executor(), req, body, max_bytes), status);
  asio::ip::tcp::socket s(peer_io);
  EXPECT_TRUE(test::run_until(io, [&] {
    boost::system::error_code ec;
    acc.accept(s, ec);
    return !ec;
  }));
  std::string got;
  EXPECT_TRUE(test::run_until(io, [&] {
    s.non_blocking(true);
    char buf[4096];
    boost::system::error_code ec;
    const auto n = s.read_some(asio::buffer(buf), ec);
    if (!ec) got.append(buf, n);
    return got.find("\r\n\r\n") != std::string::npos;
  }));
  if (request) *request = got;
  s.non_blocking(false);
  asio::write(s, asio::buffer(answer));
  s.close();
  EXPECT_TRUE(test::run_until(io, [&] { return status.has_value(); }));
  return status;
}

TEST(FetchText, ReadsAContentLengthBodyAndSendsAPlainGet) {
  std::string body, request;
  const auto st =
      fetch("HTTP/1.1 200 OK\r\ncontent-length: 11\r\ncontent-type: text/plain\r\n\r\nhello world", body, &request);
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, 200);
  EXPECT_EQ(body, "hello world");
  EXPECT_TRUE(request.starts_with("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:1\r\n")) << request;
  EXPECT_NE(request.find("Connection: close\r\n"), std::string::npos);
}

TEST(FetchText, DecodesAChunkedBody) {
  std::string body;
  const auto st = fetch(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nvllm:\r\n19;ext=1\r\nnum_requests_running "
      "3.0\n\r\n0\r\n\r\n",
      body);
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, 200);
  EXPECT_EQ(body, "vllm:num_requests_running 3.0\n");
}

TEST(FetchText, ReadsAStatusLineWithoutAReasonPhrase) {
  // "HTTP/1.1 200\r\n" (no space, no reason: nginx, curl and Python read it; Beast refuses it): a vLLM
  // behind a minimal proxy, a JWKS host, a collector. The space is put back and the answer read.
  std::string body;
  EXPECT_EQ(fetch("HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok", body), 200);
  EXPECT_EQ(body, "ok");
  EXPECT_EQ(fetch("HTTP/1.1 404\r\ncontent-length: 0\r\n\r\n", body), 404);
  EXPECT_EQ(fetch("HTTP/1.1 20\r\ncontent-length: 0\r\n\r\n", body), 0);  // (not a status: still refused)
}

TEST(FetchText, ReportsTheStatusAndZeroForABrokenAnswer) {
  std::string body;
  EXPECT_EQ(fetch("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n", body), 503);
  EXPECT_EQ(fetch("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab", body), 0);  // cut in a chunk
  EXPECT_EQ(fetch("garbage", body), 0);
}

// Interim (1xx) heads before the answer are skipped (RFC 9110 §15.2), up to
// 8 KiB of them in all; past that the answer is malformed. (Regression: a 103
// was taken for the answer, status 103.)
TEST(FetchText, SkipsInterimHeadsBeforeTheAnswerWithinABound) {
  std::string body;
  EXPECT_EQ(fetch("HTTP/1.1 103 Early Hints\r\nLink: </k>; rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"
                  "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                  body),
            200);
  EXPECT_EQ(body, "ok");
  EXPECT_EQ(fetch("HTTP/1.1 103\r\n\r\nHTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok", body), 200);
  std::string flood;
  while (flood.size() <= 8 * 1024) flood += "HTTP/1.1 103 Early Hints\r\n\r\n";
  EXPECT_EQ(fetch(flood + "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", body), 0);
}

// An HTTP/1.1 server on loopback, in a thread: reads each request (its head
// and Content-Length body) and writes the next scripted answer; then, as
// scripted, closes the connection or keeps it; `silent`: never answers.
class PostServer {
 public:
  struct Answer {
    std::string text;
    bool close = false;
    bool silent = false;
  };
  explicit PostServer(std::vector<Answer> script)
      : script_(std::move(script)), acc_(io_, {asio::ip::address_v4::loopback(), 0}) {
    thread_ = std::thread([this] { serve(); });
  }
  ~PostServer() {
    stopping_ = true;
    asio::ip::tcp::socket s(io_);  // wakes the blocking accept
    boost::system::error_code ec;
    s.connect(acc_.local_endpoint(), ec);
    thread_.join();
  }
  asio::ip::tcp::endpoint endpoint() const { return acc_.local_endpoint(); }
  int connections() const { return connections_; }
  int closed() const { return closed_; }
  std::vector<std::string> requests() {
    std::lock_guard l(mu_);
    return requests_;
  }

 private:
  void serve() {
    std::size_t next = 0;
    while (!stopping_) {
      asio::ip::tcp::socket s(io_);
      boost::system::error_code ec;
      acc_.accept(s, ec);
      if (ec || stopping_) return;
      ++connections_;
      std::string in;
      while (read_request(s, in)) {
        const Answer a =
            next < script_.size() ? script_[next++] : Answer{"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"};
        if (a.silent) {
          while (read_request(s, in)) {
          }
          break;
        }
        asio::write(s, asio::buffer(a.text), ec);
        if (a.close || ec) break;
      }
      s.close(ec);
      ++closed_;
    }
  }
  // Reads one request into requests_; false when the client closed first.
  bool read_request(asio::ip::tcp::socket& s, std::string& in) {
    for (;;) {
      if (const auto end = in.find("\r\n\r\n"); end != std::string::npos) {
        std::size_t length = 0;
        if (const auto cl = in.find("Content-Length: "); cl != std::string::npos && cl < end)
          length = std::stoul(in.substr(cl + 16));
        if (in.size() >= end + 4 + length) {
          std::lock_guard l(mu_);
          requests_.push_back(in.substr(0, end + 4 + length));
          in.erase(0, end + 4 + length);
          return true;
        }
      }
      char buf[16384];
      boost::system::error_code ec;
      const std::size_t n = s.read_some(asio::buffer(buf), ec);
      if (ec) return false;
      in.append(buf, n);
    }
  }

  std::vector<Answer> script_;
  asio::io_context io_;
  asio::ip::tcp::acceptor acc_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0}, closed_{0};
  std::mutex mu_;
  std::vector<std::string> requests_;
};

http::PostAnswer post(asio::io_context& io, http::KeptConnection& c, const http::PostRequest& r) {
  std::optional<http::PostAnswer> a;
  test::spawn(io, c.post(r), a);
  EXPECT_TRUE(test::run_until(io, [&] { return a.has_value(); }));
  return a.value_or(http::PostAnswer{});
}

http::PostRequest otlp_post(std::string_view body) {
  return {.target = "/v1/traces",
          .host_header = "collector:4318",
          .content_type = "application/json",
          .header_lines = "User-Agent: weir/1\r\nx-api-key: k\r\n",
          .body = body,
          .timeout = std::chrono::milliseconds(2000)};
}

TEST(KeptConnection, PostsOnOneConnectionAndReadsStatusRetryAfterAndBody) {
  PostServer server({{"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{\"partialSuccess\":1}"},
                     {"HTTP/1.1 503 Unavailable\r\nRetry-After: 3\r\ncontent-length: 0\r\n\r\n"},
                     {"HTTP/1.1 429 Too Many\r\nRetry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n"
                      "transfer-encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n"},
                     {"HTTP/1.1 503 Unavailable\r\nRetry-After: 99999999999999999999\r\ncontent-length: 0\r\n\r\n"},
                     {"HTTP/1.1 503 Unavailable\r\nRetry-After: Fri, 31 Dec 9999 23:59:59 GMT\r\n"
                      "content-length: 0\r\n\r\n"},
                     {"HTTP/1.1 503 Unavailable\r\nRetry-After: soon\r\ncontent-length: 0\r\n\r\n"}});
  asio::io_context io;
  http::KeptConnection c(io.get_executor(), {.host = "127.0.0.1", .port = server.endpoint().port()});
  auto a = post(io, c, otlp_post("hello"));
  EXPECT_EQ(a.status, 200) << a.error;
  EXPECT_EQ(a.body, "{\"partialSuccess\":1}");
  EXPECT_EQ(a.retry_after.count(), 0);
  EXPECT_TRUE(c.connected());
  a = post(io, c, otlp_post("again"));
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(a.retry_after, std::chrono::seconds(3));
  a = post(io, c, otlp_post("third"));
  EXPECT_EQ(a.status, 429);
  EXPECT_EQ(a.retry_after.count(), 0);  // an HTTP date passed: no wait
  EXPECT_EQ(a.body, "no");
  // Too large to read is "very long", for the caller to cap (http/retry_after.hpp), not none; so is a date
  // far ahead. Junk is none.
  a = post(io, c, otlp_post("overflow"));
  EXPECT_GE(a.retry_after, std::chrono::hours(24 * 365));
  a = post(io, c, otlp_post("date"));
  EXPECT_GE(a.retry_after, std::chrono::hours(24 * 365));
  a = post(io, c, otlp_post("junk"));
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(a.retry_after.count(), 0);
  EXPECT_EQ(server.connections(), 1);
  const auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 6u);
  EXPECT_EQ(reqs[0],
            "POST /v1/traces HTTP/1.1\r\nHost: collector:4318\r\nContent-Type: application/json\r\n"
            "User-Agent: weir/1\r\nx-api-key: k\r\nContent-Length: 5\r\n\r\nhello");
}

// A 103 before the answer is skipped: the answer is the POST's, and the next
// POST reads its own. (Regression: the 103 was taken for the first answer,
// and the first's 200 then read as the second's.)
TEST(KeptConnection, SkipsAnInterimHeadBeforeTheAnswer) {
  PostServer server({{"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"},
                     {"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n"}});
  asio::io_context io;
  http::KeptConnection c(io.get_executor(), {.host = "127.0.0.1", .port = server.endpoint().port()});
  auto a = post(io, c, otlp_post("1"));
  EXPECT_EQ(a.status, 200) << a.error;
  EXPECT_EQ(a.body, "ok");
  a = post(io, c, otlp_post("2"));
  EXPECT_EQ(a.status, 202) << a.error;
  EXPECT_EQ(server.connections(), 1);
}

TEST(KeptConnection, OpensANewConnectionWhenTheServerClosedTheLastOne) {
  PostServer server({{"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", true},  // then closes, unannounced
                     {"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"},
                     {"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"}});
  asio::io_context io;
  http::KeptConnection c(io.get_executor(), {.host = "127.0.0.1", .port = server.endpoint().port()});
  EXPECT_EQ(post(io, c, otlp_post("1")).status, 200);
  EXPECT_TRUE(test::run_until(io, [&] { return server.closed() == 1; }));
  const auto a = post(io, c, otlp_post("2"));  // fails on the stale connection, sent again on a new one
  EXPECT_EQ(a.status, 202) << a.error;
  EXPECT_FALSE(c.connected());  // Connection: close
  EXPECT_EQ(post(io, c, otlp_post("3")).status, 200);
  EXPECT_EQ(server.connections(), 3);
  const auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_TRUE(reqs[1].ends_with("\r\n\r\n2"));
}

// The status is the server's answer even when its body is past the limit: a 2xx took the POST (it must not be
// sent again); the body is not read, and the connection (a body left unread) is closed.
TEST(KeptConnection, AnAnswerOverTheBodyLimitKeepsItsStatusWithoutItsBody) {
  const std::string big(70 * 1024, 'x');
  PostServer server({{"HTTP/1.1 200 OK\r\ncontent-length: " + std::to_string(big.size()) + "\r\n\r\n" + big}});
  asio::io_context io;
  http::KeptConnection c(io.get_executor(), {.host = "127.0.0.1", .port = server.endpoint().port()});
  const auto a = post(io, c, otlp_post("x"));
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.error, "the answer's body: body limit exceeded");
  EXPECT_TRUE(a.body.empty());
  EXPECT_FALSE(c.connected());
}

TEST(KeptConnection, RefusedAndSilentServersFailWithinTheTimeout) {
  std::uint16_t closed_port;
  {
    asio::io_context io;
    asio::ip::tcp::acceptor acc(io, {asio::ip::address_v4::loopback(), 0});
    closed_port = acc.local_endpoint().port();
  }
  asio::io_context io;
  http::KeptConnection refused(io.get_executor(), {.host = "127.0.0.1", .port = closed_port});
  auto a = post(io, refused, otlp_post("x"));
  EXPECT_EQ(a.status, 0);
  EXPECT_TRUE(a.error.starts_with("cannot connect: ")) << a.error;

  PostServer server({PostServer::Answer{.silent = true}});
  http::KeptConnection c(io.get_executor(), {.host = "127.0.0.1", .port = server.endpoint().port()});
  auto r = otlp_post("x");
  r.timeout = std::chrono::milliseconds(150);
  const auto t0 = std::chrono::steady_clock::now();
  a = post(io, c, r);
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(a.error, "timed out");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_FALSE(c.connected());
}

TEST(KeptConnection, AnHttpsTargetWithAnUnreadableCaFileSaysWhy) {
  asio::io_context io;
  http::KeptConnection c(io.get_executor(),
                         {.host = "127.0.0.1", .port = 1, .tls = true, .ca_file = "/nonexistent/ca.pem"});
  const auto a = post(io, c, otlp_post("x"));
  EXPECT_EQ(a.status, 0);
  EXPECT_NE(a.error.find("cannot load ca_file '/nonexistent/ca.pem'"), std::string::npos) << a.error;
}

}  // namespace
