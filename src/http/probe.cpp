#include "http/probe.hpp"

#include <array>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "core/text.hpp"

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

namespace {

// Decodes a chunked body (RFC 9112 §7.1) from `in` into `out`; false if malformed.
bool dechunk(std::string_view in, std::string& out) {
  out.clear();
  for (;;) {
    const auto eol = in.find("\r\n");
    if (eol == std::string_view::npos) return false;
    std::size_t size = 0;
    std::size_t i = 0;
    for (; i < eol; ++i) {
      const char c = in[i];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) break;  // a chunk extension (";...") or whitespace ends the size
      if (size > (std::size_t{1} << 40)) return false;
      size = size * 16 + static_cast<std::size_t>(d);
    }
    if (i == 0) return false;
    in.remove_prefix(eol + 2);
    if (size == 0) return true;  // trailers, if any, are ignored
    if (in.size() < size + 2) return false;
    out.append(in.data(), size);
    in.remove_prefix(size + 2);
  }
}

}  // namespace

Task<int> fetch_text(Executor ex, const ProbeRequest& r, std::string& body, const std::size_t& max_bytes) {
  auto sock = std::make_shared<Socket>(ex);
  Timer deadline(ex);
  deadline.expires_after(r.timeout);
  deadline.async_wait([weak = std::weak_ptr<Socket>(sock)](boost::system::error_code ec) {
    if (ec) return;
    if (auto s = weak.lock()) {
      boost::system::error_code ignored;
      s->close(ignored);
    }
  });
  std::string raw;
  int status = 0;
  auto [cec] = co_await sock->async_connect(r.addr, use_task);
  bool complete = false;
  if (!cec && sock->is_open()) {
    const std::string req = fmt::format(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: weir-load\r\nAccept: text/plain\r\nConnection: close\r\n\r\n",
        r.path, r.host_header);
    auto [wec, wn] = co_await asio::async_write(*sock, asio::buffer(req), use_task);
    (void)wn;
    std::array<char, 16384> buf{};
    while (!wec && raw.size() <= max_bytes) {
      auto [rec, n] = co_await sock->async_read_some(asio::buffer(buf), use_task);
      raw.append(buf.data(), n);
      if (rec == asio::error::eof) {
        complete = true;
        break;
      }
      if (rec) break;
    }
  }
  deadline.cancel();
  boost::system::error_code ignored;
  sock->close(ignored);
  body.clear();
  const auto head_end = raw.find("\r\n\r\n");
  if (!complete || raw.size() > max_bytes || head_end == std::string::npos || raw.size() < 12 ||
      !raw.starts_with("HTTP/1.") || raw[8] != ' ')
    co_return 0;
  for (std::size_t i = 9; i < 12; ++i) {
    if (raw[i] < '0' || raw[i] > '9') co_return 0;
    status = status * 10 + (raw[i] - '0');
  }
  std::string_view head(raw.data(), head_end);
  const std::string_view rest = std::string_view(raw).substr(head_end + 4);
  // Transfer-Encoding: chunked (field names and the coding are case-insensitive).
  bool chunked = false;
  for (std::size_t at = head.find("\r\n"); at != std::string_view::npos; at = head.find("\r\n", at + 2)) {
    const auto line = head.substr(at + 2, head.find("\r\n", at + 2) - (at + 2));
    if (line.size() > 18 && core::iequals(line.substr(0, 18), "transfer-encoding:")) {
      std::string lower(line.substr(18));
      for (auto& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
      chunked = lower.find("chunked") != std::string::npos;
    }
  }
  if (!chunked) {
    body.assign(rest);
  } else if (!dechunk(rest, body)) {
    co_return 0;
  }
  co_return status;
}

}  // namespace weir::http
