// The `auth:` and `tenants:` sections of Weir's YAML configuration
// (documented in docs/auth.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "auth/crypto.hpp"
#include "core/calendar.hpp"
#include "core/yaml.hpp"

namespace weir::auth {

// Rate and concurrency limits of one scope (a tenant or an API key).
// 0 means unlimited.
struct Limits {
  std::uint64_t requests_per_minute = 0;     // requests admitted per minute (token bucket)
  std::uint64_t tokens_per_minute = 0;       // estimated prompt + max output tokens per minute
  std::uint64_t max_concurrent_streams = 0;  // requests in flight at once
  // Bucket depths (burst); 0 = one minute's worth (the per-minute value).
  std::uint64_t requests_burst = 0;
  std::uint64_t tokens_burst = 0;

  bool any() const noexcept { return requests_per_minute || tokens_per_minute || max_concurrent_streams; }
  bool operator==(const Limits&) const = default;
};

// A spend cap. Amounts in nano-USD (1e-9 USD) so sums stay exact integers.
// A scope has a budget only when its configuration has a `budget:` key;
// `usd: 0` (or an amount that rounds to 0 nano-USD) is a budget of zero:
// nothing may be spent, which freezes the scope (docs/auth.md).
//
// The period is either a duration (`period`; windows of that length) or a
// calendar period (`calendar`: day, ISO week or month, windows of wall-clock
// time on UTC shifted by `utc_offset_s`, docs/admission.md "Budgets"), never
// both; neither = spend never resets.
struct Budget {
  bool enabled = false;                 // a `budget:` key was given
  std::int64_t limit_nano_usd = 0;      // the cap when enabled; 0 = nothing may be spent
  std::chrono::milliseconds period{0};  // window after which spend resets; 0 = never (or calendar)
  core::CalendarPeriod calendar = core::CalendarPeriod::none;  // `period: day|week|month`
  std::int32_t utc_offset_s = 0;  // calendar windows' offset east of UTC, seconds (auth.budget_utc_offset)

