// JWKS over HTTP(S): a small Beast GET client for the control plane.
#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/url/parse.hpp>

#include "auth/jwks_cache.hpp"
#include "core/url.hpp"

namespace weir::auth {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::size_t kBodyLimit = 1 << 20;

class HttpSource final : public JwksSource {
 public:
  HttpSource(asio::io_context& ioc, std::string url, std::chrono::milliseconds timeout)
      : ioc_(ioc), url_(std::move(url)), timeout_(timeout) {
    auto u = boost::urls::parse_uri(url_);
    if (!u) {
      bad_ = "jwks_url is not a URL";
      return;
    }
    tls_ = u->scheme() == "https";
    if (!tls_ && u->scheme() != "http") bad_ = "jwks_url scheme must be http or https";
    if (u->has_userinfo()) bad_ = "jwks_url must not carry credentials";
    host_ = std::string(u->host());
    port_ = u->has_port() ? std::string(u->port()) : (tls_ ? "443" : "80");
    target_ = std::string(u->encoded_target());
    if (target_.empty()) target_ = "/";
  }

  void fetch(Callback done) override {
    if (!bad_.empty()) {
      done(tl::unexpected(bad_));
      return;
    }
    asio::co_spawn(ioc_, run(), [done = std::move(done)](std::exception_ptr e, Result r) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          done(tl::unexpected(std::string("JWKS fetch failed: ") + ex.what()));
        } catch (...) {
          done(tl::unexpected(std::string("JWKS fetch failed")));
        }
        return;
      }
      done(std::move(r));
    });
  }

  std::string describe() const override { return core::redact_url(url_); }

 private:
  template <class Stream>
  asio::awaitable<Result> exchange(Stream& stream) {
    http::request<http::empty_body> req{http::verb::get, target_, 11};
    req.set(http::field::host, host_);
    req.set(http::field::user_agent, "weir-jwks");
    req.set(http::field::accept, "application/json");
    auto [wec, wn] = co_await http::async_write(stream, req, kTuple);
    if (wec) co_return tl::unexpected("JWKS request write failed: " + wec.message());
    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(kBodyLimit);
    auto [rec, rn] = co_await http::async_read(stream, buf, parser, kTuple);
    if (rec) co_return tl::unexpected("JWKS response read failed: " + rec.message());
    auto res = parser.release();
    if (res.result_int() != 200) co_return tl::unexpected(fmt::format("JWKS endpoint answered {}", res.result_int()));
    co_return std::move(res.body());
  }

  asio::awaitable<Result> run() {
    auto ex = co_await asio::this_coro::executor;
    tcp::resolver resolver(ex);
    auto [rec, endpoints] = co_await resolver.async_resolve(host_, port_, kTuple);
    if (rec) co_return tl::unexpected("cannot resolve JWKS host: " + rec.message());
    if (!tls_) {
      beast::tcp_stream stream(ex);
      stream.expires_after(timeout_);
      auto [cec, ep] = co_await stream.async_connect(endpoints, kTuple);
      if (cec) co_return tl::unexpected("cannot connect to JWKS endpoint: " + cec.message());
      auto r = co_await exchange(stream);
      beast::error_code ignored;
      stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      co_return r;
    }
    asio::ssl::context ctx(asio::ssl::context::tls_client);
    ctx.set_default_verify_paths();
    ctx.set_verify_mode(asio::ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> stream(ex, ctx);
    if (!SSL_set_tlsext_host_name(stream.native_handle(), host_.c_str()))
      co_return tl::unexpected(std::string("cannot set TLS server name"));
    stream.set_verify_callback(asio::ssl::host_name_verification(host_));
    beast::get_lowest_layer(stream).expires_after(timeout_);
    auto [cec, ep] = co_await beast::get_lowest_layer(stream).async_connect(endpoints, kTuple);
    if (cec) co_return tl::unexpected("cannot connect to JWKS endpoint: " + cec.message());
    auto [hec] = co_await stream.async_handshake(asio::ssl::stream_base::client, kTuple);
    if (hec) co_return tl::unexpected("TLS handshake with JWKS endpoint failed: " + hec.message());
    co_return co_await exchange(stream);
  }

  asio::io_context& ioc_;
  std::string url_;
  std::chrono::milliseconds timeout_;
  std::string bad_;
  bool tls_ = false;
  std::string host_, port_, target_;
};

}  // namespace

std::unique_ptr<JwksSource> make_http_jwks_source(boost::asio::io_context& control, std::string url,
                                                  std::chrono::milliseconds timeout) {
  return std::make_unique<HttpSource>(control, std::move(url), timeout);
}

}  // namespace weir::auth
