#include "http/probe.hpp"

#include <array>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

namespace weir::http {

namespace {

// Closes `sock` at `r.timeout`: whatever is pending on it then completes with an error.
void close_at_deadline(Timer& deadline, const std::shared_ptr<Socket>& sock, const ProbeRequest& r) {
  deadline.expires_after(r.timeout);
  deadline.async_wait([weak = std::weak_ptr<Socket>(sock)](boost::system::error_code ec) {
    if (ec) return;
    if (auto s = weak.lock()) {
      boost::system::error_code ignored;
      s->close(ignored);
    }
  });
}

}  // namespace

Task<bool> probe_health(Executor ex, const ProbeRequest& r) {
  auto sock = std::make_shared<Socket>(ex);
  Timer deadline(ex);
  close_at_deadline(deadline, sock, r);
  auto [cec] = co_await sock->async_connect(r.addr, use_task);
  bool ok = false;
  if (!cec && sock->is_open()) {
    const std::string req = fmt::format(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: weir-health\r\nConnection: close\r\n\r\n", r.path, r.host_header);
    auto [wec, wn] = co_await asio::async_write(*sock, asio::buffer(req), use_task);
    std::array<char, 64> buf{};
    std::size_t have = 0;
    while (!wec && have < 12) {  // "HTTP/1.1 200"
      auto [rec, n] = co_await sock->async_read_some(asio::buffer(buf.data() + have, buf.size() - have), use_task);
      if (rec) break;
      have += n;
    }
    const std::string_view line(buf.data(), have);
    ok = have >= 12 && line.starts_with("HTTP/1.") && line[8] == ' ' && line[9] == '2';
    (void)wn;
  }
  deadline.cancel();
  boost::system::error_code ignored;
  sock->close(ignored);
  co_return ok;
}

Task<int> fetch_text(Executor ex, const ProbeRequest& r, std::string& body, const std::size_t& max_bytes) {
  auto sock = std::make_shared<Socket>(ex);
  Timer deadline(ex);
  close_at_deadline(deadline, sock, r);
  body.clear();
  int status = 0;
  auto [cec] = co_await sock->async_connect(r.addr, use_task);
  if (!cec && sock->is_open()) {
    const std::string req = fmt::format(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: weir-load\r\nAccept: text/plain\r\nConnection: close\r\n\r\n",
        r.path, r.host_header);
    auto [wec, wn] = co_await asio::async_write(*sock, asio::buffer(req), use_task);
    (void)wn;
    if (!wec) {
      // Beast frames the answer (Content-Length, chunked or close-delimited) within max_bytes.
      boost::beast::flat_buffer buf;
      boost::beast::http::response_parser<boost::beast::http::string_body> parser;
      parser.body_limit(max_bytes);
      auto [rec, rn] = co_await boost::beast::http::async_read(*sock, buf, parser, use_task);
      (void)rn;
      if (!rec) {
        status = parser.get().result_int();
        body = std::move(parser.get().body());
      }
    }
  }
  deadline.cancel();
  boost::system::error_code ignored;
  sock->close(ignored);
  co_return status;
}

}  // namespace weir::http
