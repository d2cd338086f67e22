#include "http/response_head.hpp"

#include <charconv>

#include "core/time.hpp"
#include "http/headers.hpp"

namespace weir::http {

void append_connection_header(std::string& out, ConnectionMode c) {
  if (!c.keep_alive)
    out += "Connection: close\r\n";
  else if (c.http10)
    out += "Connection: keep-alive\r\n";
}

void append_content_length(std::string& out, std::size_t n) {
  char buf[24];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, n);
  (void)ec;
  out += "Content-Length: ";
  out.append(buf, p);
  out += "\r\n";
}

void append_own_response_head(std::string& out, int status, std::string_view content_type, std::size_t content_length,
                              std::string_view request_id, std::string_view extra_lines, std::string_view more_lines,
                              ConnectionMode c) {
  append_status_line(out, status);
  append_header(out, "Content-Type", content_type);
  append_content_length(out, content_length);
  append_header(out, "x-request-id", request_id);
  out += extra_lines;
  out += more_lines;
  core::append_http_date(out);
  append_connection_header(out, c);
  out += "\r\n";
}

}  // namespace weir::http
