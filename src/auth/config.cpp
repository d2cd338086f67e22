#include "auth/config.hpp"
#include "core/text.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <boost/url/parse.hpp>

#include "auth/jwt.hpp"
#include "core/url.hpp"

namespace weir::auth {

namespace {

using core::config_error;
using core::ConfigResult;

ConfigResult<std::vector<std::string>> read_string_list(const YAML::Node& node, const std::string& key) {
  std::vector<std::string> out;
  if (node.IsScalar()) {
    WEIR_TRY_RESULT(s, core::read_name(node, key));
    out.push_back(std::move(*s));
    return out;
  }
  if (!node.IsSequence()) return tl::unexpected(config_error(node, key, "expected a string or a list of strings"));
  for (std::size_t i = 0; i < node.size(); ++i) {
    WEIR_TRY_RESULT(s, core::read_name(node[i], fmt::format("{}[{}]", key, i)));
    if (s->empty()) return tl::unexpected(config_error(node[i], fmt::format("{}[{}]", key, i), "empty name"));
    out.push_back(std::move(*s));
  }
  return out;
}

ConfigResult<std::uint64_t> read_count(const YAML::Node& node, const std::string& key) {
  WEIR_TRY_RESULT(v, core::read_int(node, key, 0, std::int64_t{1} << 50));
  return static_cast<std::uint64_t>(*v);
}

ConfigResult<TenantConfig> parse_tenant(const YAML::Node& node, const std::string& name, const std::string& key,
                                        std::int32_t utc_offset_s) {
  TenantConfig t;
  t.name = name;
  if (node.IsNull()) return t;  // "NAME:" with nothing = all models, no limits
  if (auto ok = core::check_keys(node, key, {"models", "priority", "tier", "limits", "budget"}); !ok)
    return tl::unexpected(ok.error());
  if (node["models"]) {
    WEIR_TRY_RESULT(m, read_string_list(node["models"], key + ".models"));
    t.models = std::move(*m);
  }
  if (node["priority"]) {
    WEIR_TRY_RESULT(p, core::read_int(node["priority"], key + ".priority", 0, 100));
    t.priority = static_cast<int>(*p);
  }
  if (node["tier"]) {
    WEIR_TRY_RESULT(s, core::read_name(node["tier"], key + ".tier"));
    t.tier = std::move(*s);
  }
  if (node["limits"]) {
    WEIR_TRY_RESULT(l, parse_limits(node["limits"], key + ".limits"));
    t.limits = *l;
  }
  if (node["budget"]) {
    WEIR_TRY_RESULT(b, parse_budget(node["budget"], key + ".budget", utc_offset_s));
    t.budget = *b;
  }
  return t;
}

ConfigResult<JwtConfig> parse_jwt(const YAML::Node& node, const std::string& key) {
  JwtConfig j;
  if (auto ok = core::check_keys(node, key,
                                 {"jwks_url", "jwks_file", "issuer", "audience", "tenant_claim", "tier_claim",
                                  "subject_claim", "default_tenant", "leeway", "require_exp", "refresh_interval",
                                  "min_refetch_interval", "fetch_timeout", "cache_entries"});
      !ok)
    return tl::unexpected(ok.error());
  auto str = [&](const char* name, std::string& out) -> ConfigResult<void> {
    if (!node[name]) return {};
    WEIR_TRY_RESULT(s, core::read_name(node[name], key + "." + name));
    out = std::move(*s);
    return {};
  };
  auto dur = [&](const char* name, std::chrono::milliseconds& out) -> ConfigResult<void> {
    if (!node[name]) return {};
    WEIR_TRY_RESULT(d, core::read_duration(node[name], key + "." + name));
    out = *d;
    return {};
  };
  for (auto [name, out] :
       std::initializer_list<std::pair<const char*, std::string*>>{{"jwks_url", &j.jwks_url},
                                                                   {"jwks_file", &j.jwks_file},
                                                                   {"issuer", &j.issuer},
                                                                   {"tenant_claim", &j.tenant_claim},
                                                                   {"tier_claim", &j.tier_claim},
                                                                   {"subject_claim", &j.subject_claim},
                                                                   {"default_tenant", &j.default_tenant}})
    if (auto r = str(name, *out); !r) return tl::unexpected(r.error());
  // An empty issuer or audience would switch its check off (a template's
  // empty value admitting every IdP's tokens): omit the key for that.
  if (node["issuer"] && j.issuer.empty())
    return tl::unexpected(config_error(node["issuer"], key + ".issuer",
                                       "is empty: give the issuer tokens must carry, or omit the key to accept any"));
  if (node["audience"]) {
    WEIR_TRY_RESULT(a, read_string_list(node["audience"], key + ".audience"));
    if (a->empty())
      return tl::unexpected(config_error(node["audience"], key + ".audience",
                                         "is an empty list: give the audience(s) a token must hold one of, or omit "
                                         "the key to accept any"));
    if (std::find(a->begin(), a->end(), std::string()) != a->end())
      return tl::unexpected(config_error(node["audience"], key + ".audience", "is empty"));
    j.audiences = std::move(*a);
  }
  std::chrono::milliseconds leeway = j.leeway;
  for (auto [name, out] : std::initializer_list<std::pair<const char*, std::chrono::milliseconds*>>{
           {"leeway", &leeway},
           {"refresh_interval", &j.refresh_interval},
           {"min_refetch_interval", &j.min_refetch_interval},
           {"fetch_timeout", &j.fetch_timeout}})
    if (auto r = dur(name, *out); !r) return tl::unexpected(r.error());
  j.leeway = leeway;  // (900ms is 900ms: exp and nbf may be fractional seconds, RFC 7519 §2 NumericDate)
  if (node["require_exp"]) {
    WEIR_TRY_RESULT(b, core::read_bool(node["require_exp"], key + ".require_exp"));
    j.require_exp = *b;
  }
  if (node["cache_entries"]) {
    WEIR_TRY_RESULT(n, core::read_int(node["cache_entries"], key + ".cache_entries", 0, 1 << 22));
    j.cache_entries = static_cast<std::size_t>(*n);
  }
  if (j.jwks_url.empty() == j.jwks_file.empty())
    return tl::unexpected(config_error(node, key, "give exactly one of jwks_url and jwks_file"));
  if (!j.jwks_url.empty() && j.jwks_url.rfind("http://", 0) != 0 && j.jwks_url.rfind("https://", 0) != 0)
    return tl::unexpected(config_error(node["jwks_url"], key + ".jwks_url", "expected an http:// or https:// URL"));
  if (!j.jwks_url.empty()) {
    // The URL is logged (redacted) and must not carry a password; a query is
    // sent as written (redact_url hides credential-like parameters in logs).
    auto u = boost::urls::parse_uri(j.jwks_url);
    if (!u || u->host().empty())
      return tl::unexpected(
          config_error(node["jwks_url"], key + ".jwks_url",
                       fmt::format("{} is not a URL (expected http[s]://host[:port]/path)",
                                   core::quoted_text(core::redact_url(j.jwks_url), core::kQuotedPathBytes))));
    if (u->has_port() && core::url_port(u->port()) == 0)
      return tl::unexpected(
          config_error(node["jwks_url"], key + ".jwks_url",
                       fmt::format("{} has no valid port (1 to 65535)",
                                   core::quoted_text(core::redact_url(j.jwks_url), core::kQuotedPathBytes))));
    if (u->has_userinfo())
      return tl::unexpected(
          config_error(node["jwks_url"], key + ".jwks_url",
                       fmt::format("{}: credentials (userinfo before '@') are not allowed in the URL: it is logged, "
                                   "and a JWKS is public",
                                   core::quoted_text(core::redact_url(j.jwks_url), core::kQuotedPathBytes))));
  }
  // (An empty tier_claim or subject_claim names none: no tier, no subject from tokens.)
  for (auto [name, path, optional] :
       {std::tuple<const char*, const std::string*, bool>{"tenant_claim", &j.tenant_claim, false},
        {"tier_claim", &j.tier_claim, true},
        {"subject_claim", &j.subject_claim, true}})
    if (!(optional && path->empty()))
      if (std::string why = claim_path_error(*path); !why.empty())
        return tl::unexpected(config_error(node[name] ? node[name] : node, key + "." + name, why));
  if (j.refresh_interval < std::chrono::seconds(1))
    return tl::unexpected(config_error(node["refresh_interval"], key + ".refresh_interval", "must be at least 1s"));
  if (j.fetch_timeout <= std::chrono::milliseconds(0))
    return tl::unexpected(config_error(node["fetch_timeout"], key + ".fetch_timeout", "must be positive"));
  // The floor between refetches for unknown kids: 0 would let a failing IdP (or garbage kids) make Weir
  // fetch in a tight loop.
  if (j.min_refetch_interval < std::chrono::milliseconds(100))
    return tl::unexpected(
        config_error(node["min_refetch_interval"], key + ".min_refetch_interval", "must be at least 100ms"));
  return j;
}

ConfigResult<ApiKeyConfig> parse_api_key(const YAML::Node& node, const std::string& key, GetEnv getenv_fn,
                                         std::int32_t utc_offset_s, bool jwt_on) {
  ApiKeyConfig k;
  if (auto ok =
          core::check_keys(node, key, {"id", "sha256", "key_env", "tenant", "models", "tier", "limits", "budget"});
      !ok)
    return tl::unexpected(ok.error());
  if (!node["id"]) return tl::unexpected(config_error(node, key + ".id", "missing (a public name for the key)"));
  WEIR_TRY_RESULT(id, core::read_name(node["id"], key + ".id"));
  if (id->empty()) return tl::unexpected(config_error(node["id"], key + ".id", "must not be empty"));
  // Runtime keys (the admin API) are named vk_<hex>: a configured key of the same name could not be told
  // apart from one in logs and metrics, and would shadow it in the admin API (which could then not revoke it).
  if (id->starts_with("vk_"))
    return tl::unexpected(config_error(node["id"], key + ".id",
                                       "ids beginning with 'vk_' are reserved for keys created through the admin API"));
  k.id = std::move(*id);
  if (!node["tenant"]) return tl::unexpected(config_error(node, key + ".tenant", "missing"));
  WEIR_TRY_RESULT(tenant, core::read_name(node["tenant"], key + ".tenant"));
  k.tenant = std::move(*tenant);
  if (static_cast<bool>(node["sha256"]) == static_cast<bool>(node["key_env"]))
    return tl::unexpected(config_error(node, key, "give exactly one of sha256 and key_env"));
  if (node["sha256"]) {
    WEIR_TRY_RESULT(hex, core::read_string(node["sha256"], key + ".sha256"));
    auto d = parse_sha256_hex(*hex);
    if (!d) return tl::unexpected(config_error(node["sha256"], key + ".sha256", "expected 64 hex digits"));
    if (is_empty_input_digest(*d))
      return tl::unexpected(config_error(node["sha256"], key + ".sha256",
                                         "is the SHA-256 of the empty string (the hash of an unset variable?): no "
                                         "key has it, and a request without a key is no credential"));
    k.sha256 = *d;
  } else {
    WEIR_TRY_RESULT(var, core::read_string(node["key_env"], key + ".key_env"));
    const char* value = getenv_fn(var->c_str());
    if (!value || !*value)
      return tl::unexpected(config_error(node["key_env"], key + ".key_env",
                                         fmt::format("environment variable {} is not set", core::quoted_text(*var))));
    if (!core::field_value_ok(value))
      return tl::unexpected(config_error(
          node["key_env"], key + ".key_env",
          fmt::format("the key in {} has characters a request header cannot carry (a space or line break at its "
                      "ends, as a secret made from a file has; control characters or non-ASCII): no request could "
                      "present it",
                      core::quoted_text(*var))));
    if (jwt_on && looks_like_jwt(value))
      return tl::unexpected(config_error(
          node["key_env"], key + ".key_env",
          fmt::format("the key in {} has a JWT's shape (eyJ..., two dots): with auth.jwt on such a credential is "
                      "verified as a JWT, so this key could never authenticate; choose another value",
                      core::quoted_text(*var))));
    k.sha256 = sha256(value);
  }
  if (node["models"]) {
    WEIR_TRY_RESULT(m, read_string_list(node["models"], key + ".models"));
    k.models = std::move(*m);
  }
  if (node["tier"]) {
    WEIR_TRY_RESULT(s, core::read_name(node["tier"], key + ".tier"));
    k.tier = std::move(*s);
  }
  if (node["limits"]) {
    WEIR_TRY_RESULT(l, parse_limits(node["limits"], key + ".limits"));
    k.limits = *l;
  }
  if (node["budget"]) {
    WEIR_TRY_RESULT(b, parse_budget(node["budget"], key + ".budget", utc_offset_s));
    k.budget = *b;
  }
  return k;
}

ConfigResult<AuthConfig> parse_impl(const YAML::Node& root, GetEnv getenv_fn) {
  AuthConfig cfg;
  // Read first: the tenants' and keys' calendar budgets take it.
  if (const YAML::Node a = root["auth"]; a && a.IsMap() && a["budget_utc_offset"]) {
    const YAML::Node off = a["budget_utc_offset"];
    const auto v = off.IsScalar() ? core::parse_utc_offset(off.Scalar()) : std::nullopt;
    if (!v)
      return tl::unexpected(config_error(off, "auth.budget_utc_offset",
                                         "expected a fixed UTC offset \"+HH:MM\" or \"-HH:MM\" (at most 14:00) or "
                                         "\"Z\", e.g. \"+05:30\"; "
                                         "time zone names are not supported and daylight saving is not applied"));
    cfg.budget_utc_offset_s = *v;
  }
  const YAML::Node tenants = root["tenants"];
  if (tenants) {
    if (!tenants.IsMap()) return tl::unexpected(config_error(tenants, "tenants", "expected a mapping of tenant names"));
    for (const auto& kv : tenants) {
      const std::string name = kv.first.Scalar();
      if (name.empty()) return tl::unexpected(config_error(kv.first, "tenants", "tenant name is empty"));
      WEIR_TRY_RESULT(t, parse_tenant(kv.second, name, "tenants." + name, cfg.budget_utc_offset_s));
      cfg.tenants.emplace(name, std::move(*t));
    }
  }
  const YAML::Node auth = root["auth"];
  if (!auth) {
    cfg.required = false;
  } else {
    if (auto ok = core::check_keys(auth, "auth",
                                   {"required", "anonymous_tenant", "jwt", "api_keys", "redis_keys", "key_cache_ttl",
                                    "key_negative_ttl", "key_stale_ttl", "key_cache_entries", "budget_utc_offset"});
        !ok)
      return tl::unexpected(ok.error());
    if (auth["redis_keys"]) {
      WEIR_TRY_RESULT(b, core::read_bool(auth["redis_keys"], "auth.redis_keys"));
      if (*b && !root["redis"])
        return tl::unexpected(config_error(auth["redis_keys"], "auth.redis_keys",
                                           "needs a redis: section (url, key_prefix, timeouts of the key store)"));
      cfg.redis_keys = *b;
    }
    for (auto [name, out] : std::initializer_list<std::pair<const char*, std::chrono::milliseconds*>>{
             {"key_cache_ttl", &cfg.key_cache_ttl}, {"key_negative_ttl", &cfg.key_negative_ttl}}) {
      if (!auth[name]) continue;
      const std::string key = std::string("auth.") + name;
      WEIR_TRY_RESULT(d, core::read_duration(auth[name], key));
      if (*d < std::chrono::milliseconds(100))
        return tl::unexpected(config_error(auth[name], key, "must be at least 100ms"));
      *out = *d;
    }
    if (auth["key_stale_ttl"]) {  // 0 turns serving stale entries off
      WEIR_TRY_RESULT(d, core::read_duration(auth["key_stale_ttl"], "auth.key_stale_ttl"));
      cfg.key_stale_ttl = *d;
    }
    if (auth["key_cache_entries"]) {
      WEIR_TRY_RESULT(n, core::read_int(auth["key_cache_entries"], "auth.key_cache_entries", 4, 1 << 22));
      cfg.key_cache_entries = static_cast<std::size_t>(*n);
    }
    if (auth["required"]) {
      WEIR_TRY_RESULT(b, core::read_bool(auth["required"], "auth.required"));
      cfg.required = *b;
    }
    if (auth["anonymous_tenant"]) {
      WEIR_TRY_RESULT(s, core::read_name(auth["anonymous_tenant"], "auth.anonymous_tenant"));
      if (s->empty())
        return tl::unexpected(config_error(auth["anonymous_tenant"], "auth.anonymous_tenant", "is empty"));
      cfg.anonymous_tenant = std::move(*s);
    }
    if (auth["jwt"]) {
      WEIR_TRY_RESULT(j, parse_jwt(auth["jwt"], "auth.jwt"));
      if (auth["jwt"]["default_tenant"] && j->default_tenant.empty())
        return tl::unexpected(config_error(auth["jwt"]["default_tenant"], "auth.jwt.default_tenant", "is empty"));
      if (!j->default_tenant.empty() && !cfg.tenants.count(j->default_tenant))
        return tl::unexpected(
            config_error(auth["jwt"]["default_tenant"], "auth.jwt.default_tenant",
                         fmt::format("tenant {} is not defined under tenants", core::quoted_text(j->default_tenant))));
      cfg.jwt = std::move(*j);
    }
    if (const YAML::Node keys = auth["api_keys"]) {
      if (!keys.IsSequence()) return tl::unexpected(config_error(keys, "auth.api_keys", "expected a list"));
      std::set<std::string> ids;
      std::set<Sha256Digest> hashes;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const std::string key = fmt::format("auth.api_keys[{}]", i);
        WEIR_TRY_RESULT(k, parse_api_key(keys[i], key, getenv_fn, cfg.budget_utc_offset_s, cfg.jwt.has_value()));
        if (!cfg.tenants.count(k->tenant))
          return tl::unexpected(
              config_error(keys[i]["tenant"], key + ".tenant",
                           fmt::format("tenant {} is not defined under tenants", core::quoted_text(k->tenant))));
        if (!ids.insert(k->id).second)
          return tl::unexpected(
              config_error(keys[i]["id"], key + ".id", fmt::format("duplicate key id {}", core::quoted_text(k->id))));
        if (!hashes.insert(k->sha256).second)
          return tl::unexpected(config_error(keys[i], key, "the same key value appears twice"));
        cfg.api_keys.push_back(std::move(*k));
      }
    }
  }
  if (!cfg.tenants.count(cfg.anonymous_tenant)) {
    TenantConfig anon;
    anon.name = cfg.anonymous_tenant;
    anon.implicit = true;
    cfg.tenants.emplace(anon.name, std::move(anon));
  }
  return cfg;
}

}  // namespace

