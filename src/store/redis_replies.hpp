// Redis's error replies as the client reads them (store::Error::message of an
// Errc::server): which say the connection cannot be used, and how one is
// shown in a log line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace weir::store {

// "host:port" for logs, an IPv6 address in brackets ("[::1]:6379").
std::string endpoint_text(std::string_view host, std::uint16_t port);

// True when an error reply (store::Error::message of an Errc::server) says
// that this server cannot take commands at all, whichever: READONLY (a
// replica: after a failover the old master is demoted), MASTERDOWN (a
// replica that lost its master), MOVED / ASK (a Redis Cluster node, which
// Weir does not support), also when a script relays it (Redis 6: "ERR Error
// running script ...: -READONLY ..."). Not LOADING (the server is about to
// serve), OOM, MISCONF, BUSY, NOREPLICAS (the right server's state). The
// client drops a connection that answers one (Client, "Command semantics").
bool wrong_server_reply(std::string_view message) noexcept;

// True when an error reply says that Redis refuses to serve this connection:
// NOAUTH (Redis has `requirepass` and Weir sent no password), WRONGPASS,
// "ERR max number of clients reached" (sent unasked on accept, then Redis
// closes). The client takes such a connection as a failed attempt (Client,
// "Command semantics").
bool refused_reply(std::string_view message) noexcept;

// An error reply's first sentence, at most 120 characters (MISCONF's is ~450), for a log line.
std::string first_sentence(std::string_view message);

}  // namespace weir::store
