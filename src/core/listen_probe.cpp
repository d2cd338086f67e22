#include "core/listen_probe.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace weir::core {

int probe_listen_address(const boost::asio::ip::tcp::endpoint& ep) {
  if (ep.port() == 0) return 0;
  const int fd = ::socket(ep.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int one = 1;
  int err = 0;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(fd, ep.data(), static_cast<socklen_t>(ep.size())) != 0)
    err = errno;
  ::close(fd);
  return err;
}

tl::expected<boost::asio::ip::address, std::string> resolve_listen_host(const std::string& host) {
  boost::system::error_code ec;
  auto ip = boost::asio::ip::make_address(host, ec);
  if (!ec) return ip;
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  auto results = resolver.resolve(host, "", ec);
  if (ec || results.empty())
    return tl::unexpected(
        fmt::format("cannot resolve listen host {}: {}", host, ec ? ec.message() : std::string("no address")));
  return results.begin()->endpoint().address();
}

bool listen_addresses_overlap(const boost::asio::ip::tcp::endpoint& a, const boost::asio::ip::tcp::endpoint& b) {
  if (a.port() == 0 || a.port() != b.port()) return false;
  const auto x = a.address();
  const auto y = b.address();
  if (x == y) return true;
  // :: takes IPv4 too (IPV6_V6ONLY off); 0.0.0.0 takes every IPv4 address.
  const auto wild = [](const boost::asio::ip::address& w, const boost::asio::ip::address& o) {
    return w.is_unspecified() && (w.is_v6() || o.is_v4());
  };
  return wild(x, y) || wild(y, x);
}

std::string format_address(const boost::asio::ip::tcp::endpoint& ep) {
  const auto a = ep.address();
  return a.is_v6() ? fmt::format("[{}]:{}", a.to_string(), ep.port()) : fmt::format("{}:{}", a.to_string(), ep.port());
}

}  // namespace weir::core
