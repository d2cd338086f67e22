// Response heads Weir writes itself (RFC 9110, RFC 9112): status line,
// framing, Date, Connection. Proxied heads add the upstream's fields
// (http/forward.hpp) between the status line and the framing.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace weir::http {

// How the response ends the exchange (RFC 9112 §9.3): `keep_alive` false
// sends "Connection: close"; an HTTP/1.0 client that keeps the connection
// gets "Connection: keep-alive" (its default is close).
struct ConnectionMode {
  bool keep_alive = true;
  bool http10 = false;
};

// Appends the Connection field for `c`, or nothing (HTTP/1.1 keep-alive).
void append_connection_header(std::string& out, ConnectionMode c);

// Appends "Content-Length: n\r\n".
void append_content_length(std::string& out, std::size_t n);

// Appends a complete head for a body Weir built: status line, Content-Type,
// Content-Length, x-request-id, `extra_lines` then `more_lines` (whole "Name: value\r\n"
// lines, e.g. x-ratelimit-* or Retry-After), Date, Connection, blank line.
void append_own_response_head(std::string& out, int status, std::string_view content_type, std::size_t content_length,
                              std::string_view request_id, std::string_view extra_lines, std::string_view more_lines,
                              ConnectionMode c);

}  // namespace weir::http
