#include "http/probe.hpp"

#include <array>
#include <memory>
#include <string>

#include <fmt/format.h>

namespace weir::http {

Task<bool> probe_health(Executor ex, const ProbeRequest& r) {
  auto sock = std::make_shared<Socket>(ex);
  Timer deadline(ex);
  deadline.expires_after(r.timeout);
  // The deadline closes the socket, which completes whatever is pending with an error.
  deadline.async_wait([weak = std::weak_ptr<Socket>(sock)](boost::system::error_code ec) {
    if (ec) return;
    if (auto s = weak.lock()) {
      boost::system::error_code ignored;
      s->close(ignored);
    }
  });
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

}  // namespace weir::http
