// Which hosts a listener answers (admin.allowed_hosts, server.allowed_hosts):
// the data alone, so core::ServerConfig can hold it. The matching and the
// parsing of the option are gateway/host_rule.hpp's (an entry is checked as
// a Host field's value is: http::valid_host).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weir::core {

struct HostRule {
  enum class Kind : std::uint8_t {
    // "*", or the default where no web page can reach the listener by a
    // name of its own: any host.
    any,
    // The default on a loopback listener: IP literals (v4, [v6]) and
    // `localhost`, the names no other site's page can be served under (a
    // DNS rebinding needs a DNS name its owner controls).
    local,
    // The option as listed: `names` only.
    listed,
  };
  Kind kind = Kind::any;
  std::vector<std::string> names;  // listed: each as gateway::normalize_host() makes it, sorted

  bool operator==(const HostRule&) const = default;
};

}  // namespace weir::core
