#include "gateway/reload.hpp"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "admission/redis_config.hpp"
#include "auth/config.hpp"
#include "gateway/admin_config.hpp"
#include "requestlog/config.hpp"
#include "tracing/config.hpp"

namespace weir::gateway {

namespace {

struct Fixed {
  const char* path;  // dotted key under the root
  const char* why;   // what the process built from it at start-up
};

// Keys whose value the process was built around (see the top of reload.hpp).
constexpr Fixed kFixed[] = {
    {"listen", "the workers' listening sockets are bound at start-up"},
    {"workers", "the worker threads start at start-up"},
    {"server.reuse_port", "the listening sockets are bound at start-up"},
    {"server.metrics", "the label sets of /metrics are fixed at start-up"},
    {"server.access_log", "the access log is opened at start-up (SIGHUP reopens the same path, for log rotation)"},
    {"redis", "the Redis connections and the shared limiter are set up at start-up"},
    {"admin", "the admin API listener is bound at start-up"},
    {"request_log", "the request-log store is opened at start-up"},
    {"tracing", "the tracer and its exporter are set up at start-up"},
    {"auth.jwt.jwks_url", "the JWKS cache is set up at start-up"},
    {"auth.jwt.jwks_file", "the JWKS cache is set up at start-up"},
    {"auth.jwt.refresh_interval", "the JWKS cache is set up at start-up"},
    {"auth.jwt.min_refetch_interval", "the JWKS cache is set up at start-up"},
    {"auth.jwt.fetch_timeout", "the JWKS cache is set up at start-up"},
    {"auth.jwt.cache_entries", "each worker's token cache is sized at start-up"},
    {"auth.redis_keys", "keys in Redis are set up at start-up"},
    {"auth.key_cache_ttl", "keys in Redis are set up at start-up"},
    {"auth.key_negative_ttl", "keys in Redis are set up at start-up"},
    {"auth.key_stale_ttl", "keys in Redis are set up at start-up"},
    {"auth.key_cache_entries", "keys in Redis are set up at start-up"},
    {"auth.budget_utc_offset", "calendar budget windows are aligned at start-up"},
};

core::ConfigError refused(const core::Config& next, const std::string& key, std::string_view top,
                          std::string_view why) {
  // The line of the key in the new file, else of the nearest section above
  // it that is there (of the root when the section was removed).
  YAML::Node node = core::node_at(next.root, top);
  for (std::string_view k = key; k.size() > top.size(); k = k.substr(0, k.rfind('.'))) {
    if (const YAML::Node n = core::node_at(next.root, k); n.IsDefined()) {
      node.reset(n);
      break;
    }
    if (k.find('.') == std::string_view::npos) break;
  }
  core::ConfigError e = core::config_error(node ? node : next.root, key,
                                           fmt::format("changes only at restart ({}); the file was not applied, the "
                                                       "running configuration is unchanged",
                                                       why));
  e.file = next.source;
  return e;
}

bool identity_on(const YAML::Node& root) { return root["auth"] || root["tenants"] || root["pricing"]; }

// Whether clients' credentials are Weir's to check (auth::AuthConfig::verifies_credentials, as
// gateway::load_config sets it): with an auth: section, or with the admin API's runtime keys for tenants.
bool checks_credentials(const YAML::Node& root) { return root["auth"] || (root["admin"] && root["tenants"]); }

// The restart-only sections other modules parse, as they parse them (each
// nullopt when absent, or when it does not parse: then compared as YAML).
struct Sections {
  std::optional<auth::AuthConfig> auth;
  std::optional<std::optional<admission::RedisConfig>> redis;
  std::optional<std::optional<AdminConfig>> admin;
  std::optional<std::optional<requestlog::RequestLogConfig>> request_log;
  std::optional<std::optional<tracing::TracingConfig>> tracing;
};

template <typename T>
std::optional<T> parsed(core::ConfigResult<T> r) {
  if (!r) return std::nullopt;
  return std::move(*r);
}

const char* env(const char* name) { return std::getenv(name); }

Sections parse_sections(const core::Config& c) {
  Sections s;
  const auto& file = c.source;
  if (c.root["auth"] || c.root["tenants"] || c.root["pricing"])
    s.auth = parsed(auth::parse_auth_config(c.root, file, &env));
  s.redis = parsed(admission::parse_redis_config(c.root, file, &env));
  s.admin = parsed(parse_admin_config(c.root, c.server.listen, file, &env));
  s.request_log = parsed(requestlog::parse_request_log_config(c.root, file));
  s.tracing = parsed(tracing::parse_tracing_config(c.root, file, &env));
  return s;
}

// A copy of the map `n` without `key` (`n` itself when it is no map or has no such key).
YAML::Node without_key(const YAML::Node& n, const char* key) {
  if (!n || !n.IsMap() || !n[key]) return n;
  YAML::Node copy = YAML::Clone(n);
  copy.remove(key);
  return copy;
}

// `a` and `b` compared when both parsed.
template <typename T>
std::optional<bool> both(const std::optional<T>& a, const std::optional<T>& b) {
  if (!a || !b) return std::nullopt;
  return *a == *b;
}

// Restart-only keys compared by their parsed value: a file that spells out
// a default (`server: {reuse_port: false}`, `auth: {key_cache_ttl: 30s}`),
// or writes the same value another way (`+00:00` for `Z`, `0.1s` for
// `100ms`), changes nothing and reloads. nullopt when a side did not parse:
// compared as YAML.
std::optional<bool> same_value(std::string_view path, const core::Config& a, const core::Config& b, const Sections& sa,
                               const Sections& sb) {
  const auto& x = a.server;
  const auto& y = b.server;
  // (workers 0 is one per core, as server.cpp starts them.)
  const auto workers = [](unsigned w) { return w ? w : std::max(1u, std::thread::hardware_concurrency()); };
  if (path == "listen") return x.listen == y.listen;
  if (path == "workers") return workers(x.workers) == workers(y.workers);
  if (path == "server.reuse_port") return x.reuse_port == y.reuse_port;
  if (path == "server.metrics") {
    // Only the label sets are fixed (MetricLabels keeps the first generation's). client_port is read per
    // request from the request's generation (phases/read.cpp), so it follows a reload, and so does its
    // default, which tenants: and admin.listen decide (load_config.cpp): adding the first tenant or
    // removing the last one is not a change to server.metrics.
    auto p = x.metrics;
    p.client_port = y.metrics.client_port;
    return p == y.metrics;
  }
  if (path == "server.access_log") return x.access_log == y.access_log;
  if (path == "redis") return both(sa.redis, sb.redis);
  if (path == "admin") return both(sa.admin, sb.admin);
  if (path == "request_log") return both(sa.request_log, sb.request_log);
  if (path == "tracing") return both(sa.tracing, sb.tracing);
  if (!path.starts_with("auth.") || !sa.auth || !sb.auth) return std::nullopt;
  const auto& p = *sa.auth;
  const auto& q = *sb.auth;
  if (path == "auth.redis_keys") return p.redis_keys == q.redis_keys;
  if (path == "auth.key_cache_ttl") return p.key_cache_ttl == q.key_cache_ttl;
  if (path == "auth.key_negative_ttl") return p.key_negative_ttl == q.key_negative_ttl;
  if (path == "auth.key_stale_ttl") return p.key_stale_ttl == q.key_stale_ttl;
  if (path == "auth.key_cache_entries") return p.key_cache_entries == q.key_cache_entries;
  if (path == "auth.budget_utc_offset") return p.budget_utc_offset_s == q.budget_utc_offset_s;
  if (!p.jwt || !q.jwt) return std::nullopt;  // (auth.jwt turned on or off is refused before)
  const auto& j = *p.jwt;
  const auto& k = *q.jwt;
  if (path == "auth.jwt.jwks_url") return j.jwks_url == k.jwks_url;
  if (path == "auth.jwt.jwks_file") return j.jwks_file == k.jwks_file;
  if (path == "auth.jwt.refresh_interval") return j.refresh_interval == k.refresh_interval;
  if (path == "auth.jwt.min_refetch_interval") return j.min_refetch_interval == k.min_refetch_interval;
  if (path == "auth.jwt.fetch_timeout") return j.fetch_timeout == k.fetch_timeout;
  if (path == "auth.jwt.cache_entries") return j.cache_entries == k.cache_entries;
  return std::nullopt;
}

}  // namespace

std::optional<core::ConfigError> restart_only_change(const core::Config& running, const core::Config& next,
                                                     const CommandLineOverrides& overrides) {
  const YAML::Node& a = running.root;
  const YAML::Node& b = next.root;
  if (!a || !b) return std::nullopt;  // quick mode has no file to reload
  if (identity_on(a) != identity_on(b)) {
    const YAML::Node& on = identity_on(b) ? b : a;
    const std::string key = on["auth"] ? "auth" : on["tenants"] ? "tenants" : "pricing";
    return refused(next, key, identity_on(b) ? key : "",
                   "identity and admission (auth:, tenants:, pricing:) are turned on or off at start-up");
  }
  // Authentication turned on or off: a file that lost its auth: block (a template that dropped it) would
  // admit every request as the anonymous tenant, any credential unchecked; one that gained it would refuse
  // every client without a key. Keys added or removed inside auth: reload.
  constexpr std::string_view kCredentials =
      "whether clients' credentials are checked is set at start-up: without auth: or the admin API's runtime "
      "keys, every request runs as the anonymous tenant, any credential unchecked";
  if (static_cast<bool>(a["auth"]) != static_cast<bool>(b["auth"]))
    return refused(next, "auth", b["auth"] ? "auth" : "", kCredentials);
  if (checks_credentials(a) != checks_credentials(b) && static_cast<bool>(a["admin"]) == static_cast<bool>(b["admin"]))
    return refused(next, "tenants", b["tenants"] ? "tenants" : "", kCredentials);
  if (static_cast<bool>(core::node_at(a, "auth.jwt")) != static_cast<bool>(core::node_at(b, "auth.jwt")))
    return refused(next, "auth.jwt", "auth", "the JWKS cache is set up at start-up");
  const Sections sa = parse_sections(running);
  const Sections sb = parse_sections(next);
  for (const auto& f : kFixed) {
    const std::string_view path = f.path;
    if ((path == "listen" && overrides.listen) || (path == "workers" && overrides.workers) ||
        (path == "server.access_log" && overrides.access_log))
      continue;
    const auto same = same_value(path, running, next, sa, sb);
    if (same && *same) continue;
    YAML::Node pa = core::node_at(a, path);
    YAML::Node pb = core::node_at(b, path);
    if (path == "server.metrics") {  // (client_port follows a reload: never the difference named)
      pa = without_key(pa, "client_port");
      pb = without_key(pb, "client_port");
    }
    auto d = core::first_yaml_difference(pa, pb, std::string(path));
    if (!d && same) d = std::string(path);  // (different values, though no YAML difference names one)
    if (d) return refused(next, *d, path.substr(0, path.find('.')), f.why);
  }
  return std::nullopt;
}

namespace {

// "+a -b ~c" for the names of two sets of (name, canonical text).
void diff_names(std::string& out, std::string_view what, const std::vector<std::pair<std::string, std::string>>& a,
                const std::vector<std::pair<std::string, std::string>>& b) {
  // (By index: a search per name was quadratic in a large models: section.)
  std::unordered_map<std::string_view, std::string_view> before, after;
  before.reserve(a.size());
  after.reserve(b.size());
  for (const auto& [n, t] : a) before[n] = t;  // (the last of a repeated name, as the search found)
  for (const auto& [n, t] : b) after[n] = t;
  std::string d;
  for (const auto& [name, text] : b) {
    const auto it = before.find(name);
    if (it == before.end())
      d += " +" + name;
    else if (it->second != text)
      d += " ~" + name;
  }
  for (const auto& [name, text] : a)
    if (!after.contains(name)) d += " -" + name;
  if (d.empty()) return;
  if (!out.empty()) out += "; ";
  out += what;
  out += d;
}

std::vector<std::pair<std::string, std::string>> entries(const YAML::Node& map) {
  std::vector<std::pair<std::string, std::string>> out;
  if (map && map.IsMap())
    for (const auto& kv : map) out.emplace_back(kv.first.Scalar(), core::canonical_yaml(kv.second));
  return out;
}

}  // namespace

namespace {
constexpr std::string_view kNoChange = "no change to pools, models, tenants, keys, prices or server settings";
}  // namespace

std::string describe_changes(const core::Config& running, const core::Config& next,
                             const std::vector<std::string>& rebuilt) {
  std::string out;
  const YAML::Node& a = running.root;
  const YAML::Node& b = next.root;
  auto pools_before = entries(a["pools"]);
  for (auto& [name, text] : pools_before)
    if (std::find(rebuilt.begin(), rebuilt.end(), name) != rebuilt.end()) text += '\n';  // (differs: "~name")
  diff_names(out, "pools", pools_before, entries(b["pools"]));
  diff_names(out, "models", entries(a["models"]), entries(b["models"]));
  diff_names(out, "tenants", entries(a["tenants"]), entries(b["tenants"]));
  // A section's settings by name ("server ~max_body +watch_config"), so the line says what changed.
  for (const char* section : {"server", "auth", "pricing"})
    diff_names(out, section, entries(a[section]), entries(b[section]));
  if (core::first_yaml_difference(a["default_pool"], b["default_pool"], "default_pool")) {
    if (!out.empty()) out += "; ";
    out += "default_pool ~";
  }
  return out.empty() ? std::string(kNoChange) : out;
}

bool no_change(std::string_view changes) { return changes == kNoChange; }

}  // namespace weir::gateway
