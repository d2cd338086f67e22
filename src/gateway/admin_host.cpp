#include "gateway/admin_host.hpp"

#include <algorithm>

#include <boost/asio/ip/address_v4.hpp>
#include <boost/asio/ip/address_v6.hpp>

#include "core/text.hpp"

namespace weir::gateway {

namespace ip = boost::asio::ip;

std::string_view request_authority(std::string_view target, std::string_view host_field) {
  // check_request_head() let only origin-form ("/...") and http(s) absolute-form through.
  if (!target.empty() && target[0] != '/') {
    const auto scheme = target.find("://");
    if (scheme != std::string_view::npos) {
      const auto start = scheme + 3;
      const auto end = target.find_first_of("/?#", start);
      return target.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    }
  }
  return core::trim_ows(host_field);
}

std::string normalize_host(std::string_view authority) {
  std::string out;
  if (!authority.empty() && authority[0] == '[') {
    const auto close = authority.find(']');
    const std::string_view inner =
        authority.substr(1, close == std::string_view::npos ? std::string_view::npos : close - 1);
    boost::system::error_code ec;
    const auto v6 = ip::make_address_v6(std::string(inner), ec);
    if (!ec) return "[" + v6.to_string() + "]";
    out.reserve(inner.size() + 2);
    out += '[';
    for (char c : inner) out += core::ascii_lower(c);
    out += ']';
    return out;  // an IPvFuture: compared as written, in lower case
  }
  std::string_view host = authority.substr(0, authority.find(':'));
  // "localhost." is "localhost" (an absolute DNS name), and so for any name.
  if (host.size() > 1 && host.back() == '.') host.remove_suffix(1);
  out.reserve(host.size());
  for (char c : host) out += core::ascii_lower(c);
  return out;
}

namespace {

bool is_ip_literal(std::string_view host) {
  boost::system::error_code ec;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    (void)ip::make_address_v6(std::string(host.substr(1, host.size() - 2)), ec);
    return !ec;
  }
  // inet_pton's dotted quad only: "127.1" or "0x7f.0.0.1" are names here (a browser writes its
  // Host in the dotted quad form whatever the URL said).
  (void)ip::make_address_v4(std::string(host), ec);
  return !ec;
}

}  // namespace

bool host_allowed(const AdminHostRule& rule, std::string_view authority) {
  if (rule.kind == AdminHostRule::Kind::any || authority.empty()) return true;
  const std::string host = normalize_host(authority);
  if (rule.kind == AdminHostRule::Kind::local) return host == "localhost" || is_ip_literal(host);
  return std::find(rule.names.begin(), rule.names.end(), host) != rule.names.end();
}

bool is_loopback(const ip::address& addr) {
  if (addr.is_loopback()) return true;
  if (!addr.is_v6() || !addr.to_v6().is_v4_mapped()) return false;
  return ip::make_address_v4(ip::v4_mapped, addr.to_v6()).is_loopback();
}

AdminHostRule effective_host_rule(const AdminHostRule* configured, const ip::address& bound) {
  if (configured) return *configured;
  return AdminHostRule{is_loopback(bound) ? AdminHostRule::Kind::local : AdminHostRule::Kind::any, {}};
}

}  // namespace weir::gateway
