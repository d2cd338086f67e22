// Weir's whole configuration, loaded by one function for `weir --check` and
// for start-up alike: the core snapshot (listen, workers, server, pools,
// models, default_pool) and the sections other modules own (auth:,
// tenants:, pricing:, redis:), each parsed and validated once, with errors
// that name the file, line and key (core::ConfigError) and warnings for
// what is valid but cannot do anything.
//
// It lives in gateway, not core, because it calls auth and admission
// parsers (module order core < ... < auth < admission < ... < gateway).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "admission/pricing.hpp"
#include "admission/redis_config.hpp"
#include "auth/config.hpp"
#include "core/config.hpp"
#include "gateway/admin_config.hpp"
#include "http/upstream.hpp"  // http::TlsClient (declared)
#include "requestlog/config.hpp"
#include "tracing/config.hpp"

namespace weir::gateway {

// What start-up needs, parsed: nothing in it is read from YAML again.
struct LoadedConfig {
  core::Config config;  // the snapshot the workers share
  // auth: and tenants:, present when any of auth:, tenants: or pricing: is
  // in the file (identity and admission on); nullopt = every request is
  // anonymous and no limit applies.
  std::optional<auth::AuthConfig> auth;
  admission::Pricing pricing;                               // pricing:, empty without one
  std::optional<admission::RedisConfig> redis;              // redis:, when present
  std::optional<AdminConfig> admin;                         // admin:, when present (the admin API listens)
  std::optional<requestlog::RequestLogConfig> request_log;  // request_log:, when present
  std::optional<tracing::TracingConfig> tracing;            // tracing:, when present
  // The contents of auth.jwt.jwks_file as this load read and checked them
  // (a key set with a usable key); empty without one. Start-up fetches the
  // file itself; a reload installs these (Services::reload_jwks).
  std::string jwks_text;
  // Valid but probably wrong, each "FILE:LINE:COL: KEY: message" (an
  // allow-list entry or a price no model matches, a redis: section nothing
  // uses). --check and start-up print them as "weir: warning: ..." to stderr
  // and go on.
  std::vector<std::string> warnings;
  // Per pool (index as in config.pools): the TLS client context of its
  // https:// endpoints, built here so --check refuses a ca_file or client
  // certificate OpenSSL cannot load; null for a pool without https://.
  std::vector<std::shared_ptr<http::TlsClient>> tls;
};

// Where the configuration comes from: the command line.
struct ConfigSource {
  std::string file;      // --config FILE; empty = quick mode
  std::string upstream;  // --upstream URL (quick mode: every model goes there)
  std::string listen;    // --listen HOST:PORT; empty = the file's (quick mode: 127.0.0.1:8080)
};

// Loads `source`: reads the file (or builds the quick-mode snapshot), parses
// every section and computes the warnings. A missing file, a YAML error, an
// unknown key, a wrong type, an undefined tenant, a malformed sha256, an
// unset *_env variable, an invalid price or Redis URL are all ConfigErrors
// (the caller prints "weir: configuration error: ..." and exits 2).
// `getenv_fn` (nullptr = std::getenv) serves auth's key_env and redis'
// password_env; pools' api_key_env uses std::getenv.
core::ConfigResult<LoadedConfig> load_config(const ConfigSource& source, auth::GetEnv getenv_fn = nullptr);

// The listeners' addresses as start-up binds them (core::resolve_listen_host):
// server.listen's host and admin.listen's host resolve, and the two do not
// overlap (core::listen_addresses_overlap: `localhost:8080` and
// `127.0.0.1:8080`, or `0.0.0.0:8080` and `127.0.0.1:8080`, are one
// listener). Error: "FILE: listen: ..." or "FILE: admin.listen: ...", for
// "weir: configuration error: " (exit 2). --check and start-up both call
// it; a reload does not (listen changes at restart only). Resolves names:
// not for a worker's thread.
tl::expected<void, std::string> check_listen_addresses(const LoadedConfig& loaded);

// The same for YAML text in memory (tests); `file_name` goes into errors.
core::ConfigResult<LoadedConfig> load_config_text(std::string_view yaml, const std::string& file_name,
                                                  auth::GetEnv getenv_fn = nullptr);

}  // namespace weir::gateway
