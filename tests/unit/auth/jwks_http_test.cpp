// JWKS over HTTP against a real local server (Asio, port 0: the port is
// known before the fetch starts, so nothing waits or sleeps).
#include <gtest/gtest.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <fstream>
#include <optional>

#include "auth/jwks_cache.hpp"
#include "jwt_test_util.hpp"

namespace weir::auth {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

// Serves `body` with `status` to every connection until stopped.
class JwksServer {
 public:
  JwksServer(asio::io_context& ioc, std::string body)
      : acceptor_(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)), body_(std::move(body)) {
    asio::co_spawn(ioc, serve(), asio::detached);
  }
  std::uint16_t port() const { return port_; }
  std::string url(std::string_view path = "/.well-known/jwks.json") const {
    return fmt::format("http://127.0.0.1:{}{}", port_, path);
  }
  void stop() {
    boost::system::error_code ec;
    acceptor_.close(ec);
  }
  int status = 200;
  int requests = 0;
  std::string last_request;

 private:
  asio::awaitable<void> serve() {
    while (acceptor_.is_open()) {
      auto [ec, sock] = co_await acceptor_.async_accept(asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;
      asio::streambuf buf;
      auto [rec, n] = co_await asio::async_read_until(sock, buf, "\r\n\r\n", asio::as_tuple(asio::use_awaitable));
      if (rec) continue;
      ++requests;
      last_request.assign(asio::buffers_begin(buf.data()), asio::buffers_begin(buf.data()) + n);
      const std::string res = fmt::format(
          "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
          "Connection: close\r\n\r\n{}",
          status, body_.size(), body_);
      co_await asio::async_write(sock, asio::buffer(res), asio::as_tuple(asio::use_awaitable));
    }
  }
  tcp::acceptor acceptor_;
  std::uint16_t port_ = acceptor_.local_endpoint().port();
  std::string body_;
};

// Runs `ioc` until `done()` or 10 s pass (a bound, not a sleep).
template <class F>
bool run_until(asio::io_context& ioc, F done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    ioc.restart();
    ioc.run_one_for(50ms);
  }
  return done();
}

TEST(AuthJwksHttp, FetchesKeysAndKeepsThemWhenTheServerGoesDown) {
  const auto& k = testing::Keys::get();
  asio::io_context ioc;
  JwksServer server(ioc, testing::jwks_of({&k.rsa, &k.ed}));
  JwksOptions opt;
  opt.min_refetch_interval = 1s;
  JwksCache cache(ioc, make_http_jwks_source(ioc, server.url(), 2s), opt);
  cache.start();
  ASSERT_TRUE(run_until(ioc, [&] { return cache.stats().updates == 1; }));
  EXPECT_EQ(cache.keys()->keys.size(), 2u);
  EXPECT_NE(server.last_request.find("GET /.well-known/jwks.json HTTP/1.1"), std::string::npos);
  cache.stop();

  server.stop();  // the endpoint is gone: connection refused
  EXPECT_TRUE(cache.request_refresh(MonoClock::now() + 1h));
  ASSERT_TRUE(run_until(ioc, [&] { return cache.stats().failures == 1; }));
  EXPECT_EQ(cache.keys()->keys.size(), 2u);  // still serving with the cached keys
  EXPECT_EQ(cache.stats().updates, 1u);
}

