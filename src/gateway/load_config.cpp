#include "gateway/load_config.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/exceptions.h>

#include "auth/jwk.hpp"
#include "core/listen_probe.hpp"
#include "gateway/host_rule.hpp"
#include "http/tls.hpp"

namespace weir::gateway {

namespace {

// How an allow-list entry or a price key relates to the configured models.
struct Match {
  bool served = false;   // a configured (canonical) model name matches
  std::string alias_of;  // else: the model whose alias it matches, if any
};

// The configured model names and aliases, sorted: an allow-list entry or a
// price key is matched in O(log n). (A scan of every model per entry made
// 1,000,000 allow-list entries, a list of 200 named by 4,900 aliases,
// against 5,000 models take 70 s of --check, start-up or a reload.)
class ModelIndex {
 public:
  explicit ModelIndex(const core::Config& c) {
    for (const auto& model : c.models) {
      names_.push_back(model.name);
      for (const auto& a : model.aliases) aliases_.emplace_back(a, model.name);
    }
    std::sort(names_.begin(), names_.end());
    std::sort(aliases_.begin(), aliases_.end());
  }

  // `entry` is an exact name, or "prefix*" in an allow-list (`prefixes`). A
  // prefix matching the aliases of several models names the first alias's.
  Match match(std::string_view entry, bool prefixes) const {
    Match m;
    const bool prefix = prefixes && !entry.empty() && entry.back() == '*';
    const std::string_view stem = prefix ? entry.substr(0, entry.size() - 1) : entry;
    auto hit = [&](std::string_view name) { return prefix ? name.starts_with(stem) : name == stem; };
    if (const auto it = std::lower_bound(names_.begin(), names_.end(), stem); it != names_.end() && hit(*it)) {
      m.served = true;
      return m;
    }
    const auto it = std::lower_bound(aliases_.begin(), aliases_.end(), stem,
                                     [](const auto& a, std::string_view s) { return a.first < s; });
    if (it != aliases_.end() && hit(it->first)) m.alias_of = std::string(it->second);
    return m;
  }

 private:
  std::vector<std::string_view> names_;
  std::vector<std::pair<std::string_view, std::string_view>> aliases_;  // (alias, its model)
};

// The warnings of one load. A value the file names through aliases (*name)
// is one node, warned about once per key that names it: the first few such
// warnings (same place, same message) are said, then one line for the rest,
// so 20,000 aliases of an unknown model make 4 lines, not 20,000.
class Warnings {
 public:
  explicit Warnings(LoadedConfig& out) : out(out) {}
  LoadedConfig& out;

  void add(const YAML::Node& node, std::string key, std::string message) {
    auto e = core::config_error(node, std::move(key), std::move(message));
    e.file = out.config.source;
    if (e.line > 0) {
      auto& g = groups_[fmt::format("{}:{}:{}", e.line, e.column, e.message)];
      if (++g.count > kShown) {
        if (g.count == kShown + 1) g.first_hidden = std::move(e);
        return;
      }
      g.last_shown = out.warnings.size();
    }
    out.warnings.push_back(e.to_string());
  }

  // The line for each group's hidden rest, after its last warning said.
  void finish() {
    std::vector<std::pair<std::size_t, std::string>> rest;  // (after index, line)
    for (auto& [_, g] : groups_) {
      if (g.count <= kShown) continue;
      g.first_hidden.message = fmt::format(
          "the same warning as above, here and for {} more keys that name this value through an alias (*name)",
          g.count - kShown - 1);
      rest.emplace_back(g.last_shown, g.first_hidden.to_string());
    }
    if (rest.empty()) return;
    std::sort(rest.begin(), rest.end());
    std::vector<std::string> all;
    all.reserve(out.warnings.size() + rest.size());
    std::size_t r = 0;
    for (std::size_t i = 0; i < out.warnings.size(); ++i) {
      all.push_back(std::move(out.warnings[i]));
      for (; r < rest.size() && rest[r].first == i; ++r) all.push_back(std::move(rest[r].second));
    }
    out.warnings = std::move(all);
  }

