// The `redis:` section: distributed admission state in Redis (docs/admission.md,
// "Distributed mode").
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <yaml-cpp/yaml.h>

#include "core/yaml.hpp"
#include "store/redis_client.hpp"

namespace weir::admission {

struct RedisConfig {
  // Where: redis://host[:port][/db]. Credentials never go in the URL (it is logged).
  std::string url = "redis://127.0.0.1:6379";
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  int db = 0;
  std::string username;              // Redis 6 ACL user; empty = the default user
  std::string password;              // from `password` or `password_env`; empty = no AUTH
  std::string key_prefix = "weir:";  // every key Weir writes starts with it

  // Outage: true = limit per replica from local state (LocalLimiter with each
  // limit × fail_open_share); false = refuse with 503 until Redis is back.
  bool fail_open = true;
  double fail_open_share = 1.0;  // (0, 1]; e.g. 1/replicas keeps the global total during an outage

  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds command_timeout{250};  // one sync round trip; longer = outage
  std::chrono::milliseconds reconnect_max{2000};   // backoff cap (starts at 50 ms, doubles)

  // Leases (docs/admission.md has the accuracy bound they set).
  std::chrono::milliseconds sync_interval{20};          // control-plane tick: low-water top-ups, debt, returns
  std::chrono::milliseconds budget_sync_interval{200};  // spend pushed and read back per active budget
  std::chrono::milliseconds lease_window{100};          // a replica's lease ≈ this much of the bucket's rate ...
  double lease_max_share = 0.05;                        // ... but at most this share of the bucket's depth
  std::uint64_t lease_min_tokens = 1024;                // ... and at least this many tokens (requests: 1)
  std::chrono::milliseconds lease_idle{1000};           // a lease untouched this long goes back to Redis
  std::chrono::milliseconds slot_ttl{10000};  // a replica's stream slots expire this long after its last renewal

  bool operator==(const RedisConfig&) const = default;
};

using GetEnvFn = const char* (*)(const char*);

// Parses `root["redis"]`: nullopt when the section is absent (in-process
// limits). Keys: url, username, password | password_env, key_prefix,
// fail_open, fail_open_share, connect_timeout, command_timeout,
// reconnect_max, sync_interval, budget_sync_interval, lease_window,
// lease_max_share, lease_min_tokens, lease_idle, slot_ttl. Errors name the
// file, line and key; unknown keys are errors.
core::ConfigResult<std::optional<RedisConfig>> parse_redis_config(const YAML::Node& root,
                                                                  const std::string& file = "<config>",
                                                                  GetEnvFn getenv_fn = nullptr);

// The connection settings of `rc` for store::Client (host, port, db,
// credentials, timeouts); `log` is left for the caller. One mapping for
// every Redis client Weir opens (key store, limiter).
store::ClientOptions client_options(const RedisConfig& rc);

}  // namespace weir::admission