TEST(AuthJwksHttp, Non200AndGarbageAreFailures) {
  asio::io_context ioc;
  JwksServer server(ioc, "{\"keys\":[]}");
  server.status = 503;
  JwksOptions opt;
  JwksCache cache(ioc, make_http_jwks_source(ioc, server.url(), 2s), opt);
  cache.start();
  ASSERT_TRUE(run_until(ioc, [&] { return cache.stats().failures == 1; }));
  cache.stop();
  EXPECT_TRUE(cache.keys()->keys.empty());

  // The source's own words, for the log: the status, a refused connection, an oversized document.
  auto said = [&](const std::string& url) {
    std::optional<std::string> err;
    auto src = make_http_jwks_source(ioc, url, 2s);
    src->fetch([&](JwksSource::Result r) { err = r ? "ok" : r.error(); });
    EXPECT_TRUE(run_until(ioc, [&] { return err.has_value(); }));
    return err.value_or("");
  };
  EXPECT_EQ(said(server.url()), "JWKS endpoint answered 503");
  server.stop();
  EXPECT_EQ(said(server.url()).rfind("JWKS fetch failed: cannot connect: ", 0), 0u);
  JwksServer big(ioc, std::string(2 << 20, ' '));
  EXPECT_EQ(said(big.url()).rfind("JWKS fetch failed: response read failed: ", 0), 0u);

  std::string err;
  auto bad = make_http_jwks_source(ioc, "http://user:pw@127.0.0.1:1/x", 1s);
  bad->fetch([&](JwksSource::Result r) { err = r ? "" : r.error(); });
  EXPECT_NE(err.find("credentials"), std::string::npos);
}

TEST(AuthJwksFile, LoadsFromAFile) {
  const auto& k = testing::Keys::get();
  const std::string path = ::testing::TempDir() + "weir_jwks_test.json";
  std::ofstream(path) << testing::jwks_of({&k.ec});
  asio::io_context ioc;
  JwksCache cache(ioc, make_file_jwks_source(path), JwksOptions{});
  cache.start();
  ioc.poll();
  cache.stop();
  ASSERT_EQ(cache.keys()->keys.size(), 1u);
  EXPECT_EQ(cache.keys()->keys[0].kid, "ec-1");
  JwksCache missing(ioc, make_file_jwks_source(path + ".missing"), JwksOptions{});
  missing.start();
  ioc.poll();
  missing.stop();
  EXPECT_EQ(missing.stats().failures, 1u);
}

// A source that answers from memory and counts fetches.
struct CountingSource final : JwksSource {
  std::string body;
  bool down = false;
  int* fetches;
  explicit CountingSource(int* f) : fetches(f) {}
  void fetch(Callback done) override {
    ++*fetches;
    if (down)
      done(tl::unexpected(std::string("down")));
    else
      done(body);
  }
  std::string describe() const override { return "counting"; }
};

TEST(AuthJwksCache, RefreshesPeriodicallyAndStops) {
  const auto& k = testing::Keys::get();
  asio::io_context ioc;
  int fetches = 0;
  auto src = std::make_unique<CountingSource>(&fetches);
  auto* raw = src.get();
  raw->body = testing::jwks_of({&k.ec});
  JwksOptions opt;
  opt.refresh_interval = 20ms;
  opt.min_refetch_interval = 5ms;
  JwksCache cache(ioc, std::move(src), opt);
  cache.start();
  ASSERT_TRUE(run_until(ioc, [&] { return fetches >= 3; }));
  EXPECT_EQ(cache.stats().updates, 1u);  // the same document: published once
  raw->down = true;                      // failures keep the keys and retry
  ASSERT_TRUE(run_until(ioc, [&] { return cache.stats().failures >= 2; }));
  EXPECT_EQ(cache.keys()->keys.size(), 1u);
  cache.stop();
  const int after_stop = fetches;
  ioc.restart();
  ioc.run_for(60ms);  // bounded: proves the timer no longer fires
  EXPECT_EQ(fetches, after_stop);
}

TEST(JwksHttp, DescribeShowsTheUrlRedacted) {
  asio::io_context ioc;
  EXPECT_EQ(make_http_jwks_source(ioc, "https://idp.example.com/jwks.json?api_key=SECRET&v=2", 1s)->describe(),
            "https://idp.example.com/jwks.json?api_key=REDACTED&v=2");
  EXPECT_EQ(make_http_jwks_source(ioc, "https://idp.example.com/jwks.json", 1s)->describe(),
            "https://idp.example.com/jwks.json");
}

}  // namespace
}  // namespace weir::auth
