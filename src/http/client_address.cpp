#include "http/client_address.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "core/text.hpp"
#include "http/headers.hpp"

namespace weir::http {

std::optional<core::IpAddress> socket_peer(int fd) noexcept {
  sockaddr_storage sa{};
  socklen_t len = sizeof sa;
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return std::nullopt;
  core::IpAddress a;
  if (sa.ss_family == AF_INET) {
    a.bytes[10] = a.bytes[11] = 0xff;  // IPv4-mapped (core/ip_net.hpp)
    std::memcpy(a.bytes.data() + 12, &reinterpret_cast<const sockaddr_in&>(sa).sin_addr, 4);
    return a;
  }
  if (sa.ss_family == AF_INET6) {
    // (An IPv4-mapped one is already in the form IpAddress holds IPv4 in.)
    std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in6&>(sa).sin6_addr, 16);
    return a;
  }
  return std::nullopt;
}

bool in_any(std::span<const core::IpNet> nets, const core::IpAddress& a) noexcept {
  for (const auto& n : nets)
    if (n.contains(a)) return true;
  return false;
}

core::IpAddress resolve_client(const RequestHead& req, const core::IpAddress& peer,
                               std::span<const core::IpNet> trusted) noexcept {
  if (!in_any(trusted, peer)) return peer;
  // The walk goes right to left, the fields only forward: one forward pass keeps the walk's answer for the
  // entries seen so far, were they all the entries. `found` false: that answer is whatever address the walk
  // started from (nothing valid reached before its end or a garbage entry). A next entry, right of them,
  // is where the walk now starts: garbage ends it at once (the start address); an untrusted address is the
  // answer; a trusted one passes the walk on to the entries before it, starting from itself.
  core::IpAddress answer = peer;
  bool found = false;
  for (const auto& f : req) {
    if (f.name() != boost::beast::http::field::unknown || !iequals(f.name_string(), "x-forwarded-for")) continue;
    for (std::string_view list = f.value(); !list.empty();) {
      const auto comma = list.find(',');
      const std::string_view entry = core::trim_ows(list.substr(0, comma));
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      if (entry.empty()) continue;
      const auto a = core::parse_ip(entry);
      if (!a) {
        found = false;
      } else if (!found || !in_any(trusted, *a)) {
        answer = *a;
        found = true;
      }
    }
  }
  return found ? answer : peer;
}

}  // namespace weir::http
