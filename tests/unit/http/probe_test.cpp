// http::fetch_text against a scripted server on loopback: the whole body of
// a Content-Length, chunked or close-delimited answer; 0 on a cut answer.
#include <optional>
#include <string>

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

TEST(FetchText, ReportsTheStatusAndZeroForABrokenAnswer) {
  std::string body;
  EXPECT_EQ(fetch("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n", body), 503);
  EXPECT_EQ(fetch("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab", body), 0);  // cut in a chunk
  EXPECT_EQ(fetch("garbage", body), 0);
}

}  // namespace
