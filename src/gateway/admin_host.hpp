// The admin listener's check of the host a request names
// (admin.allowed_hosts, docs/admin-api.md "Host names and DNS rebinding").
// A page on any site can have the operator's browser send requests to a
// name its owner controls, then rebind that name's DNS record to 127.0.0.1:
// the browser takes the admin listener for that site, and the page reads
// whatever needs no token (/metrics with tenants, key ids and spend,
// /ready, the console). Those requests still carry the site's name as
// Host, which is what this check refuses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/ip/address.hpp>

namespace weir::gateway {

// Which hosts the admin listener answers.
struct AdminHostRule {
  enum class Kind : std::uint8_t {
    // "*", or the default on a listener that is not on a loopback address
    // (Kubernetes scrapes by service name keep working): any host.
    any,
    // The default on a loopback listener: IP literals (v4, [v6]) and
    // `localhost`, the names no other site's page can be served under (a
    // rebinding needs a DNS name its owner controls).
    local,
    // admin.allowed_hosts as listed: `names` only.
    listed,
  };
  Kind kind = Kind::any;
  std::vector<std::string> names;  // listed: each as normalize_host() makes it

  bool operator==(const AdminHostRule&) const = default;
};

// The authority a request names: an absolute-form target's ("http://h:1/p";
// RFC 9112 §3.2.2: an origin server ignores Host then), else the Host
// field's value (OWS trimmed). Empty when neither (an HTTP/1.0 request
// without Host) or when Host is empty. The head must have passed
// http::check_request_head() (one Host at most; a valid absolute target).
std::string_view request_authority(std::string_view target, std::string_view host_field);

// The host of `authority` (uri-host [":" port], http::valid_host()) as it
// is compared: without the port, in lower case, a reg-name without one
// trailing dot (the same DNS name), an IPv6 literal in brackets in its
// canonical text (RFC 5952: "[0:0::1]" is "[::1]"). "Admin.Example.:8081"
// → "admin.example"; "[::1]:8081" → "[::1]".
std::string normalize_host(std::string_view authority);

// Whether `rule` lets a request naming `authority` (request_authority())
// through. An empty authority always passes: browsers always send a Host
// (the name a rebinding relies on), so a request without one (HTTP/1.0
// health checks) comes from a client that chose its target itself.
bool host_allowed(const AdminHostRule& rule, std::string_view authority);

// True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104 (a v4-mapped loopback
// address): the listener addresses whose default is Kind::local.
bool is_loopback(const boost::asio::ip::address& addr);

// The rule in force: `configured` (admin.allowed_hosts), or without it the
// default for the address the listener is bound to.
AdminHostRule effective_host_rule(const AdminHostRule* configured, const boost::asio::ip::address& bound);

}  // namespace weir::gateway