ConfigResult<Limits> parse_limits(const YAML::Node& node, const std::string& key) {
  Limits l;
  if (auto ok = core::check_keys(
          node, key,
          {"requests_per_minute", "tokens_per_minute", "max_concurrent_streams", "requests_burst", "tokens_burst"});
      !ok)
    return tl::unexpected(ok.error());
  for (auto [name, out] : std::initializer_list<std::pair<const char*, std::uint64_t*>>{
           {"requests_per_minute", &l.requests_per_minute},
           {"tokens_per_minute", &l.tokens_per_minute},
           {"max_concurrent_streams", &l.max_concurrent_streams},
           {"requests_burst", &l.requests_burst},
           {"tokens_burst", &l.tokens_burst}}) {
    if (!node[name]) continue;
    WEIR_TRY_RESULT(v, read_count(node[name], key + "." + name));
    *out = *v;
  }
  // A burst is the depth of the per-minute bucket: without the rate there is
  // no bucket, and a burst alone would be no limit in silence (a rate typed
  // as its burst).
  for (auto [burst, rate, bn, rn] :
       {std::tuple{l.requests_burst, l.requests_per_minute, "requests_burst", "requests_per_minute"},
        std::tuple{l.tokens_burst, l.tokens_per_minute, "tokens_burst", "tokens_per_minute"}})
    if (burst > 0 && rate == 0)
      return tl::unexpected(
          config_error(node[bn], key + "." + bn,
                       fmt::format("limits nothing without {}.{} (the burst is that bucket's depth)", key, rn)));
  return l;
}