  // True when the scope has a budget: parsed from a `budget:` key, or a positive cap set in code.
  bool any() const noexcept { return enabled || limit_nano_usd > 0; }
  // True when spend resets (a duration or a calendar period).
  bool resets() const noexcept { return period.count() > 0 || calendar != core::CalendarPeriod::none; }
  bool operator==(const Budget&) const = default;
};

// One tenant (the unit of isolation: allowed models, limits, budget, priority).
struct TenantConfig {
  std::string name;
  std::vector<std::string> models{"*"};  // allow-list: exact names, "prefix*", or "*" (all, when omitted); [] = none
  int priority = 0;                      // higher is served first when shedding (0..100)
  std::string tier;                      // default tier of its principals, e.g. "free", "pro"
  Limits limits;
  Budget budget;
  // Made by Weir for auth.anonymous_tenant when tenants: does not list it. It
  // serves requests without credentials (auth.required: false) and nothing
  // else: no API key, runtime key or JWT can name it.
  bool implicit = false;
};

// One API key / virtual key. Only the SHA-256 of the key is kept.
struct ApiKeyConfig {
  std::string id;                                  // public name of the key (logs, metrics); never the key itself
  Sha256Digest sha256{};                           // SHA-256 of the key value
  std::string tenant;                              // must name a configured tenant
  std::optional<std::vector<std::string>> models;  // narrows the tenant's allow-list when set
  std::string tier;                                // overrides the tenant's tier when non-empty
  Limits limits;                                   // per-key limits, on top of the tenant's
  Budget budget;                                   // per-key budget, on top of the tenant's
  std::int64_t expires_at = 0;                     // Unix seconds after which the key is refused (401); 0 = never
};

// JWT bearer tokens (RFC 7519) verified with a JWKS (RFC 7517) from a URL or a file.
struct JwtConfig {
  std::string jwks_url;  // http:// or https://, no userinfo; exactly one of url and file
  std::string jwks_file;
  std::string issuer;                   // required "iss" when non-empty
  std::vector<std::string> audiences;   // "aud" must hold one of them when non-empty
  std::string tenant_claim = "tenant";  // dotted path of the claim naming the tenant
  std::string tier_claim = "tier";      // dotted path of the claim naming the tier (optional in tokens)
  std::string subject_claim = "sub";
  std::string default_tenant;                // used when the token has no tenant claim; empty = refuse (403)
  std::chrono::milliseconds leeway{60'000};  // clock skew allowed on exp/nbf (kept to the millisecond)
  bool require_exp = true;
  std::chrono::milliseconds refresh_interval{std::chrono::minutes(5)};       // periodic JWKS refetch
  std::chrono::milliseconds min_refetch_interval{std::chrono::seconds(30)};  // floor between fetches
  std::chrono::milliseconds fetch_timeout{std::chrono::seconds(5)};
  std::size_t cache_entries = 4096;  // verified-token cache size per worker
};

struct AuthConfig {
  bool required = true;  // false: requests without credentials run as anonymous_tenant
  std::string anonymous_tenant = "anonymous";
  std::optional<JwtConfig> jwt;
  std::vector<ApiKeyConfig> api_keys;
  // Virtual keys stored in Redis (docs/auth.md, "Keys in Redis"): an API key
  // whose hash is not under api_keys is looked up in the `redis:` section's
  // Redis (required when true) and cached per worker.
  bool redis_keys = false;
  std::chrono::milliseconds key_cache_ttl{std::chrono::seconds(30)};    // a found key is trusted this long
  std::chrono::milliseconds key_negative_ttl{std::chrono::seconds(5)};  // an unknown/revoked key is refused this long
  std::size_t key_cache_entries = 4096;                                 // cached Redis keys (found or not) per worker
  // With redis.fail_open, a found key whose key_cache_ttl passed while Redis
  // does not answer is still served from its entry, at most this long past
  // that TTL (docs/auth.md, "Redis down"); 0 (the default) = never (503 at
  // once): serving stale also serves a key revoked in Redis while its entry
  // sat expired before the outage, so it is the operator's choice.
  std::chrono::milliseconds key_stale_ttl{0};
  std::map<std::string, TenantConfig, std::less<>> tenants;
  // auth.budget_utc_offset: every calendar budget's (period: day|week|month)
  // offset east of UTC, seconds; also given to runtime keys' calendar budgets.
  std::int32_t budget_utc_offset_s = 0;
  // False when the file has no `auth:` section and no admin API (only
  // `tenants:` or `pricing:`): there is no key to check a credential
  // against, so a client's Authorization or x-api-key is not Weir's: every
  // request is anonymous and the credential goes upstream, as with no
  // section at all (docs/auth.md). Set by gateway::load_config.
  bool verifies_credentials = true;
};

// Environment lookup, injectable for tests (returns nullptr when unset).
using GetEnv = const char* (*)(const char*);

// Parses `root["auth"]` and `root["tenants"]` (both optional; no auth
// section = credentials not required and every request anonymous). API keys
// give either `sha256` (64 hex digits) or `key_env` (an environment variable
// holding the key, hashed at load and never stored). `auth.redis_keys: true`
// requires a `redis:` section in `root` (parsed by admission::parse_redis_config).
// Errors name file, line and dotted key; `file` is copied into them.
core::ConfigResult<AuthConfig> parse_auth_config(const YAML::Node& root, const std::string& file = "<config>",
                                                 GetEnv getenv_fn = nullptr);

// Parses a `limits:` map (requests_per_minute, tokens_per_minute,
// max_concurrent_streams, requests_burst, tokens_burst).
core::ConfigResult<Limits> parse_limits(const YAML::Node& node, const std::string& key);
// Parses a `budget:` map (usd, period). `period` is a duration (>= 1s, or 0
// for never) or one of day, week, month (any case); a calendar budget gets
// `utc_offset_s` (seconds east of UTC).
core::ConfigResult<Budget> parse_budget(const YAML::Node& node, const std::string& key, std::int32_t utc_offset_s = 0);

}  // namespace weir::auth