 private:
  static constexpr std::size_t kShown = 3;
  struct Group {
    std::size_t count = 0;
    std::size_t last_shown = 0;  // index in out.warnings
    core::ConfigError first_hidden;
  };
  std::unordered_map<std::string, Group> groups_;
};

void warn(Warnings& w, const YAML::Node& node, std::string key, std::string message) {
  w.add(node, std::move(key), std::move(message));
}

// Allow-lists are matched against the configured model name (an alias is
// resolved first), so an entry that names no configured model allows nothing.
void check_allow_list(Warnings& w, const ModelIndex& index, const YAML::Node& models, const std::string& key) {
  const LoadedConfig& out = w.out;
  if (!models) return;
  if (models.IsSequence() && models.size() == 0) {
    warn(w, models, key, "an empty allow-list allows no model: omit it (or list \"*\") to allow every model");
    return;
  }
  auto one = [&](const YAML::Node& n, const std::string& k) {
    const std::string& entry = n.Scalar();
    if (entry == "*" || out.config.default_pool) return;  // with a default_pool any model name is served
    const Match m = index.match(entry, true);
    if (m.served) return;
    if (!m.alias_of.empty())
      warn(w, n, k,
           fmt::format("{} is an alias of model {}: allow-lists match the configured model name, so this entry "
                       "allows nothing; list {}",
                       core::quoted_text(entry), core::quoted_text(m.alias_of), core::quoted_text(m.alias_of)));
    else
      warn(w, n, k,
           fmt::format("no configured model or alias matches {} and there is no default_pool: this entry allows "
                       "nothing",
                       core::quoted_text(entry)));
  };
  if (models.IsScalar()) {
    one(models, key);
    return;
  }
  for (std::size_t i = 0; i < models.size(); ++i) one(models[i], fmt::format("{}[{}]", key, i));
}

// A limit of 0 is no limit (as the admin API's PATCH removes one), where a
// budget's usd: 0 freezes its scope and other gateways' 0 refuses everything:
// said once per such key, with how to refuse every request.
void check_zero_limits(Warnings& w, const YAML::Node& limits, const std::string& key) {
  if (!limits || !limits.IsMap()) return;
  for (const char* name : {"requests_per_minute", "tokens_per_minute", "max_concurrent_streams"}) {
    const YAML::Node v = limits[name];
    if (v && v.IsScalar() && v.Scalar() == "0")
      warn(w, v, key + "." + name,
           "0 means no limit (omit the key to say so); to refuse every request give the scope `budget: {usd: 0}` "
           "or `models: []`");
  }
}

// A budget period given as a bare number is milliseconds (as every duration): `period: 86400` is 86.4 s, not a
// day, and the budget resets a thousand times a day. A period is days or hours in practice, so a bare number
// is most likely seconds (or a typo of a unit): said, with how it was read and how to write it. 0 (never) is
// no mistake.
void check_bare_period(Warnings& w, const YAML::Node& budget, const std::string& key) {
  if (!budget || !budget.IsMap()) return;
  const YAML::Node p = budget["period"];
  if (!p || !p.IsScalar() || p.Scalar().empty()) return;
  const std::string& v = p.Scalar();
  if (!std::all_of(v.begin(), v.end(), [](unsigned char c) { return std::isdigit(c); })) return;
  const std::uint64_t ms = std::strtoull(v.c_str(), nullptr, 10);
  if (ms == 0) return;
  warn(w, p, key + ".period",
       fmt::format("{} is read as {} ms ({:g} s): a bare number is milliseconds; for {} seconds write {}s{}", v, v,
                   static_cast<double>(ms) / 1000.0, v, v,
                   ms == 86400      ? std::string(", 24h, or day for the calendar day")
                   : ms % 3600 == 0 ? fmt::format(" or {}h", ms / 3600)
                   : ms % 60 == 0   ? fmt::format(" or {}m", ms / 60)
                                    : std::string()));
}

// server.metrics.client_port's default: /metrics carries every tenant's spend, budget and request counts, and
// the client port answers it without credentials, so with tenants it is served only on the admin listener when
// there is one; without one it stays on the client port (else nothing could scrape it), said at start-up.
// vLLM serves /metrics on its one port, but has no tenants to tell apart.
void default_metrics_port(Warnings& w) {
  LoadedConfig& out = w.out;
  auto& m = out.config.server.metrics;
  const auto& root = out.config.root;
  if (!root || core::node_at(root, "server.metrics.client_port").IsDefined()) return;  // the file says
  const auto tenants = root["tenants"];
  if (!tenants || !tenants.IsMap() || tenants.size() == 0) return;
  if (out.admin) {
    m.client_port = false;
    return;
  }
  warn(w, tenants, "tenants",
       "GET /metrics on the client port shows every tenant's spend to anyone who reaches it: add admin.listen "
       "to serve it there only, or set server.metrics.client_port");
}

void compute_warnings(Warnings& w) {
  const LoadedConfig& out = w.out;
  const ModelIndex index(out.config);
  const auto& root = out.config.root;
  if (const auto tenants = root["tenants"]; tenants && tenants.IsMap())
    for (const auto& kv : tenants)
      if (kv.second.IsMap()) {
        check_allow_list(w, index, kv.second["models"], "tenants." + kv.first.Scalar() + ".models");
        check_zero_limits(w, kv.second["limits"], "tenants." + kv.first.Scalar() + ".limits");
        check_bare_period(w, kv.second["budget"], "tenants." + kv.first.Scalar() + ".budget");
      }
  if (const auto auth = root["auth"]; auth && auth.IsMap())
    if (const auto keys = auth["api_keys"]; keys && keys.IsSequence())
      for (std::size_t i = 0; i < keys.size(); ++i) {
        check_allow_list(w, index, keys[i]["models"], fmt::format("auth.api_keys[{}].models", i));
        check_zero_limits(w, keys[i]["limits"], fmt::format("auth.api_keys[{}].limits", i));
        check_bare_period(w, keys[i]["budget"], fmt::format("auth.api_keys[{}].budget", i));
      }
  // With a default_pool any model name is served (and priced as sent).
  if (!out.config.default_pool) {
    if (const auto pricing = root["pricing"]; pricing && pricing.IsMap()) {
      for (const auto& kv : pricing) {
        const std::string model = kv.first.Scalar();
        if (model == "*") continue;
        const Match m = index.match(model, false);
        if (m.served) continue;
        if (!m.alias_of.empty())
          warn(w, kv.first, "pricing." + model,
               fmt::format("{} is an alias of model {}: prices apply to the configured model name, so this "
                           "price is never used; price {}",
                           core::quoted_text(model), core::quoted_text(m.alias_of), core::quoted_text(m.alias_of)));
        else
          warn(w, kv.first, "pricing." + model,
               fmt::format("no configured model is named {} and there is no default_pool: this price is never used",
                           core::quoted_text(model)));
      }
    }
  }
  // Credentials required with nothing to check them against: every request is a 401.
  if (out.auth && root["auth"] && out.auth->required && out.auth->api_keys.empty() && !out.auth->jwt &&
      !out.auth->redis_keys && !(out.admin && root["tenants"]))
    warn(w, root["auth"], "auth",
         "credentials are required (auth.required defaults to true) but there are no api_keys, no jwt, no "
         "redis_keys and no admin API with tenants for runtime keys: every request will be refused with 401");
  // Tenants no credential can name: with no auth: section (and no admin API for runtime keys), or auth.required
  // false and nothing to check a key against, every request runs as the anonymous tenant: the others' limits
  // and budgets never apply (a dropped auth: block, the rest of the file kept).
  if (out.auth && (!out.auth->verifies_credentials || !out.auth->required)) {
    const auto& a = *out.auth;
    const bool named =
        a.verifies_credentials && (!a.api_keys.empty() || a.jwt || a.redis_keys || (out.admin && root["tenants"]));
    const auto other =
        std::find_if(a.tenants.begin(), a.tenants.end(), [&](const auto& t) { return t.first != a.anonymous_tenant; });
    if (!named && other != a.tenants.end())
      warn(w, root["tenants"], "tenants",
           fmt::format("every request runs as the anonymous tenant {}: {}, so no credential names tenant {}{} and "
                       "its limits and budget never apply; give auth: keys (api_keys, jwt or redis_keys) that name "
                       "the tenants",
                       core::quoted_text(a.anonymous_tenant),
                       root["auth"] ? "auth: has no api_keys, jwt or redis_keys, and no admin API holds runtime keys"
                                    : "there is no auth: section, and no admin API holds runtime keys",
                       core::quoted_text(other->first),
                       a.tenants.size() - a.tenants.count(a.anonymous_tenant) > 1 ? " (nor any other)" : ""));
  }
  // A JWT checked for its signature only: an identity provider's JWKS signs the tokens of every application it
  // serves, so one minted for another of them would be accepted here (RFC 8725 §3.9: cross-JWT confusion).
  if (out.auth && out.auth->jwt && out.auth->jwt->issuer.empty() && out.auth->jwt->audiences.empty())
    warn(w, core::node_at(root, "auth.jwt"), "auth.jwt",
         "neither audience nor issuer is set: any unexpired token the JWKS's keys signed is accepted, one an "
         "identity provider shared with other applications minted for another of them too (RFC 8725 §3.9): set "
         "audience to the value this gateway's tokens carry in \"aud\" (and issuer)");
  if (out.redis && !out.auth)
    warn(w, root["redis"], "redis",
         "without auth:, tenants: or pricing: there are no limits, budgets or keys to share: the section is checked "
         "and not used");
}

// The sections beyond core's, and the warnings, for a parsed snapshot.
core::ConfigResult<LoadedConfig> load_sections_unguarded(core::Config config, auth::GetEnv getenv_fn);

// A value of a shape no section's reader expected (yaml-cpp throws on a conversion it cannot make) is a
// configuration error at its place, exit 2, never an abort of --check or start-up.
core::ConfigResult<LoadedConfig> load_sections(core::Config config, auth::GetEnv getenv_fn) {
  const std::string file = config.source;
  try {
    return load_sections_unguarded(std::move(config), getenv_fn);
  } catch (const YAML::Exception& e) {
    core::ConfigError err;
    err.file = file;
    if (!e.mark.is_null()) {
      err.line = e.mark.line + 1;
      err.column = e.mark.column + 1;
    }
    err.message = fmt::format("a value of an unexpected shape ({})", e.msg);
    return tl::unexpected(std::move(err));
  }
}

core::ConfigResult<LoadedConfig> load_sections_unguarded(core::Config config, auth::GetEnv getenv_fn) {
  LoadedConfig out;
  Warnings w(out);
  out.config = std::move(config);
  const auto& root = out.config.root;
  const std::string& file = out.config.source;
  if (root) {
    // Every section is parsed whether or not it is used, so --check and
    // start-up refuse the same files.
    auto auth_cfg = auth::parse_auth_config(root, file, getenv_fn);
    if (!auth_cfg) return tl::unexpected(std::move(auth_cfg.error()));
    auto pricing = admission::parse_pricing_config(root, file);
    if (!pricing) return tl::unexpected(std::move(pricing.error()));
    auto redis = admission::parse_redis_config(root, file, getenv_fn);
    if (!redis) return tl::unexpected(std::move(redis.error()));
    auto admin = parse_admin_config(root, out.config.server.listen, file, getenv_fn);
    if (!admin) return tl::unexpected(std::move(admin.error()));
    out.admin = std::move(*admin);
    // server.allowed_hosts, here rather than with the rest of server: in core: its entries are checked as a
    // Host value is (http), with admin.allowed_hosts' reader.
    if (const YAML::Node server = root["server"]; server && server.IsMap())
      if (const YAML::Node hosts = server["allowed_hosts"]) {
        auto rule = parse_allowed_hosts(hosts, "server.allowed_hosts", "client listener");
        if (!rule) {
          rule.error().file = file;
          return tl::unexpected(std::move(rule.error()));
        }
        out.config.server.allowed_hosts = std::move(*rule);
      }
    auto request_log = requestlog::parse_request_log_config(root, file);
    if (!request_log) return tl::unexpected(std::move(request_log.error()));
    out.request_log = std::move(*request_log);
    auto tracing_cfg = tracing::parse_tracing_config(root, file, getenv_fn);
    if (!tracing_cfg) return tl::unexpected(std::move(tracing_cfg.error()));
    out.tracing = std::move(*tracing_cfg);
    // An https:// collector's CA file is loaded now, as a pool's is: one that
    // does not load would fail every export (every span dropped) for as long
    // as Weir runs.
    if (out.tracing && out.tracing->endpoint.tls && !out.tracing->ca_file.empty()) {
      core::TlsConfig tc;
      tc.ca_file = out.tracing->ca_file;
      std::string error;
      if (!http::TlsClient::make(tc, error)) {
        auto e = core::config_error(root["tracing"]["ca_file"], "tracing.ca_file", error);
        e.file = file;
        return tl::unexpected(std::move(e));
      }
    }
    // The admin token is no client's key: a tenant whose key hashed to it
    // would hold the admin API too (a secret names one principal, as the
    // keys file's loader asks of runtime keys).
    if (out.admin && out.admin->has_token)
      for (std::size_t i = 0; i < auth_cfg->api_keys.size(); ++i)
        if (auth_cfg->api_keys[i].sha256 == out.admin->token_sha256) {
          auto e = core::config_error(root["admin"]["token_sha256"] ? root["admin"]["token_sha256"] : root["admin"],
                                      "admin.token_sha256",
                                      fmt::format("is the hash of auth.api_keys[{}] ({}): the admin token must be a "
                                                  "secret of its own",
                                                  i, auth_cfg->api_keys[i].id));
          e.file = file;
          return tl::unexpected(std::move(e));
        }
    if (root["auth"] || root["tenants"] || root["pricing"]) {
      out.auth = std::move(*auth_cfg);
      // (The admin API's runtime keys need tenants: with none, no key can ever exist to check against.)
      out.auth->verifies_credentials = root["auth"] || (out.admin && root["tenants"]);
    }
    // A key set read from a file is read now, as a CA file is: one that
    // cannot be read or holds no usable key would refuse every JWT (503)
    // for as long as Weir runs. (A URL's set is fetched after start-up: the
    // IdP may be down for a moment.)
    if (out.auth && out.auth->jwt && !out.auth->jwt->jwks_file.empty()) {
      const std::string& path = out.auth->jwt->jwks_file;
      std::string why = core::unreadable_file(path);
      std::string text;
      if (!why.empty()) {
        // (not a regular file, or not readable)
      } else if (std::ifstream in(path, std::ios::binary); !in) {
        why = fmt::format("cannot be opened ({})", std::strerror(errno));
      } else {
        std::ostringstream ss;
        ss << in.rdbuf();  // (no exception: a read error leaves the stream failed)
        text = std::move(ss).str();
      }
      if (why.empty()) {
        auto set = auth::parse_jwks(text);
        if (!set)
          why = "is not a JSON Web Key Set: " + set.error();
        else if (set->keys.empty())
          why =
              "holds no key Weir can verify with (RS256 RSA of 2048 bits or more, ES256 P-256, EdDSA Ed25519, HS256 of "
              "32 bytes or more)";
      }
      if (!why.empty()) {
        auto e = core::config_error(root["auth"]["jwt"]["jwks_file"], "auth.jwt.jwks_file",
                                    fmt::format("{} {}", core::quoted_text(path, core::kQuotedPathBytes), why));
        e.file = file;
        return tl::unexpected(std::move(e));
      }
      out.jwks_text = std::move(text);
    }
    out.pricing = std::move(*pricing);
    out.redis = std::move(*redis);
    // Bodies are captured per tenant: the tenants must exist.
    if (out.request_log && out.request_log->capture) {
      const YAML::Node node = root["request_log"]["capture_bodies"]["tenants"];
      auto fail = [&](std::size_t i, std::string message) {
        auto e =
            core::config_error(node[i], fmt::format("request_log.capture_bodies.tenants[{}]", i), std::move(message));
        e.file = file;
        return tl::unexpected(std::move(e));
      };
      for (std::size_t i = 0; i < node.size(); ++i) {
        const std::string name = node[i].as<std::string>();
        if (!out.auth)
          return fail(i, "bodies are captured per tenant, and this configuration has no auth:/tenants: section");
        if (name == "*") continue;
        if (name != out.auth->anonymous_tenant && !out.auth->tenants.contains(name))
          return fail(i, fmt::format("no tenant is named {} (tenants:)", core::quoted_text(name)));
      }
    }
  }
  // TLS contexts: a PEM file that does not load is a configuration error,
  // verification turned off a warning.
  const auto& pools = out.config.pools;
  out.tls.resize(pools.size());
  for (std::size_t p = 0; p < pools.size(); ++p) {
    const auto& pc = pools[p];
    if (std::none_of(pc.endpoints.begin(), pc.endpoints.end(), [](const auto& e) { return e.tls; })) continue;
    const YAML::Node node = root && root["pools"] ? root["pools"][pc.name]["tls"] : YAML::Node();
    std::string error;
    out.tls[p] = http::TlsClient::make(pc.tls, error);
    if (!out.tls[p]) {
      auto e = node ? core::config_error(node, "pools." + pc.name + ".tls", error)
                    : core::ConfigError{.key = "pools." + pc.name + ".tls", .message = error};
      e.file = file;
      return tl::unexpected(std::move(e));
    }
    // A key for an https:// service sent in cleartext to the pool's http://
    // endpoints: warned (a key for a model server on a private network is
    // legitimate), not refused.
    if (!pc.api_key.empty()) {
      const YAML::Node eps = root && root["pools"] ? root["pools"][pc.name]["endpoints"] : YAML::Node();
      for (std::size_t i = 0; i < pc.endpoints.size(); ++i) {
        if (pc.endpoints[i].tls) continue;
        const YAML::Node at = eps && eps.IsSequence() && i < eps.size() ? eps[i] : eps;
        warn(w, at, fmt::format("pools.{}.endpoints[{}]", pc.name, i),
             fmt::format("{} is http:// in a pool with https:// endpoints and {}: the key is sent to it in cleartext",
                         pc.endpoints[i].display, pc.api_key_env.empty() ? "an api_key" : "api_key_env"));
      }
    }
    if (!pc.tls.verify)
      warn(w, node["verify"], "pools." + pc.name + ".tls.verify",
           "false: the certificates of the pool's https:// endpoints are NOT checked; anyone on the path can read and "
           "change its traffic (for tests only)");
  }
  compute_warnings(w);
  default_metrics_port(w);
  w.finish();
  return out;
}

}  // namespace

core::ConfigResult<LoadedConfig> load_config_text(std::string_view yaml, const std::string& file_name,
                                                  auth::GetEnv getenv_fn) {
  auto c = core::parse_config(yaml, file_name);
  if (!c) return tl::unexpected(std::move(c.error()));
  return load_sections(std::move(*c), getenv_fn);
}

tl::expected<void, std::string> check_listen_addresses(const LoadedConfig& loaded) {
  // (Errors name the file and the key as load_config's do; the line is not kept past the load.)
  const std::string& file = loaded.config.source;
  const auto& client = loaded.config.server.listen;
  auto ip = core::resolve_listen_host(client.host);
  if (!ip) return tl::unexpected(fmt::format("{}: listen: {}", file, ip.error()));
  if (!loaded.admin) return {};
  const auto& admin = loaded.admin->listen;
  auto admin_ip = core::resolve_listen_host(admin.host);
  if (!admin_ip) return tl::unexpected(fmt::format("{}: admin.listen: {}", file, admin_ip.error()));
  const http::tcp::endpoint c(*ip, client.port);
  const http::tcp::endpoint a(*admin_ip, admin.port);
  if (core::listen_addresses_overlap(c, a))
    return tl::unexpected(
        fmt::format("{}: admin.listen: {} binds {}, which takes the client listener's connections (listen {} binds "
                    "{}): the admin API has its own port",
                    file, core::format_host_port(admin.host, admin.port), core::format_address(a),
                    core::format_host_port(client.host, client.port), core::format_address(c)));
  return {};
}

core::ConfigResult<LoadedConfig> load_config(const ConfigSource& source, auth::GetEnv getenv_fn) {
  if (source.file.empty()) {
    auto c = core::quick_config(source.listen.empty() ? "127.0.0.1:8080" : source.listen, source.upstream);
    if (!c) return tl::unexpected(std::move(c.error()));
    return load_sections(std::move(*c), getenv_fn);
  }
  auto c = core::load_config_file(source.file);
  if (!c) return tl::unexpected(std::move(c.error()));
  // A pipe is read once (a reload then only reopens the logs: server::Reloader): a watch of it could never see
  // a change, and each look would block on a pipe no one writes to again.
  if (c->server.watch_config.count() > 0 && !core::config_rereadable(source.file)) {
    auto e = core::config_error(
        core::node_at(c->root, "server.watch_config"), "server.watch_config",
        "the configuration is not a regular file (a pipe such as <(envsubst < weir.yaml)): it is read once at "
        "start-up and cannot be watched or reloaded; give a file (envsubst < weir.yaml > /run/weir.yaml) or drop "
        "watch_config");
    e.file = source.file;
    return tl::unexpected(std::move(e));
  }
  if (!source.listen.empty()) {
    auto l = core::parse_listen(source.listen);
    if (!l) return tl::unexpected(core::ConfigError{.key = "--listen", .message = l.error().message});
    c->server.listen = *l;
  }
  return load_sections(std::move(*c), getenv_fn);
}

}  // namespace weir::gateway
