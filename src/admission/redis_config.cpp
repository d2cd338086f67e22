#include "admission/redis_config.hpp"
#include "core/text.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>
#include <boost/url/parse.hpp>

namespace weir::admission {

namespace {

using core::config_error;
using core::ConfigResult;

// redis://host[:port][/db] into `c`; an error message otherwise.
std::string parse_url(const std::string& url, RedisConfig& c) {
  auto u = boost::urls::parse_uri(url);
  if (!u) return "expected redis://host[:port][/db]";
  // Schemes are case-insensitive (RFC 3986 §3.1): REDIS:// is redis://.
  std::string scheme(u->scheme());
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (scheme == "rediss") return "TLS (rediss://) is not supported; use redis:// on a private network";
  if (scheme != "redis") return "the scheme must be redis://";
  if (u->has_userinfo()) return "no credentials in the URL (it is logged): use redis.password or redis.password_env";
  if (u->host().empty()) return "missing host";
  if (u->has_query() || u->has_fragment()) return "expected redis://host[:port][/db] without query or fragment";
  // A path that does not start with '/' is the rest of an authority the parser stopped reading:
  // "127.0.0.1.:6379" is read as the address 127.0.0.1 and the path ".:6379".
  if (const auto p = u->encoded_path(); !p.empty() && p.front() != '/')
    return fmt::format(
        "cannot read host[:port] from {}{}: expected a host name, an IPv4 address or an IPv6 "
        "address in brackets, then :port",
        core::quoted_text(std::string(u->encoded_host()) + std::string(p)),
        p.front() == '.' ? " (an IP address takes no trailing dot)" : "");
  c.host = std::string(u->host());
  if (u->host_type() == boost::urls::host_type::ipv6) c.host = std::string(u->host_address());
  c.port = 6379;
  if (u->has_port()) {
    c.port = core::url_port(u->port());  // (as written: port_number() wraps past 65535)
    if (c.port == 0) return "port must be 1..65535";
  }
  std::string path(u->path());
  if (!path.empty() && path != "/") {
    int db = -1;
    const std::string digits = path.substr(1);
    if (digits.empty() || digits.size() > 2 || digits.find_first_not_of("0123456789") != std::string::npos)
      return "the path must be a database number, e.g. redis://host:6379/0";
    db = std::stoi(digits);
    c.db = db;
  }
  c.url = url;
  return {};
}

ConfigResult<RedisConfig> parse_impl(const YAML::Node& node, GetEnvFn getenv_fn) {
  RedisConfig c;
  if (!node.IsMap()) return tl::unexpected(config_error(node, "redis", "expected a mapping (url, fail_open, ...)"));
  if (auto ok = core::check_keys(
          node, "redis",
          {"url", "username", "password", "password_env", "key_prefix", "fail_open", "fail_open_share",
           "connect_timeout", "command_timeout", "reconnect_max", "sync_interval", "budget_sync_interval",
           "lease_window", "lease_max_share", "lease_min_tokens", "lease_idle", "slot_ttl"});
      !ok)
    return tl::unexpected(ok.error());
  if (!node["url"]) return tl::unexpected(config_error(node, "redis.url", "missing (redis://host[:port][/db])"));
  {
    WEIR_TRY_RESULT(s, core::read_string(node["url"], "redis.url"));
    if (auto why = parse_url(*s, c); !why.empty()) return tl::unexpected(config_error(node["url"], "redis.url", why));
  }
  if (node["username"]) {
    WEIR_TRY_RESULT(s, core::read_string(node["username"], "redis.username"));
    if (s->empty())
      return tl::unexpected(config_error(node["username"], "redis.username", "must not be empty (omit it)"));
    c.username = *s;
  }
  if (node["password"] && node["password_env"])
    return tl::unexpected(config_error(node, "redis", "give at most one of password and password_env"));
  // AUTH is sent only with a password: a username alone would connect as `default`, silently.
  if (node["username"] && !node["password"] && !node["password_env"])
    return tl::unexpected(config_error(node["username"], "redis.username",
                                       "needs redis.password or redis.password_env (AUTH is sent only with a "
                                       "password: without one Weir would connect as the `default` user)"));
  if (node["password"]) {
    WEIR_TRY_RESULT(s, core::read_string(node["password"], "redis.password"));
    if (s->empty())
      return tl::unexpected(
          config_error(node["password"], "redis.password", "must not be empty (omit it to connect without AUTH)"));
    c.password = *s;
  }
  if (node["password_env"]) {
    WEIR_TRY_RESULT(var, core::read_string(node["password_env"], "redis.password_env"));
    const char* v = getenv_fn ? getenv_fn(var->c_str()) : std::getenv(var->c_str());
    if (!v || !*v)
      return tl::unexpected(config_error(node["password_env"], "redis.password_env",
                                         fmt::format("environment variable {} is not set", core::quoted_text(*var))));
    c.password = v;
  }
  if (node["key_prefix"]) {
    WEIR_TRY_RESULT(s, core::read_string(node["key_prefix"], "redis.key_prefix"));
    c.key_prefix = *s;
  }
  if (node["fail_open"]) {
    WEIR_TRY_RESULT(b, core::read_bool(node["fail_open"], "redis.fail_open"));
    c.fail_open = *b;
  }
  if (node["fail_open_share"]) {
    WEIR_TRY_RESULT(d, core::read_double(node["fail_open_share"], "redis.fail_open_share", 0.0, 1.0));
    if (*d <= 0.0)
      return tl::unexpected(config_error(node["fail_open_share"], "redis.fail_open_share", "must be above 0"));
    c.fail_open_share = *d;
  }
  struct DurationKey {
    const char* name;
    std::chrono::milliseconds* out;
    std::chrono::milliseconds min;
  };
  using std::chrono::milliseconds;
  for (const auto& d : {DurationKey{"connect_timeout", &c.connect_timeout, milliseconds(1)},
                        DurationKey{"command_timeout", &c.command_timeout, milliseconds(1)},
                        DurationKey{"reconnect_max", &c.reconnect_max, milliseconds(50)},
                        DurationKey{"sync_interval", &c.sync_interval, milliseconds(1)},
                        DurationKey{"budget_sync_interval", &c.budget_sync_interval, milliseconds(1)},
                        DurationKey{"lease_window", &c.lease_window, milliseconds(1)},
                        DurationKey{"lease_idle", &c.lease_idle, milliseconds(1)},
                        DurationKey{"slot_ttl", &c.slot_ttl, milliseconds(100)}}) {
    if (!node[d.name]) continue;
    const std::string key = std::string("redis.") + d.name;
    WEIR_TRY_RESULT(v, core::read_duration(node[d.name], key));
    if (*v < d.min)
      return tl::unexpected(config_error(node[d.name], key, fmt::format("must be at least {}ms", d.min.count())));
    *d.out = *v;
  }
  if (node["lease_max_share"]) {
    WEIR_TRY_RESULT(d, core::read_double(node["lease_max_share"], "redis.lease_max_share", 0.0, 1.0));
    if (*d <= 0.0)
      return tl::unexpected(config_error(node["lease_max_share"], "redis.lease_max_share", "must be above 0"));
    c.lease_max_share = *d;
  }
  if (node["lease_min_tokens"]) {
    WEIR_TRY_RESULT(n, core::read_int(node["lease_min_tokens"], "redis.lease_min_tokens", 1, std::int64_t{1} << 40));
    c.lease_min_tokens = static_cast<std::uint64_t>(*n);
  }
  if (c.slot_ttl < 3 * c.sync_interval)
    return tl::unexpected(config_error(node["slot_ttl"] ? node["slot_ttl"] : node, "redis.slot_ttl",
                                       "must be at least 3 × sync_interval (slots are renewed every slot_ttl / 3)"));
  return c;
}

}  // namespace

ConfigResult<std::optional<RedisConfig>> parse_redis_config(const YAML::Node& root, const std::string& file,
                                                            GetEnvFn getenv_fn) {
  const YAML::Node node = root["redis"];
  if (!node) return std::optional<RedisConfig>{};
  auto r = parse_impl(node, getenv_fn);
  if (!r) {
    auto e = std::move(r.error());
    e.file = file;
    return tl::unexpected(std::move(e));
  }
  return std::optional<RedisConfig>(std::move(*r));
}

store::ClientOptions client_options(const RedisConfig& rc) {
  store::ClientOptions o;
  o.host = rc.host;
  o.port = rc.port;
  o.db = rc.db;
  o.username = rc.username;
  o.password = rc.password;
  o.connect_timeout = rc.connect_timeout;
  o.command_timeout = rc.command_timeout;
  o.reconnect_max = rc.reconnect_max;
  return o;
}

}  // namespace weir::admission
