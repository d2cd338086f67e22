// The listeners' check of the host a request names: admin.allowed_hosts
// (docs/admin-api.md "Host names and DNS rebinding") and server.allowed_hosts
// (docs/operations.md "Host names and DNS rebinding"), one matching for both.
// A page on any site can have a browser send requests to a name its owner
// controls, then rebind that name's DNS record to 127.0.0.1: the browser
// takes the listener for that site, and the page reads whatever needs no
// credential (/metrics with tenants, key ids and spend, /ready, the admin
// console; on the client listener also the API itself when Weir checks no
// credential). Those requests still carry the site's name as Host, which is
// what this check refuses.
#pragma once

#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>
#include <boost/asio/ip/address.hpp>

#include "core/config.hpp"
#include "core/host_rule.hpp"

namespace weir::gateway {

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
// through. An empty authority (an HTTP/1.0 request without Host, or an empty
// Host) passes Kind::any and Kind::local, the defaults: browsers always send
// a Host (the name a rebinding relies on), so such a request comes from a
// client that chose its target itself (HTTP/1.0 health checks). It matches
// no name of a Kind::listed rule: an operator who lists the hosts served
// gets those only, and "" is none of them (list "*" to answer any).
bool host_allowed(const core::HostRule& rule, std::string_view authority);

// True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104 (a v4-mapped loopback
// address): the listener addresses whose default is Kind::local.
bool is_loopback(const boost::asio::ip::address& addr);

// The admin listener's rule: `configured` (admin.allowed_hosts), or without
// it the default for the address the listener is bound to (Kind::local on a
// loopback address, else Kind::any).
core::HostRule effective_host_rule(const core::HostRule* configured, const boost::asio::ip::address& bound);

// The client listener's rule for one request: `configured`
// (server.allowed_hosts) for every request; without it, on a loopback
// listener Kind::local for a request to /metrics (`reads_metrics`: tenants,
// key ids, models, pools' addresses, what a rebinding page must not read),
// Kind::any otherwise: clients, proxies and health checkers reach the rest by
// any name (/health and /ready say only up or not; the API needs a key when
// auth is on, and with it off any page can already post to it cross-origin),
// so the default breaks none of them. A reference to `configured` or to a
// static rule: no copy per request.
const core::HostRule& client_host_rule(const core::HostRule* configured, bool loopback_listener, bool reads_metrics);

// An allowed_hosts option (`node`, written at `key`: "admin.allowed_hosts")
// as a rule: a list of host names without a port, IP literals (IPv6 with or
// without brackets), or "*" alone (Kind::any); one string is a list of one.
// Names are kept as normalize_host() makes them, sorted and without
// duplicates (a reload listing the same hosts in another order changes
// nothing). Errors (a wildcard other than "*" alone, a port, a name that is
// no host, an empty list or entry) name the key and the line; `listener`
// ("admin listener") says in the empty list's error whose names to list.
core::ConfigResult<core::HostRule> parse_allowed_hosts(const YAML::Node& node, std::string_view key,
                                                       std::string_view listener);

}  // namespace weir::gateway
