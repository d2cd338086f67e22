// Who a request came from: the connection's peer, or, when that peer is a
// front proxy of server.trusted_proxies, the client X-Forwarded-For names,
// found as nginx's realip module finds it (`real_ip_header X-Forwarded-For;
// real_ip_recursive on;`). For the access log's `client` field; the
// X-Forwarded-For Weir sends upstream still ends with the peer it saw
// (http/forward.hpp).
#pragma once

#include <optional>
#include <span>

#include "core/ip_net.hpp"
#include "http/forward.hpp"

namespace weir::http {

// The peer address of connected socket `fd` (getpeername(2): one system
// call); an IPv4-mapped IPv6 peer (a client over IPv4 to a dual-stack
// listener) is its IPv4 address. nullopt when the socket has none (closed).
std::optional<core::IpAddress> socket_peer(int fd) noexcept;

// Whether `a` is in one of the blocks of `nets`.
bool in_any(std::span<const core::IpNet> nets, const core::IpAddress& a) noexcept;

// The client of request `req`, which came over a connection from `peer`:
//  - `peer` when it is not in `trusted` (nobody vouches for what the request
//    says about its origin);
//  - else X-Forwarded-For's entries (all its lines in order, as one list,
//    comma-separated, OWS trimmed, empty ones skipped) are walked from the
//    right-most leftwards, each the client of the hop to its right: the
//    first one not in `trusted` is the client; when all are trusted, the
//    left-most. An entry that is not an IP address (parse_ip: a port, a
//    name, "unknown", garbage) ends the walk: the client is then the last
//    address the walk reached (the hop right of it, whose view that is).
// No allocation; one pass over the fields.
core::IpAddress resolve_client(const RequestHead& req, const core::IpAddress& peer,
                               std::span<const core::IpNet> trusted) noexcept;

}  // namespace weir::http
