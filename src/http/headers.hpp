// Header handling shared by the downstream and upstream sides (RFC 9110).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/text.hpp"

namespace weir::http {

using core::iequals;  // ASCII case-insensitive (field names, RFC 9110 §5.1)

// True for fields a proxy must not forward (RFC 9110 §7.6.1): Connection,
// Proxy-Connection, Keep-Alive, TE, Transfer-Encoding, Upgrade, Trailer,
// Proxy-Authorization, Proxy-Authenticate, and any field that the message's
// Connection header lists (`connection_value`).
bool is_hop_by_hop(std::string_view name, std::string_view connection_value);

// True if the comma-separated list `list` contains `token` (case-insensitive),
// e.g. has_token("gzip, br", "gzip"). A "q=0" parameter excludes the token.
bool has_token(std::string_view list, std::string_view token);

// Appends "Name: value\r\n".
inline void append_header(std::string& out, std::string_view name, std::string_view value) {
  out.append(name);
  out.append(": ");
  out.append(value);
  out.append("\r\n");
}

// Appends "HTTP/1.1 <status> <reason>\r\n".
void append_status_line(std::string& out, int status);

// Appends the lowercase hexadecimal form of n (chunk sizes, RFC 9112 §7.1).
void append_hex(std::string& out, std::uint64_t n);

}  // namespace weir::http
