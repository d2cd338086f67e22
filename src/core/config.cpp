// The configuration file's reader (README, "Configuration reference"):
// parse_config() and the core sections it reads itself (listen, workers,
// server, models, default_pool), parse_listen() and parse_endpoint_url().
// The pools: section is core/config_pools.cpp, server.cors
// core/config_cors.cpp, and the check for environment-variable references
// core/config_env.cpp. Start-up, --check and reloads call it
// (gateway::load_config).
#include "core/config.hpp"

#include <sys/stat.h>

#include "core/text.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <boost/url/parse.hpp>

#include "core/config_cors.hpp"
#include "core/config_pools.hpp"
#include "core/url.hpp"

namespace weir::core {

namespace {

ConfigResult<void> parse_metrics(const YAML::Node& n, MetricsConfig& m) {
  WEIR_TRY_VOID(
      check_keys(n, "server.metrics", {"tenant_label", "max_tenants", "key_id_label", "max_key_ids", "client_port"}));
  if (auto v = n["client_port"]) {
    WEIR_TRY(b, read_bool(v, "server.metrics.client_port"));
    m.client_port = b;
  }
  if (auto v = n["tenant_label"]) {
    WEIR_TRY(b, read_bool(v, "server.metrics.tenant_label"));
    m.tenant_label = b;
  }
  if (auto v = n["key_id_label"]) {
    WEIR_TRY(b, read_bool(v, "server.metrics.key_id_label"));
    m.key_id_label = b;
  }
  // Label slots are 16 bits in the metrics shards (gateway/metrics.hpp), "other" included.
  if (auto v = n["max_tenants"]) {
    WEIR_TRY(i, read_int(v, "server.metrics.max_tenants", 0, 10'000));
    m.max_tenants = static_cast<std::uint32_t>(i);
  }
  if (auto v = n["max_key_ids"]) {
    WEIR_TRY(i, read_int(v, "server.metrics.max_key_ids", 0, 10'000));
    m.max_key_ids = static_cast<std::uint32_t>(i);
  }
  return {};
}

ConfigResult<void> parse_server(const YAML::Node& n, ServerConfig& s) {
  WEIR_TRY_VOID(check_keys(n, "server",
                           {"max_body", "max_header", "header_timeout", "body_timeout", "keepalive_timeout",
                            "write_timeout", "max_stream_buffer", "max_response", "max_event", "drain_timeout",
                            "access_log", "reuse_port", "metrics", "ready_pools", "watch_config", "cors",
                            // (allowed_hosts: read by gateway::load_config, ServerConfig::allowed_hosts)
                            "allowed_hosts", "trusted_proxies", "max_buffered"}));
  if (auto v = n["max_body"]) {
    WEIR_TRY(b, read_bytes(v, "server.max_body"));
    // (0 is no "unlimited", as nginx's client_max_body_size 0 is: it would refuse every body.)
    if (b == 0)
      return tl::unexpected(config_error(v, "server.max_body", "must be positive (0 would refuse every body)"));
    s.max_body_bytes = b;
  }
  if (auto v = n["max_header"]) {
    WEIR_TRY(b, read_bytes(v, "server.max_header"));
    if (b < 1024 || b > (1u << 24))
      return tl::unexpected(config_error(v, "server.max_header", "must be between 1KiB and 16MiB"));
    s.max_header_bytes = static_cast<std::uint32_t>(b);
  }
  struct D {
    const char* key;
    Millis* out;
  };
  for (D d : {D{"header_timeout", &s.header_timeout}, D{"body_timeout", &s.body_timeout},
              D{"keepalive_timeout", &s.keepalive_timeout}, D{"write_timeout", &s.write_timeout},
              D{"drain_timeout", &s.drain_timeout}}) {
    if (auto v = n[d.key]) {
      WEIR_TRY(ms, read_duration(v, std::string("server.") + d.key));
      // A read or write that must finish in no time fails every request whose bytes take a round trip
      // (0 is no "no timeout" here). (drain_timeout 0: no drain; keepalive_timeout 0: no keep-alive wait.)
      if (ms.count() <= 0 && d.out != &s.drain_timeout && d.out != &s.keepalive_timeout)
        return tl::unexpected(config_error(v, std::string("server.") + d.key, "must be positive"));
      *d.out = ms;
    }
  }
  if (auto v = n["max_stream_buffer"]) {
    WEIR_TRY(b, read_bytes(v, "server.max_stream_buffer"));
    if (b < 4096) return tl::unexpected(config_error(v, "server.max_stream_buffer", "must be at least 4KiB"));
    s.max_stream_buffer_bytes = b;
  }
  if (auto v = n["max_response"]) {
    WEIR_TRY(b, read_bytes(v, "server.max_response"));
    if (b == 0)
      return tl::unexpected(config_error(v, "server.max_response", "must be positive (0 would refuse every answer)"));
    s.max_response_bytes = b;
  }
  if (auto v = n["max_event"]) {
    WEIR_TRY(b, read_bytes(v, "server.max_event"));
    if (b < 4096 || b > (1ULL << 30))
      return tl::unexpected(config_error(v, "server.max_event", "must be between 4KiB and 1GiB"));
    s.max_event_bytes = b;
  }
  if (auto v = n["max_buffered"]) {
    WEIR_TRY(b, read_bytes(v, "server.max_buffered"));
    // A budget smaller than one body or one answer Weir takes would refuse those every time, however idle.
    if (b != 0 && (b < s.max_body_bytes || b < s.max_response_bytes))
      return tl::unexpected(config_error(v, "server.max_buffered",
                                         "must be 0 (no bound) or at least server.max_body and server.max_response"));
    s.max_buffered_bytes = b;
  } else {
    // (Unset: 1GiB, or the larger of the two limits when one is set above it.)
    s.max_buffered_bytes = std::max({s.max_buffered_bytes, s.max_body_bytes, s.max_response_bytes});
  }
  if (auto v = n["access_log"]) {
    // A plain YAML boolean is no file name: false/no/off are off (as every on/off key reads them), true/yes/on
    // name no destination. A quoted 'false' is a file of that name.
    if (bool on = false; v.IsScalar() && v.Tag() == "?" && YAML::convert<bool>::decode(v, on)) {
      if (on)
        return tl::unexpected(
            config_error(v, "server.access_log", "expected '-' (stdout), 'off' or a file path, not true"));
      s.access_log = "off";
    } else {
      WEIR_TRY(str, read_string(v, "server.access_log"));
      if (str.empty())
        return tl::unexpected(config_error(v, "server.access_log", "empty: use '-' (stdout), 'off' or a file path"));
      s.access_log = str;
    }
  }
  if (auto v = n["reuse_port"]) {
    WEIR_TRY(b, read_bool(v, "server.reuse_port"));
    s.reuse_port = b;
  }
  if (auto v = n["metrics"]) WEIR_TRY_VOID(parse_metrics(v, s.metrics));
  if (auto v = n["cors"]) WEIR_TRY_VOID(parse_cors(v, s.cors));
  if (auto v = n["ready_pools"]) {
    WEIR_TRY(str, read_string(v, "server.ready_pools"));
    if (str == "all")
      s.ready_pools = ServerConfig::ReadyPools::all;
    else if (str == "any")
      s.ready_pools = ServerConfig::ReadyPools::any;
    else if (str == "off")
      s.ready_pools = ServerConfig::ReadyPools::off;
    else
      return tl::unexpected(config_error(v, "server.ready_pools", "expected all, any or off"));
  }
  if (auto v = n["trusted_proxies"]) {
    if (!v.IsSequence())
      return tl::unexpected(config_error(v, "server.trusted_proxies", "expected a list of CIDR blocks or addresses"));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::string key = fmt::format("server.trusted_proxies[{}]", i);
      WEIR_TRY(text, read_string(v[i], key));
      std::string why;
      const auto net = parse_ip_net(text, why);
      if (!net) return tl::unexpected(config_error(v[i], key, fmt::format("{}: {}", quoted_text(text), why)));
      s.trusted_proxies.push_back(*net);
    }
  }
  if (auto v = n["watch_config"]) {
    // false (off), true (every second), or how often.
    if (bool on = false; v.IsScalar() && YAML::convert<bool>::decode(v, on)) {
      s.watch_config = on ? Millis{1'000} : Millis{0};
    } else {
      WEIR_TRY(ms, read_duration(v, "server.watch_config"));
      if (ms.count() != 0 && (ms.count() < 100 || ms.count() > 3'600'000))
        return tl::unexpected(config_error(v, "server.watch_config",
                                           "expected false, true (every 1s), or an interval between 100ms and 1h"));
      s.watch_config = ms;
    }
  }
  return {};
}

// `models.X.fallbacks` after every model is known ({model: M} may name one defined later).
// (One pass over the models in the mapping's order, which is c.models'
// order, and a name index: a yaml-cpp map lookup is a linear scan, and one
// per model made a large `models:` section quadratic.)
ConfigResult<void> parse_fallbacks(const YAML::Node& models, Config& c) {
  std::unordered_map<std::string_view, std::size_t> by_name;
  by_name.reserve(c.models.size());
  for (std::size_t i = 0; i < c.models.size(); ++i) by_name.emplace(c.models[i].name, i);
  std::size_t at = 0;
  for (const auto& kv : models) {
    ModelConfig& mc = c.models.at(at++);
    const std::string key = "models." + mc.name + ".fallbacks";
    const YAML::Node f = kv.second["fallbacks"];
    if (!f) continue;
    if (!f.IsSequence())
      return tl::unexpected(
          config_error(f, key, "expected a list of {model: NAME} or {pool: NAME, upstream_model: NAME}"));
    if (f.size() > ModelConfig::kMaxFallbacks)
      return tl::unexpected(config_error(f, key, fmt::format("at most {} fallbacks", ModelConfig::kMaxFallbacks)));
    for (std::size_t i = 0; i < f.size(); ++i) {
      const std::string k = fmt::format("{}[{}]", key, i);
      WEIR_TRY_VOID(check_keys(f[i], k, {"model", "pool", "upstream_model"}));
      FallbackTarget t;
      if (auto m = f[i]["model"]) {
        if (f[i]["pool"]) return tl::unexpected(config_error(f[i], k, "give either model or pool, not both"));
        WEIR_TRY(name, read_name(m, k + ".model"));
        const auto found = by_name.find(name);
        const ModelConfig* target = found == by_name.end() ? nullptr : &c.models[found->second];
        if (!target)
          return tl::unexpected(config_error(m, k + ".model", fmt::format("no model named {}", quoted_text(name))));
        if (target == &mc) return tl::unexpected(config_error(m, k + ".model", "a model cannot fall back to itself"));
        t.pool = target->pool;
        t.upstream_model = target->upstream_model.empty() ? target->name : target->upstream_model;
        t.model = target->name;
      } else if (auto p = f[i]["pool"]) {
        WEIR_TRY(name, read_name(p, k + ".pool"));
        auto idx = c.find_pool(name);
        if (!idx)
          return tl::unexpected(config_error(p, k + ".pool", fmt::format("no pool named {}", quoted_text(name))));
        t.pool = *idx;
        t.upstream_model = mc.upstream_model.empty() ? mc.name : mc.upstream_model;
      } else {
        return tl::unexpected(config_error(f[i], k, "needs model or pool"));
      }
      if (auto u = f[i]["upstream_model"]) {
        WEIR_TRY(s, read_name(u, k + ".upstream_model"));
        t.upstream_model = s;
      }
      // A target that is the model's own (its pool and upstream model) or an earlier one's would send the
      // request again to what just failed, outside the pool's retry budget (docs/reliability.md).
      const std::string_view own = mc.upstream_model.empty() ? std::string_view(mc.name) : mc.upstream_model;
      if (t.pool == mc.pool && t.upstream_model == own)
        return tl::unexpected(config_error(
            f[i], k,
            fmt::format("the model's own pool {} and upstream model {}: a model cannot fall back to itself "
                        "(retries on the pool are `pools.{}.retry`)",
                        quoted_text(c.pools[t.pool].name), quoted_text(own), c.pools[t.pool].name)));
      for (std::size_t j = 0; j < mc.fallbacks.size(); ++j)
        if (mc.fallbacks[j].pool == t.pool && mc.fallbacks[j].upstream_model == t.upstream_model)
          return tl::unexpected(
              config_error(f[i], k,
                           fmt::format("the same pool {} and upstream model {} as {}[{}]",
                                       quoted_text(c.pools[t.pool].name), quoted_text(t.upstream_model), key, j)));
      mc.fallbacks.push_back(std::move(t));
    }
  }
  return {};
}

ConfigResult<void> parse_models(const YAML::Node& n, Config& c) {
  if (!n.IsMap()) return tl::unexpected(config_error(n, "models", "expected a mapping of model name to {pool, ...}"));
  if (n.size() > ModelConfig::kMaxModels)
    return tl::unexpected(config_error(n, "models",
                                       fmt::format("{} models, at most {} (one metrics label slot each, and as many "
                                                   "for those a reload replaces)",
                                                   n.size(), ModelConfig::kMaxModels)));
  std::set<std::string> names;
  for (const auto& kv : n) {
    const std::string name = kv.first.Scalar();
    const std::string key = "models." + name;
    const YAML::Node& m = kv.second;
    if (name.empty()) return tl::unexpected(config_error(kv.first, "models", "model name is empty"));
    // "*" is the metrics' and the stats' label of the models not listed (default_pool): a model of that name
    // would repeat those series with other values (an invalid exposition).
    if (name == "*")
      return tl::unexpected(
          config_error(kv.first, "models", "'*' is reserved (the metrics' label of models served by default_pool)"));
    // (Prices are in the top-level `pricing:` section; `prices` here was once
    // accepted and never read, so it is an unknown key.)
    WEIR_TRY_VOID(check_keys(m, key,
                             {"pool", "upstream_model", "aliases", "owned_by", "max_model_len", "default_max_tokens",
                              "media_tokens", "fallbacks"}));
    ModelConfig mc;
    mc.name = name;
    auto pn = m["pool"];
    if (!pn) return tl::unexpected(config_error(m, key + ".pool", "is required"));
    WEIR_TRY(pool, read_name(pn, key + ".pool"));
    auto idx = c.find_pool(pool);
    if (!idx)
      return tl::unexpected(config_error(pn, key + ".pool", fmt::format("no pool named {}", quoted_text(pool))));
    mc.pool = *idx;
    if (auto v = m["upstream_model"]) {
      WEIR_TRY(s, read_name(v, key + ".upstream_model"));
      mc.upstream_model = s;
    }
    if (auto v = m["owned_by"]) {
      WEIR_TRY(s, read_name(v, key + ".owned_by"));
      mc.owned_by = s;
    }
    if (auto v = m["max_model_len"]) {
      WEIR_TRY(t, read_int(v, key + ".max_model_len", 1, 1'000'000'000));
      mc.max_model_len = static_cast<std::uint32_t>(t);
    }
    if (auto v = m["default_max_tokens"]) {
      WEIR_TRY(t, read_int(v, key + ".default_max_tokens", 1, 10'000'000));
      mc.default_max_tokens = static_cast<std::uint32_t>(t);
    }
    if (auto v = m["media_tokens"]) {
      WEIR_TRY(t, read_int(v, key + ".media_tokens", 0, 10'000'000));
      mc.media_tokens = static_cast<std::uint32_t>(t);
    }
    if (!names.insert(name).second)
      return tl::unexpected(config_error(kv.first, key, "model name is already used (by a model or alias)"));
    if (auto a = m["aliases"]) {
      if (!a.IsSequence()) return tl::unexpected(config_error(a, key + ".aliases", "expected a list of names"));
      for (std::size_t i = 0; i < a.size(); ++i) {
        const std::string k = fmt::format("{}.aliases[{}]", key, i);
        WEIR_TRY(s, read_name(a[i], k));
        if (s.empty()) return tl::unexpected(config_error(a[i], k, "alias is empty"));
        if (!names.insert(s).second)
          return tl::unexpected(
              config_error(a[i], k, fmt::format("{} is already used (by a model or alias)", quoted_text(s))));
        mc.aliases.push_back(s);
      }
    }
    c.models.push_back(std::move(mc));
  }
  return parse_fallbacks(n, c);
}

}  // namespace

std::optional<std::size_t> Config::find_pool(std::string_view name) const {
  for (std::size_t i = 0; i < pools.size(); ++i)
    if (pools[i].name == name) return i;
  return std::nullopt;
}

ConfigResult<ListenAddress> parse_listen(std::string_view s) {
  ListenAddress a;
  std::string_view host, port;
  if (!s.empty() && s.front() == '[') {
    auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return tl::unexpected(
          ConfigError{.key = "listen", .message = fmt::format("{} is not [ipv6]:port", quoted_text(s))});
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string_view::npos)
      return tl::unexpected(
          ConfigError{.key = "listen", .message = fmt::format("{} is not host:port", quoted_text(s))});
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    // "::1:8080": an IPv6 address needs its brackets (RFC 3986 §3.2.2), or where it ends and the port begins is
    // a guess ("::1:8080" is also a whole IPv6 address).
    if (host.find(':') != std::string_view::npos)
      return tl::unexpected(ConfigError{
          .key = "listen",
          .message = fmt::format("{} is ambiguous: write an IPv6 address in brackets, [ipv6]:port", quoted_text(s))});
  }
  unsigned p = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || ptr != port.data() + port.size() || p > 65535)
    return tl::unexpected(ConfigError{.key = "listen", .message = fmt::format("{} has no valid port", quoted_text(s))});
  a.host = host.empty() ? "0.0.0.0" : std::string(host);
  a.port = static_cast<std::uint16_t>(p);
  return a;
}

ConfigResult<EndpointConfig> parse_endpoint_url(std::string_view url) {
  // Messages show the URL only redacted: a refused URL may carry a password.
  const std::string shown = redact_url(url);
  auto fail = [&](std::string_view why) {
    return tl::unexpected(ConfigError{.message = fmt::format("{}{}", quoted_text(shown, kQuotedPathBytes), why)});
  };
  auto u = boost::urls::parse_uri(url);
  if (!u) return fail(" is not a URL (expected http://host[:port] or https://host[:port][/base])");
  if (u->has_userinfo())
    return fail(
        ": credentials (userinfo before '@') are not allowed in endpoint URLs: Weir never sends them and would "
        "log them; give the upstream's key as the pool's api_key or api_key_env");
  const bool tls = u->scheme() == "https";
  if (!tls && u->scheme() != "http") return fail(": only http:// and https:// endpoints are supported");
  if (u->host().empty()) return fail(" has no host");
  if (u->has_fragment()) return fail(": a fragment means nothing in an endpoint URL");
  EndpointConfig e;
  e.tls = tls;
  // The path is a base the request's path maps onto (https://api.openai.com/v1).
  std::string_view path = u->encoded_path();
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (!path.empty() && path.front() != '/') return fail(": the path must start with '/'");
  if (path.find_first_of(" \r\n") != std::string_view::npos) return fail(": the path has a space or line break");
  e.base_path = std::string(path);
  if (u->has_query()) e.query = std::string(u->encoded_query());
  e.url = std::string(url);
  e.display = shown;
  e.host = std::string(u->host_address());
  if (u->host_type() == boost::urls::host_type::ipv6) {
    // host_address() of [::1] is "::1"
  }
  e.port = tls ? 443 : 80;
  if (u->has_port()) {
    const std::string_view digits = u->port();
    if (digits.find_first_not_of('0') == std::string_view::npos && !digits.empty()) return fail(" has port 0");
    e.port = url_port(digits);
    if (e.port == 0) return fail(" has no valid port (1 to 65535)");
  }
  // The Host header: with the port only when it is not the scheme's default (RFC 3986 §6.2.3).
  e.host_header = std::string(u->encoded_host());
  if (u->has_port() && e.port != (tls ? 443 : 80)) e.host_header += ":" + std::to_string(e.port);
  return e;
}

ConfigResult<Config> parse_config(std::string_view yaml_text, std::string file_name) {
  Config c;
  c.source = file_name;
  auto located = [&](ConfigError e) {
    e.file = file_name;
    return tl::unexpected(std::move(e));
  };
  {
    ConfigError e;
    e.message = utf8_text_error(yaml_text, e.line, e.column);
    if (!e.message.empty()) return located(e);
  }
  YAML::Node root;
  try {
    // One document: a second one ("---") would be ignored, its keys unchecked.
    auto docs = YAML::LoadAll(std::string(yaml_text));
    // (An empty document, a trailing `---` alone or with comments, holds no key to go unchecked.)
    std::erase_if(docs, [](const YAML::Node& d) { return d.IsNull(); });
    if (docs.size() > 1) {
      ConfigError e;
      e.line = docs[1].Mark().is_null() ? 0 : docs[1].Mark().line + 1;
      e.column = docs[1].Mark().is_null() ? 0 : docs[1].Mark().column + 1;
      e.message = "the file holds more than one YAML document (---): the configuration is one mapping";
      return located(e);
    }
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::Exception& ex) {
    ConfigError e;
    e.line = ex.mark.is_null() ? 0 : ex.mark.line + 1;
    e.column = ex.mark.is_null() ? 0 : ex.mark.column + 1;
    e.message = "YAML syntax error: " + ex.msg;
    return located(e);
  }
  if (!root.IsMap()) return located(config_error(root, "", "the configuration must be a YAML mapping"));
  // Before the duplicate check: a key written with `\_` and one with `\u00A0` are the same once repaired.
  if (auto r = check_scalar_text(root); !r) return located(r.error());
  if (auto r = check_unique_keys(root); !r) return located(r.error());
  // Sections owned by other modules are validated there (auth, tenants,
  // pricing, redis, admin, request_log, tracing: gateway::load_config). A key nothing
  // reads is an error (limits: and batching: were accepted and ignored).
  if (auto r = check_keys(root, "",
                          {"listen", "workers", "server", "pools", "models", "default_pool", "auth", "tenants",
                           "pricing", "redis", "admin", "request_log", "tracing"});
      !r)
    return located(r.error());
  if (auto r = check_env_references(root); !r) return located(r.error());

  auto run = [&]() -> ConfigResult<void> {
    if (auto v = root["listen"]) {
      WEIR_TRY(s, read_string(v, "listen"));
      auto l = parse_listen(s);
      if (!l) return tl::unexpected(config_error(v, "listen", l.error().message));
      c.server.listen = *l;
    }
    if (auto v = root["workers"]) {
      WEIR_TRY(w, read_int(v, "workers", 0, 1024));
      c.server.workers = static_cast<unsigned>(w);
    }
    if (auto v = root["server"]) WEIR_TRY_VOID(parse_server(v, c.server));
    auto pools = root["pools"];
    if (!pools)
      return tl::unexpected(config_error(root, "pools", "is required (a mapping of pool name to {endpoints: [...]})"));
    if (!pools.IsMap() || pools.size() == 0)
      return tl::unexpected(
          config_error(pools, "pools", "expected a non-empty mapping of pool name to {endpoints: [...]}"));
    for (const auto& kv : pools) {
      // (An empty name, '' or ~, names no pool a model or default_pool could give: refused as a model's is.)
      if (kv.first.Scalar().empty()) return tl::unexpected(config_error(kv.first, "pools", "pool name is empty"));
      WEIR_TRY(p, parse_pool(kv.first.Scalar(), kv.second));
      c.pools.push_back(std::move(p));
    }
    if (auto v = root["models"]) WEIR_TRY_VOID(parse_models(v, c));
    if (auto v = root["default_pool"]) {
      WEIR_TRY(s, read_name(v, "default_pool"));
      auto idx = c.find_pool(s);
      if (!idx) return tl::unexpected(config_error(v, "default_pool", fmt::format("no pool named {}", quoted_text(s))));
      c.default_pool = idx;
    }
    if (c.models.empty() && !c.default_pool)
      return tl::unexpected(config_error(root, "models", "no models are configured and there is no default_pool"));
    return {};
  };
  if (auto r = run(); !r) return located(r.error());
  c.root = root;
  return c;
}

ConfigResult<Config> load_config_file(const std::string& path) {
  // (A pipe is read: `weir -c <(envsubst < weir.yaml)`. A directory opens, and reads as nothing.)
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return tl::unexpected(ConfigError{.file = path, .message = "is a directory, not a configuration file"});
  std::ifstream in(path, std::ios::binary);
  if (!in) return tl::unexpected(ConfigError{.file = path, .message = "cannot open the file"});
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path);
}

bool config_rereadable(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

ConfigResult<Config> quick_config(std::string_view listen, std::string_view upstream_url) {
  Config c;
  c.source = "<flags>";
  auto l = parse_listen(listen);
  if (!l) return tl::unexpected(ConfigError{.key = "--listen", .message = l.error().message});
  c.server.listen = *l;
  auto ep = parse_endpoint_url(upstream_url);
  if (!ep) return tl::unexpected(ConfigError{.key = "--upstream", .message = ep.error().message});
  PoolConfig p;
  p.name = "default";
  p.endpoints.push_back(std::move(*ep));
  c.pools.push_back(std::move(p));
  c.default_pool = 0;
  return c;
}

}  // namespace weir::core
