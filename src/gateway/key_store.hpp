// Virtual keys created at run time through the admin API (docs/admin-api.md):
// the records, the AuthPolicy they give with the configuration's keys, and
// their persistence in admin.keys_file. Control thread only: the admin API
// calls it, and publishes each new policy to the workers (each swaps its
// Authenticator's pointer: no lock on the request path).
//
// Scopes: a new key gets a fresh admission scope index (never renumbered; a
// free one, which nothing holds any more, is reused: admission/scope_ledger.hpp),
// and a key whose limits or budget change gets a fresh one that starts with
// the old one's spend (admission::Limiter::adopt, carry_spend).
// After a restart the persisted keys are numbered again from the
// configuration's last scope (admission state starts fresh then anyway).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <tl/expected.hpp>

#include "admission/limiter.hpp"
#include "auth/config.hpp"
#include "auth/policy.hpp"

namespace weir::gateway {

// An admin API error, rendered in OpenAI's error shape
// {"error":{"message","type","param","code"}} (empty param/code = null).
struct AdminError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;
  std::string message;
  std::string param;
};
AdminError admin_bad_request(std::string message, std::string param = {});
AdminError admin_not_found(std::string message);
std::string admin_error_json(const AdminError& e);
// `v` as JSON text, every double in plain decimal notation with a fraction
// (25.0, 1.234, 0.001; the shortest that reads back as the same double:
// std::to_chars), as docs/admin-api.md shows them: boost::json::serialize
// writes 2.5E1 and 1E-3, which JSON allows but people and some tools read
// badly. Magnitudes under 1e-9 or from 1e17 on keep the exponent (0 is
// "0.0"); a NaN or infinity, which JSON has not, is null. Every JSON body of
// the admin API and the keys file are written with it.
std::string admin_json_text(const boost::json::value& v);

template <class T>
using AdminResult = tl::expected<T, AdminError>;

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
// key names; a budget's period as "<n>s" or "<n>ms", or "day", "week",
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

class KeyStore {
 public:
  // `base`: the configuration's auth section (tenants, configured keys).
  // `keys_file`: empty = in memory only.
  KeyStore(auth::AuthConfig base, std::string keys_file);

  // Reads keys_file (a missing file is an empty store) and never writes it:
  // start-up and `weir --check` both call it. Call once, before policy() is
  // first used. Error: "admin.keys_file PATH: what is wrong".
  tl::expected<void, std::string> load();
  // The limiter whose scopes follow this store's (grow, carry_spend); set
  // once, after it was built from policy()->scopes(); policy() then holds
  // its scopes in it (Limiter::adopt).
  void set_limiter(admission::Limiter* limiter) {
    limiter_ = limiter;
    if (limiter_) policy_ = limiter_->adopt(policy_);
  }

  // A configuration reload (docs/operations.md, "Reloading"): the policy of
  // `base` (the new auth: and tenants:) plus every runtime key, each with
  // its scope; tenants and configured keys keep theirs unless their limits
  // or budget changed (AuthPolicy::build with the current policy as prior).
  // Nothing changes here until rebase() installs it.
  std::shared_ptr<const auth::AuthPolicy> rebased_policy(const auth::AuthConfig& base) const;
  // Installs `policy` (from rebased_policy(base), its scopes already in the
  // limiter): new keys are checked against `base`'s tenants from now on. A
  // runtime key whose tenant is gone is kept and refused until it is back
  // (said on stderr).
  void rebase(auth::AuthConfig base, std::shared_ptr<const auth::AuthPolicy> policy);

  // The current policy: the configuration plus every runtime key.
  const std::shared_ptr<const auth::AuthPolicy>& policy() const noexcept { return policy_; }
  const std::vector<KeyRecord>& keys() const noexcept { return keys_; }
  const KeyRecord* find(std::string_view id) const;
  bool persistent() const noexcept { return !file_.empty(); }

  // What a change answers: the record as it is now and, for create and
  // rotate, the new secret (shown once).
  struct Change {
    KeyRecord record;
    std::string secret;
  };
  // POST /admin/v1/keys body (docs/admin-api.md). 400 for a bad field (with
  // param), 404 for an unknown tenant, 500 when the keys file cannot be written.
  AdminResult<Change> create(const boost::json::object& body, std::int64_t now_s);
  // PATCH: models, limits, budget, expires_at, metadata, name.
  AdminResult<Change> update(std::string_view id, const boost::json::object& body);
  // DELETE: the key stops working on every worker once the new policy is out.
  AdminResult<KeyRecord> revoke(std::string_view id);
  // A new secret for the same key (same scope: its limits' state stays).
  AdminResult<Change> rotate(std::string_view id);

 private:
  // Builds the policy for `next`, grows the limiter, writes the file,
  // carries `carry` (old scope, new scope: a key given new limits) and
  // installs them; nothing changes when the file cannot be written.
  AdminResult<void> commit(std::vector<KeyRecord> next,
                           std::optional<std::pair<std::uint32_t, std::uint32_t>> carry = std::nullopt);
  tl::expected<void, std::string> save(const std::vector<KeyRecord>& keys) const;
  bool id_taken(std::string_view id) const;

  auth::AuthConfig base_;
  std::string file_;
  // The first scope index no one holds: past this store's keys and every
  // scope the limiter added (keys in Redis, gateway/redis_key_scopes.hpp).
  std::uint32_t free_scope() const noexcept;
  // The scope a new key, or one given new limits, takes: the lowest the
  // limiter can reuse, else free_scope() (counted).
  std::uint32_t fresh_scope();
  // free_scope() and the limiter's reusable scopes (AuthPolicy::build).
  auth::ScopeNumbers scope_numbers() const;
  admission::Limiter* limiter_ = nullptr;
  std::vector<KeyRecord> keys_;
  std::uint32_t next_scope_ = 0;
  std::shared_ptr<const auth::AuthPolicy> policy_;
};

// A key record as JSON: {object:"key", id, name, tenant, models, limits,
// budget, expires_at, metadata, created_at, source:"admin"} (never the hash).
boost::json::object key_json(const KeyRecord& k);
// Keys file form (with the hash) and back.
boost::json::object key_file_json(const KeyRecord& k);
AdminResult<KeyRecord> key_from_file_json(const boost::json::object& o);

}  // namespace weir::gateway
