// IP addresses and CIDR blocks (RFC 4632; RFC 4291 §2.3 for IPv6 prefixes),
// for server.trusted_proxies (http/client_address.hpp). An IPv4 address is
// held as its IPv4-mapped IPv6 form (::ffff:a.b.c.d, RFC 4291 §2.5.5.2) and
// an IPv4 block's prefix length counted from bit 96 of it, so one comparison
// serves both families and a client over IPv4 to a dual-stack listener
// matches an IPv4 block.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace weir::core {

// One IPv4 or IPv6 address, in network byte order, IPv4 as IPv4-mapped IPv6.
struct IpAddress {
  std::array<std::uint8_t, 16> bytes{};
  // An IPv4 address (or an IPv4-mapped IPv6 one, which is the same client).
  bool v4() const noexcept;
  bool operator==(const IpAddress&) const = default;
};

// Text long enough for any address format_ip writes (INET6_ADDRSTRLEN).
using IpText = std::array<char, 46>;

// A block of addresses: those whose first `prefix` bits (of the 128) are the
// base's. The base has no bit set past the prefix. A block written in IPv6
// form that does not lie inside ::ffff:0:0/96 (`::/0`, `fd00::/8`) holds
// IPv6 addresses only, as nginx's set_real_ip_from reads it: an IPv4 client
// is never in it, though its mapped form has the same leading bits.
struct IpNet {
  IpAddress base;
  std::uint8_t prefix = 128;
  bool v6_only = false;
  bool contains(const IpAddress& a) const noexcept;
  bool operator==(const IpNet&) const = default;
};

// Parses an IPv4 address in dotted-quad form (four decimal parts, as
// inet_pton(3) takes them: "127.1" or "0x7f.0.0.1" are not addresses) or an
// IPv6 address (RFC 4291 §2.2, as inet_pton takes it: no zone index), the
// latter also in brackets ("[2001:db8::1]", as RFC 7239 and URIs write it).
// nullopt for anything else, a port included. No allocation.
std::optional<IpAddress> parse_ip(std::string_view text) noexcept;

// Parses "ADDRESS/LENGTH" (LENGTH 0..32 for IPv4, 0..128 for IPv6) or an
// ADDRESS alone (a block of one: /32 or /128); bits past the length are
// cleared ("10.1.2.3/8" is 10.0.0.0/8, as nginx's set_real_ip_from reads it).
// nullopt when it is neither; `error` then says why.
std::optional<IpNet> parse_ip_net(std::string_view text, std::string& error);

// Writes `a` as text into `out`: an IPv4 one dotted ("192.0.2.7"), an IPv6 one
// as inet_ntop(3) writes it (RFC 5952's compressed form). Returns its length.
std::size_t format_ip(const IpAddress& a, IpText& out) noexcept;

}  // namespace weir::core
