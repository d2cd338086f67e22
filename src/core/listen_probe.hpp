// Is a TCP address already served? Weir and weir-mock bind one SO_REUSEPORT
// listener per worker, and the kernel lets every process of the same user
// join such a port: a second instance would start silently and take half the
// traffic. They ask this first and refuse to start unless told to share.
#pragma once

#include <string>
#include <string_view>

#include <boost/asio/ip/tcp.hpp>
#include <tl/expected.hpp>

namespace weir::core {

// Binds a probe socket to `ep` with SO_REUSEADDR and without SO_REUSEPORT,
// then closes it. On Linux (bind(2); inet_csk_bind_conflict in
// net/ipv4/inet_connection_sock.c) such a bind passes over TIME_WAIT and
// bound-but-not-listening sockets, so a restart is never blocked, and fails
// with EADDRINUSE when any socket listens on that port at the same address
// or at a wildcard covering it (a listener on 0.0.0.0:P owns 127.0.0.1:P),
// whatever that listener's SO_REUSEPORT. Returns 0 if the probe bound (or
// ep's port is 0: the kernel picks a free one), else the errno of
// socket(2)/bind(2): EADDRINUSE means another listener; any other error is
// for the caller's real bind to report.
int probe_listen_address(const boost::asio::ip::tcp::endpoint& ep);

// How many sockets of this network namespace listen on exactly `ep` (its
// address and port, as /proc/net/tcp or /proc/net/tcp6 lists them; a
// wildcard listener is another address): 2 or more when another process
// joined the caller's listener through SO_REUSEPORT (a new instance started
// with --reuse-port for a zero-downtime restart). -1 when it cannot be told
// (no /proc). Reads a file: for the control thread, never a worker's.
int count_listeners(const boost::asio::ip::tcp::endpoint& ep);

// The address a listener on `host` binds: `host` itself when it is an IP
// literal, else the first address getaddrinfo(3) gives for the name (the
// client and admin listeners both bind that one). Error: "cannot resolve
// listen host H: reason".
tl::expected<boost::asio::ip::address, std::string> resolve_listen_host(const std::string& host);

// Would listeners bound to `a` and `b` take the same connections: one port
// (not 0, which the kernel picks per listener) and the same address (an
// IPv4-mapped IPv6 address, [::ffff:127.0.0.1], taken as its IPv4 one: an
// IPv6 socket bound to it takes that address's connections), or
// either of them the wildcard of the other's family (0.0.0.0, or :: which
// also takes IPv4 while IPV6_V6ONLY is off, Linux's default).
bool listen_addresses_overlap(const boost::asio::ip::tcp::endpoint& a, const boost::asio::ip::tcp::endpoint& b);

// "127.0.0.1:8080", "[::1]:8080": for messages.
std::string format_address(const boost::asio::ip::tcp::endpoint& ep);
// The same for a host as configured (a name or an IP literal, a zone after
// '%' kept): "localhost:8080", "[::1%lo]:8080" (RFC 3986 §3.2.2's brackets
// around an IPv6 literal, so its port reads apart from it).
std::string format_host_port(std::string_view host, std::uint16_t port);

}  // namespace weir::core
