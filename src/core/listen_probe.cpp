#include "core/listen_probe.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

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

std::string format_address(const boost::asio::ip::tcp::endpoint& ep) {
  const auto a = ep.address();
  return a.is_v6() ? fmt::format("[{}]:{}", a.to_string(), ep.port()) : fmt::format("{}:{}", a.to_string(), ep.port());
}

}  // namespace weir::core
