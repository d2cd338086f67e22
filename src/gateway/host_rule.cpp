#include "gateway/host_rule.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/ip/address_v4.hpp>
#include <boost/asio/ip/address_v6.hpp>

#include "core/json_text.hpp"
#include "core/text.hpp"
#include "http/request_check.hpp"

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

bool host_allowed(const core::HostRule& rule, std::string_view authority) {
  if (rule.kind == core::HostRule::Kind::any) return true;
  if (authority.empty()) return rule.kind == core::HostRule::Kind::local;
  const std::string host = normalize_host(authority);
  if (rule.kind == core::HostRule::Kind::local) return host == "localhost" || is_ip_literal(host);
  return std::find(rule.names.begin(), rule.names.end(), host) != rule.names.end();
}

bool is_loopback(const ip::address& addr) {
  if (addr.is_loopback()) return true;
  if (!addr.is_v6() || !addr.to_v6().is_v4_mapped()) return false;
  return ip::make_address_v4(ip::v4_mapped, addr.to_v6()).is_loopback();
}

core::HostRule effective_host_rule(const core::HostRule* configured, const ip::address& bound) {
  if (configured) return *configured;
  return core::HostRule{is_loopback(bound) ? core::HostRule::Kind::local : core::HostRule::Kind::any, {}};
}

const core::HostRule& client_host_rule(const core::HostRule* configured, bool loopback_listener, bool reads_metrics) {
  static const core::HostRule any{core::HostRule::Kind::any, {}};
  static const core::HostRule local{core::HostRule::Kind::local, {}};
  if (configured) return *configured;
  return loopback_listener && reads_metrics ? local : any;
}

namespace {

bool is_ipv6(std::string_view s) {
  boost::system::error_code ec;
  (void)ip::make_address_v6(std::string(s), ec);
  return !ec;
}

// One allowed_hosts entry as host_allowed() compares it (normalize_host), or why it is none.
tl::expected<std::string, std::string> host_entry(std::string_view e) {
  const std::string quoted = core::quoted_text(e);
  if (e.find('*') != std::string_view::npos)
    return tl::unexpected(quoted + " has a wildcard: \"*\" alone allows any host; otherwise list each name");
  if (e.find('%') != std::string_view::npos)  // (no Host a request can send holds one: valid_host)
    return tl::unexpected(quoted + " is no host name (letters, digits, '-' and '.'; an IDN in its xn-- form)");
  if (e.front() == '[') {
    if (e.size() < 3 || e.back() != ']' || !is_ipv6(e.substr(1, e.size() - 2)))
      return tl::unexpected(quoted + " is no IPv6 address in brackets");
    return normalize_host(e);
  }
  if (e.find(':') != std::string_view::npos) {
    // An IPv6 address written without its brackets is one; anything else with a colon has a port.
    if (is_ipv6(e)) return normalize_host(fmt::format("[{}]", e));
    return tl::unexpected(quoted + " has a port: list the host alone (it is matched on every port)");
  }
  if (!http::valid_host(e) || e == ".")
    return tl::unexpected(quoted + " is no host name (letters, digits, '-' and '.'; an IDN in its xn-- form)");
  return normalize_host(e);
}

}  // namespace

core::ConfigResult<core::HostRule> parse_allowed_hosts(const YAML::Node& hosts, std::string_view key,
                                                       std::string_view listener) {
  using core::config_error;
  const std::string k(key);
  // A list of strings; one string is a list of one (as server.cors.allowed_origins).
  std::vector<std::pair<std::string, YAML::Node>> entries;
  if (hosts.IsScalar()) {
    WEIR_TRY_RESULT(h, core::read_string(hosts, k));
    entries.emplace_back(std::move(*h), hosts);
  } else if (hosts.IsSequence()) {
    for (std::size_t i = 0; i < hosts.size(); ++i) {
      WEIR_TRY_RESULT(h, core::read_string(hosts[i], fmt::format("{}[{}]", key, i)));
      entries.emplace_back(std::move(*h), hosts[i]);
    }
  } else {
    return tl::unexpected(config_error(hosts, k, "expected a list of host names (or \"*\")"));
  }
  if (entries.empty())
    return tl::unexpected(config_error(hosts, k,
                                       fmt::format("empty: no request naming a host would be answered; list the "
                                                   "names the {} is reached by (or \"*\" for any)",
                                                   listener)));
  core::HostRule rule{core::HostRule::Kind::listed, {}};
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& [h, n] = entries[i];
    const std::string entry_key = hosts.IsSequence() ? fmt::format("{}[{}]", key, i) : k;
    if (h == "*") {
      if (entries.size() > 1) return tl::unexpected(config_error(n, entry_key, "\"*\" allows any host: list it alone"));
      rule.kind = core::HostRule::Kind::any;
      continue;
    }
    if (h.empty()) return tl::unexpected(config_error(n, entry_key, "empty entry"));
    auto e = host_entry(h);
    if (!e) return tl::unexpected(config_error(n, entry_key, e.error()));
    if (std::find(rule.names.begin(), rule.names.end(), *e) == rule.names.end()) rule.names.push_back(*e);
  }
  // A set, not a sequence: a reload that lists the same hosts in another order changes nothing.
  std::sort(rule.names.begin(), rule.names.end());
  return rule;
}

}  // namespace weir::gateway
