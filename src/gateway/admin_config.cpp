#include "gateway/admin_config.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "auth/jwt.hpp"

namespace weir::gateway {

namespace {

using core::config_error;

core::ConfigResult<std::optional<AdminConfig>> parse(const YAML::Node& root, const core::ListenAddress& client,
                                                     auth::GetEnv getenv_fn) {
  const YAML::Node node = root["admin"];
  if (!node) return std::optional<AdminConfig>{};
  if (!node.IsMap()) return tl::unexpected(config_error(node, "admin", "expected a mapping (listen, token_env, ...)"));
  if (auto ok = core::check_keys(
          node, "admin",
          {"listen", "token_sha256", "token_env", "jwt_claim", "keys_file", "allowed_hosts", "max_connections"});
      !ok)
    return tl::unexpected(ok.error());
  AdminConfig a;
  if (!node["listen"])
    return tl::unexpected(config_error(node, "admin.listen", "missing (host:port of the admin listener)"));
  WEIR_TRY_RESULT(listen, core::read_string(node["listen"], "admin.listen"));
  auto l = core::parse_listen(*listen);
  if (!l) return tl::unexpected(config_error(node["listen"], "admin.listen", l.error().message));
  if (l->port != 0 && l->port == client.port &&
      (l->host == client.host || l->host == "0.0.0.0" || client.host == "0.0.0.0" || l->host == "::" ||
       client.host == "::"))
    return tl::unexpected(config_error(node["listen"], "admin.listen",
                                       "must not be the client listener's address: the admin API has its own port"));
  a.listen = *l;
  if (node["token_sha256"] && node["token_env"])
    return tl::unexpected(config_error(node, "admin", "give one of token_sha256 and token_env, not both"));
  if (node["token_sha256"]) {
    WEIR_TRY_RESULT(hex, core::read_string(node["token_sha256"], "admin.token_sha256"));
    auto d = auth::parse_sha256_hex(*hex);
    if (!d) return tl::unexpected(config_error(node["token_sha256"], "admin.token_sha256", "expected 64 hex digits"));
    if (auth::is_empty_input_digest(*d))
      return tl::unexpected(
          config_error(node["token_sha256"], "admin.token_sha256",
                       "is the SHA-256 of the empty string (the hash of an unset variable?): no token has it, and an "
                       "Authorization header without a token is no credential"));
    a.token_sha256 = *d;
    a.has_token = true;
  } else if (node["token_env"]) {
    WEIR_TRY_RESULT(var, core::read_string(node["token_env"], "admin.token_env"));
    const char* value = getenv_fn(var->c_str());
    if (!value || !*value)
      return tl::unexpected(config_error(node["token_env"], "admin.token_env",
                                         fmt::format("environment variable {} is not set", core::quoted_text(*var))));
    if (!core::field_value_ok(value))
      return tl::unexpected(config_error(
          node["token_env"], "admin.token_env",
          fmt::format("the token in {} has characters an Authorization header cannot carry (a space or line break "
                      "at its ends, as a secret made from a file has; control characters or non-ASCII): no request "
                      "could present it",
                      core::quoted_text(*var))));
    if (std::string_view(value).size() < 16)
      return tl::unexpected(
          config_error(node["token_env"], "admin.token_env",
                       fmt::format("the token in {} is shorter than 16 characters", core::quoted_text(*var))));
    a.token_sha256 = auth::sha256(value);
    a.has_token = true;
  }
  if (node["jwt_claim"]) {
    WEIR_TRY_RESULT(c, core::read_name(node["jwt_claim"], "admin.jwt_claim"));
    if (std::string why = auth::claim_path_error(*c); !why.empty())
      return tl::unexpected(config_error(node["jwt_claim"], "admin.jwt_claim", why));
    const YAML::Node auth = root["auth"];
    if (!auth || !auth.IsMap() || !auth["jwt"])
      return tl::unexpected(config_error(node["jwt_claim"], "admin.jwt_claim",
                                         "needs auth.jwt (the admin JWT is verified like a client's)"));
    a.jwt_claim = std::move(*c);
  }
  if (!a.has_token && a.jwt_claim.empty())
    return tl::unexpected(
        config_error(node, "admin", "give token_sha256 or token_env (or jwt_claim): the admin API is never open"));
  if (node["keys_file"]) {
    WEIR_TRY_RESULT(f, core::read_string(node["keys_file"], "admin.keys_file"));
    if (f->empty()) return tl::unexpected(config_error(node["keys_file"], "admin.keys_file", "must not be empty"));
    // Runtime keys belong to tenants: without a tenants: section none can be created, and the file would be
    // ignored in silence.
    if (!root["tenants"])
      return tl::unexpected(config_error(node["keys_file"], "admin.keys_file",
                                         "needs a tenants: section (runtime keys belong to tenants; without one no key "
                                         "can be created)"));
    // Written on every key change (a temp file renamed over it): its directory must be there and writable now,
    // not found missing by the first POST /admin/v1/keys (a 500).
    const std::filesystem::path dir = std::filesystem::path(*f).parent_path();
    const std::string d = dir.empty() ? std::string(".") : dir.string();
    std::error_code ec;
    if (!std::filesystem::is_directory(d, ec) || ::access(d.c_str(), W_OK | X_OK) != 0)
      return tl::unexpected(config_error(
          node["keys_file"], "admin.keys_file",
          fmt::format("directory {} does not exist or is not writable", core::quoted_text(d, core::kQuotedPathBytes))));
    // (A FIFO there would hang the first read, at start-up or --check.)
    if (auto why = core::unreadable_file(*f, /*absent_ok=*/true); !why.empty())
      return tl::unexpected(config_error(node["keys_file"], "admin.keys_file",
                                         fmt::format("{} {}", core::quoted_text(*f, core::kQuotedPathBytes), why)));
    a.keys_file = std::move(*f);
  }
  if (const YAML::Node hosts = node["allowed_hosts"]) {
    auto rule = parse_allowed_hosts(hosts, "admin.allowed_hosts", "admin listener");
    if (!rule) return tl::unexpected(std::move(rule.error()));
    a.allowed_hosts = std::move(*rule);
  }
  if (node["max_connections"]) {
    WEIR_TRY(n, core::read_int(node["max_connections"], "admin.max_connections", 1, 100000));
    a.max_connections = static_cast<std::size_t>(n);
  }
  return std::optional<AdminConfig>(std::move(a));
}

}  // namespace

core::ConfigResult<std::optional<AdminConfig>> parse_admin_config(const YAML::Node& root,
                                                                  const core::ListenAddress& client,
                                                                  const std::string& file, auth::GetEnv getenv_fn) {
  if (!getenv_fn) getenv_fn = [](const char* n) -> const char* { return std::getenv(n); };
  auto r = parse(root, client, getenv_fn);
  if (!r) r.error().file = file;
  return r;
}

}  // namespace weir::gateway
