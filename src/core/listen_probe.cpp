#include "core/listen_probe.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "core/json_text.hpp"

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

int count_listeners(const boost::asio::ip::tcp::endpoint& ep) {
  // The kernel prints a socket's local address as it lies in memory, 32 bits
  // at a time with %08X (tcp4_seq_show, tcp6_seq_show in net/ipv4/tcp_ipv4.c
  // and net/ipv6/tcp_ipv6.c): `ep` is written the same way, so the two
  // compare as text on any byte order.
  std::string want;
  const auto a = ep.address();
  if (a.is_v4()) {
    const auto bytes = a.to_v4().to_bytes();
    std::uint32_t word = 0;
    std::memcpy(&word, bytes.data(), sizeof word);
    want = fmt::format("{:08X}", word);
  } else {
    const auto bytes = a.to_v6().to_bytes();
    for (std::size_t i = 0; i < bytes.size(); i += 4) {
      std::uint32_t word = 0;
      std::memcpy(&word, bytes.data() + i, sizeof word);
      want += fmt::format("{:08X}", word);
    }
  }
  want += fmt::format(":{:04X}", ep.port());
  std::ifstream in(a.is_v4() ? "/proc/net/tcp" : "/proc/net/tcp6");
  if (!in) return -1;
  std::string line;
  std::getline(in, line);  // the column names
  int n = 0;
  while (std::getline(in, line)) {
    // "  sl  local_address rem_address   st ...": 0A is TCP_LISTEN.
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    if (fields >> slot >> local >> remote >> state && local == want && state == "0A") ++n;
  }
  return n;
}

tl::expected<boost::asio::ip::address, std::string> resolve_listen_host(const std::string& host) {
  boost::system::error_code ec;
  auto ip = boost::asio::ip::make_address(host, ec);
  if (!ec) return ip;
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  auto results = resolver.resolve(host, "", ec);
  if (ec || results.empty())
    return tl::unexpected(fmt::format("cannot resolve listen host {}: {}", quoted_text(host),
                                      ec ? ec.message() : std::string("no address")));
  return results.begin()->endpoint().address();
}

bool listen_addresses_overlap(const boost::asio::ip::tcp::endpoint& a, const boost::asio::ip::tcp::endpoint& b) {
  if (a.port() == 0 || a.port() != b.port()) return false;
  // An IPv4-mapped IPv6 address binds the IPv4 address it maps (both listeners then take its connections).
  const auto unmapped = [](const boost::asio::ip::address& v) {
    return v.is_v6() && v.to_v6().is_v4_mapped()
               ? boost::asio::ip::address(boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, v.to_v6()))
               : v;
  };
  const auto x = unmapped(a.address());
  const auto y = unmapped(b.address());
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

std::string format_host_port(std::string_view host, std::uint16_t port) {
  return host.find(':') != std::string_view::npos ? fmt::format("[{}]:{}", host, port)
                                                  : fmt::format("{}:{}", host, port);
}

}  // namespace weir::core