ConfigResult<Budget> parse_budget(const YAML::Node& node, const std::string& key, std::int32_t utc_offset_s) {
  Budget b;
  if (auto ok = core::check_keys(node, key, {"usd", "period"}); !ok) return tl::unexpected(ok.error());
  if (!node["usd"]) return tl::unexpected(config_error(node, key + ".usd", "missing (the spend cap in USD)"));
  WEIR_TRY_RESULT(usd, core::read_double(node["usd"], key + ".usd", 0.0, 1e9));
  b.enabled = true;  // usd: 0 is a budget of zero (a frozen scope), not "no budget"
  b.limit_nano_usd = static_cast<std::int64_t>(std::llround(*usd * 1e9));
  // Spend is kept in nano-USD: a positive cap that rounds to 0 would freeze the scope in silence.
  if (*usd > 0 && b.limit_nano_usd == 0)
    return tl::unexpected(config_error(node["usd"], key + ".usd",
                                       "is under the $0.000000001 resolution of budgets (0 freezes the scope)"));
  if (node["period"]) {
    const YAML::Node pn = node["period"];
    if (pn.IsScalar() && !pn.Scalar().empty() && std::isalpha(static_cast<unsigned char>(pn.Scalar()[0]))) {
      const auto cal = core::parse_calendar_period(pn.Scalar());
      if (!cal)
        return tl::unexpected(
            config_error(pn, key + ".period",
                         fmt::format("{} is not a period: expected day, week, month (calendar windows, UTC or "
                                     "auth.budget_utc_offset) or a duration such as 24h, 720h, 30m, 0 (never)",
                                     core::quoted_text(pn.Scalar()))));
      b.calendar = *cal;
      b.utc_offset_s = utc_offset_s;
      return b;
    }
    WEIR_TRY_RESULT(p, core::read_duration(node["period"], key + ".period"));
    if (p->count() > 0 && *p < std::chrono::seconds(1))
      return tl::unexpected(config_error(node["period"], key + ".period", "must be at least 1s (or 0 for never)"));
    b.period = *p;
  }
  return b;
}

core::ConfigResult<AuthConfig> parse_auth_config(const YAML::Node& root, const std::string& file, GetEnv getenv_fn) {
  if (!getenv_fn) getenv_fn = [](const char* n) -> const char* { return std::getenv(n); };
  auto r = parse_impl(root, getenv_fn);
  if (!r) r.error().file = file;
  return r;
}

}  // namespace weir::auth
