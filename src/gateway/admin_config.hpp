// The `admin:` section: the admin API's own listener (docs/admin-api.md).
// Without it nothing listens for admin requests.
#pragma once

#include <optional>
#include <string>

#include <yaml-cpp/yaml.h>

#include "auth/config.hpp"
#include "auth/crypto.hpp"
#include "core/config.hpp"
#include "core/yaml.hpp"
#include "gateway/host_rule.hpp"

namespace weir::gateway {

struct AdminConfig {
  core::ListenAddress listen;         // never the client listener's address
  bool has_token = false;             // token_sha256 or token_env given
  auth::Sha256Digest token_sha256{};  // SHA-256 of the admin token (the token itself is never kept)
  // Dotted path of a JWT claim that grants admin when it is `true` (a token
  // verified by auth.jwt, sent as the admin bearer); empty = JWTs are not admins.
  std::string jwt_claim;
  // Runtime keys persisted here (JSON, hashes only, mode 0600, replaced by
  // rename) when `redis:` does not hold them; empty = in memory only.
  std::string keys_file;
  // The hosts a request may name (its Host, or an absolute-form target's
  // authority): admin.allowed_hosts. nullopt = the default, chosen by the
  // address the listener binds (effective_host_rule: IP literals and
  // localhost on loopback, any host elsewhere).
  std::optional<core::HostRule> allowed_hosts;
  // admin.max_connections: connections the admin listener holds at once; one more is closed as it is
  // accepted (each takes a descriptor the client port's connections and upstream sockets share).
  std::size_t max_connections = 64;

  bool operator==(const AdminConfig&) const = default;
};

// Parses `root["admin"]`: nullopt when absent. Keys: listen (required),
// token_sha256 (64 hex digits) | token_env (a variable holding the token,
// hashed at load), jwt_claim (needs auth.jwt), keys_file, allowed_hosts
// (host names without a port, IP literals, or "*" alone), max_connections
// (1 to 100000, default 64). At least one of a
// token and jwt_claim. `listen` must differ from `client` (the client
// listener). Errors name file, line and key.
core::ConfigResult<std::optional<AdminConfig>> parse_admin_config(const YAML::Node& root,
                                                                  const core::ListenAddress& client,
                                                                  const std::string& file, auth::GetEnv getenv_fn);

}  // namespace weir::gateway
