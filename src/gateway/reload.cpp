#include "gateway/reload.hpp"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

namespace weir::gateway {

namespace {

// The node at dotted `path` ("server.metrics") under `root`, or an undefined
// node. (yaml-cpp's Node::operator= writes into the tree: nodes are rebound
// with reset(), and read through const references so no key is created.)
YAML::Node at(const YAML::Node& root, std::string_view path) {
  YAML::Node n;
  n.reset(root);
  while (!path.empty()) {
    if (!n.IsDefined() || !n.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const auto dot = path.find('.');
    const std::string key(path.substr(0, dot));
    const YAML::Node& cur = n;
    const YAML::Node child = cur[key];
    if (!child.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    n.reset(child);
    path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
  }
  return n;
}

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
    {"auth.key_cache_entries", "keys in Redis are set up at start-up"},
    {"auth.budget_utc_offset", "calendar budget windows are aligned at start-up"},
};

core::ConfigError refused(const core::Config& next, const std::string& key, std::string_view top,
                          std::string_view why) {
  // The line of the section in the new file (of the root when it was removed there).
  const YAML::Node node = at(next.root, top);
  core::ConfigError e = core::config_error(node ? node : next.root, key,
                                           fmt::format("changes only at restart ({}); the file was not applied, the "
                                                       "running configuration is unchanged",
                                                       why));
  e.file = next.source;
  return e;
}

bool identity_on(const YAML::Node& root) { return root["auth"] || root["tenants"] || root["pricing"]; }

// Restart-only keys core::Config holds parsed, compared by value: a file
// that spells out a default (`server: {reuse_port: false}`), or writes the
// same value another way, changes nothing and reloads. nullopt for the
// others (sections other modules parse), compared as YAML.
std::optional<bool> same_value(std::string_view path, const core::Config& a, const core::Config& b) {
  const auto& x = a.server;
  const auto& y = b.server;
  if (path == "listen") return x.listen.host == y.listen.host && x.listen.port == y.listen.port;
  if (path == "workers") return x.workers == y.workers;
  if (path == "server.reuse_port") return x.reuse_port == y.reuse_port;
  if (path == "server.metrics") return x.metrics == y.metrics;
  if (path == "server.access_log") return x.access_log == y.access_log;
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
  if (static_cast<bool>(at(a, "auth.jwt")) != static_cast<bool>(at(b, "auth.jwt")))
    return refused(next, "auth.jwt", "auth", "the JWKS cache is set up at start-up");
  for (const auto& f : kFixed) {
    const std::string_view path = f.path;
    if ((path == "listen" && overrides.listen) || (path == "workers" && overrides.workers) ||
        (path == "server.access_log" && overrides.access_log))
      continue;
    const auto same = same_value(path, running, next);
    if (same && *same) continue;
    auto d = core::first_yaml_difference(at(a, path), at(b, path), std::string(path));
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
  for (const char* section : {"default_pool", "server", "auth", "pricing"})
    if (core::first_yaml_difference(a[section], b[section], section)) {
      if (!out.empty()) out += "; ";
      out += section;
      out += " ~";
    }
  return out.empty() ? "no change to pools, models, tenants, keys, prices or server settings" : out;
}

}  // namespace weir::gateway
