// The JWKS document over HTTP(S), fetched with the control plane's one small
// HTTP client (http::fetch_text, http/probe.hpp): a GET on a new connection,
// Beast's parser, the pools' TLS client (system CAs, host name checked).
#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/url/parse.hpp>

#include "auth/jwks_cache.hpp"
#include "core/url.hpp"
#include "http/probe.hpp"
#include "http/tls.hpp"

namespace weir::auth {

namespace {

namespace asio = boost::asio;
using Resolver = asio::ip::basic_resolver<http::tcp, core::Executor>;
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
    const bool tls = u->scheme() == "https";
    if (!tls && u->scheme() != "http") bad_ = "jwks_url scheme must be http or https";
    if (u->has_userinfo()) bad_ = "jwks_url must not carry credentials";
    host_ = std::string(u->host_address());  // an IPv6 literal without its brackets
    port_ = u->has_port() ? std::string(u->port()) : (tls ? "443" : "80");
    host_header_ = std::string(u->encoded_host_and_port());
    target_ = std::string(u->encoded_target());
    if (target_.empty()) target_ = "/";
    if (tls && bad_.empty()) {
      std::string error;
      tls_ = http::TlsClient::make(core::TlsConfig{}, error);  // the system store, names verified
      if (!tls_) bad_ = error;
    }
  }

  void fetch(Callback done) override {
    if (!bad_.empty()) {
      done(tl::unexpected(bad_));
      return;
    }
    asio::co_spawn(ioc_.get_executor(), run(), [done = std::move(done)](std::exception_ptr e, Result r) {
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
  // Each resolved address in turn until one answers, within timeout_ in all.
  core::Task<Result> run() {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    Resolver resolver(ioc_.get_executor());
    auto [rec, endpoints] = co_await resolver.async_resolve(host_, port_, core::use_task);
    if (rec) co_return tl::unexpected("cannot resolve JWKS host: " + rec.message());
    std::string body, failure = "no address";
    const std::size_t max_bytes = kBodyLimit;
    for (const auto& entry : endpoints) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      const http::ProbeRequest req{.addr = entry.endpoint(),
                                   .host_header = host_header_,
                                   .path = target_,
                                   .timeout = left,
                                   .tls = {.client = tls_.get(), .server_name = host_},
                                   .user_agent = "weir-jwks",
                                   .accept = "application/json",
                                   .failure = &failure};
      const int status = co_await http::fetch_text(ioc_.get_executor(), req, body, max_bytes);
      if (status == 200) co_return std::move(body);
      if (status != 0) co_return tl::unexpected(fmt::format("JWKS endpoint answered {}", status));
    }
    co_return tl::unexpected("JWKS fetch failed: " + failure);
  }

  asio::io_context& ioc_;
  std::string url_;
  std::chrono::milliseconds timeout_;
  std::string bad_;
  std::shared_ptr<http::TlsClient> tls_;  // https:// only
  std::string host_, port_, host_header_, target_;
};

}  // namespace

std::unique_ptr<JwksSource> make_http_jwks_source(boost::asio::io_context& control, std::string url,
                                                  std::chrono::milliseconds timeout) {
  return std::make_unique<HttpSource>(control, std::move(url), timeout);
}

}  // namespace weir::auth
