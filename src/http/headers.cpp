#include "http/headers.hpp"

#include <charconv>

#include "core/error.hpp"

namespace weir::http {

namespace {
constexpr auto lower = core::ascii_lower;
constexpr auto trim = core::trim_ows;
}  // namespace

bool has_token(std::string_view list, std::string_view token) {
  while (!list.empty()) {
    auto comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    std::string_view params;
    if (auto semi = item.find(';'); semi != std::string_view::npos) {
      params = item.substr(semi + 1);
      item = item.substr(0, semi);
    }
    if (!iequals(trim(item), token)) continue;
    // "gzip;q=0" means not acceptable (RFC 9110 §12.4.2).
    params = trim(params);
    if (params.size() >= 3 && lower(params[0]) == 'q' && params[1] == '=') {
      std::string_view q = trim(params.substr(2));
      bool zero = !q.empty();
      for (char c : q) zero = zero && (c == '0' || c == '.');
      if (zero) return false;
    }
    return true;
  }
  return false;
}

bool is_fixed_hop_by_hop(boost::beast::http::field f) {
  using boost::beast::http::field;
  switch (f) {
    case field::connection:
    case field::proxy_connection:
    case field::keep_alive:
    case field::te:
    case field::transfer_encoding:
    case field::upgrade:
    case field::trailer:
    case field::proxy_authorization:
    case field::proxy_authenticate:
      return true;
    default:
      return false;
  }
}

bool is_hop_by_hop(std::string_view name, std::string_view connection_value) {
  return is_fixed_hop_by_hop(boost::beast::http::string_to_field(name)) ||
         (!connection_value.empty() && has_token(connection_value, name));
}

void append_status_line(std::string& out, int status) {
  char num[8];
  auto [p, ec] = std::to_chars(num, num + sizeof num, status);
  (void)ec;
  out.append("HTTP/1.1 ");
  out.append(num, p);
  out.push_back(' ');
  out.append(core::reason_phrase(status));
  out.append("\r\n");
}

void append_hex(std::string& out, std::uint64_t n) {
  char buf[17];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, n, 16);
  (void)ec;
  out.append(buf, p);
}

}  // namespace weir::http
