// A runtime key's record and its JSON forms (docs/admin-api.md): what the
// admin API answers and reads for a key, and what the keys file
// (admin.keys_file) and Redis hold. The key store (gateway/key_store.hpp),
// the admin handlers (gateway/admin_keys.cpp) and the Redis key admin
// (gateway/redis_key_admin.hpp, redis_key_scopes.cpp) call it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "auth/config.hpp"
#include "auth/crypto.hpp"
#include "gateway/admin_json.hpp"

namespace weir::gateway {

// One runtime key: what the admin API shows and the keys file stores.
struct KeyRecord {
  std::string id;    // "vk_" + 16 hex digits; public (logs, metrics)
  std::string name;  // free text, optional
  auth::Sha256Digest sha256{};
  std::string tenant;
  std::optional<std::vector<std::string>> models;  // narrows the tenant's list when set
  auth::Limits limits;
  auth::Budget budget;
  std::int64_t expires_at = 0;  // Unix seconds; 0 = never
  boost::json::object metadata;
  std::int64_t created_at = 0;  // Unix seconds
  std::uint32_t scope = 0;      // admission scope (not persisted)
};

// `limits` and `budget` as the admin API writes them (the configuration's
// key names; a budget's period in seconds ("86400s", "1.5s"), or "day", "week",
// "month" for a calendar period; no budget = null).
boost::json::object limits_json(const auth::Limits& l);
boost::json::value budget_json(const auth::Budget& b);
// The configuration's parsers applied to JSON: {requests_per_minute, ...}
// and {usd, period}, after a type check the YAML file does not make: a
// limit is a JSON integer (60, also 60.0; not "60", true or 1.5), usd a
// JSON number, period a string ("day", "week", "month" in any case, or a
// duration) or an integer (ms). A limit of 0 is no limit
// (absent from limits_json). Errors: 400 naming the field
// ("limits.requests_per_minute").
AdminResult<auth::Limits> parse_limits_json(const boost::json::value& v, const std::string& param);
AdminResult<auth::Budget> parse_budget_json(const boost::json::value& v, const std::string& param);
// expires_at: RFC 3339 string or Unix seconds (a JSON integer); null = never (0).
AdminResult<std::int64_t> parse_expiry_json(const boost::json::value& v, const std::string& param);

// A new secret: "sk-weir-" + 32 random bytes (OpenSSL RAND_bytes) in
// base64url without padding, the shape scripts/weir-key makes.
std::string generate_key_secret();

// A key record as JSON: {object:"key", id, name, tenant, models, limits,
// budget, expires_at, metadata, created_at, source:"admin"} (never the hash).
boost::json::object key_json(const KeyRecord& k);
// Keys file form (with the hash) and back.
boost::json::object key_file_json(const KeyRecord& k);
AdminResult<KeyRecord> key_from_file_json(const boost::json::object& o);

// Who wrote a key's settings: a client of the admin API (POST, PATCH), or
// the keys file (admin.keys_file), which builds before stop 56 wrote under
// laxer rules for `models`.
enum class KeySource : std::uint8_t { request, keys_file };

// A key's `models`: null (the tenant's list: nullopt) or a non-empty list of
// at most 1024 names. From a request, each name is one model name as Redis
// keeps a key's list (auth.redis_keys: one comma-separated field, read back
// split at commas with blanks trimmed, auth::split_key_models), so that a
// name means the same to both stores: non-empty, valid UTF-8 without
// control characters (core::name_text_error), no ',' and no space at
// either end; and the names joined with commas fit a record's field
// (auth::kMaxKeyRecordField, 16 KiB). From the keys file, only non-empty
// strings (what older builds wrote loads as it is). Error: 400 naming the
// field ("models", "models[2]"). POST and PATCH /admin/v1/keys and the keys
// file read it.
AdminResult<std::optional<std::vector<std::string>>> parse_models(const boost::json::value& v,
                                                                  KeySource source = KeySource::request);
// A key's `metadata`: null (an empty object) or a JSON object that nests at
// most 16 levels, holds only finite numbers and serialises to at most 16 KiB
// (the keys file wraps it in three more levels and reads it back). Error:
// 400 naming "metadata". POST and PATCH /admin/v1/keys and the keys file read it.
AdminResult<boost::json::object> parse_metadata(const boost::json::value& v);

// The settings a key record carries (models, limits, budget, expiry,
// metadata), read from `field(name)` (null when absent) into `k`: shared by
// the keys file and POST /admin/v1/keys (`source`). Errors name the field.
template <class Field>
AdminResult<void> read_key_settings(const Field& field, KeyRecord& k, KeySource source) {
  auto models = parse_models(field("models"), source);
  if (!models) return tl::unexpected(models.error());
  k.models = std::move(*models);
  auto limits = parse_limits_json(field("limits"), "limits");
  if (!limits) return tl::unexpected(limits.error());
  k.limits = *limits;
  auto budget = parse_budget_json(field("budget"), "budget");
  if (!budget) return tl::unexpected(budget.error());
  k.budget = *budget;
  auto exp = parse_expiry_json(field("expires_at"), "expires_at");
  if (!exp) return tl::unexpected(exp.error());
  k.expires_at = *exp;
  auto md = parse_metadata(field("metadata"));
  if (!md) return tl::unexpected(md.error());
  k.metadata = std::move(*md);
  return {};
}

}  // namespace weir::gateway
