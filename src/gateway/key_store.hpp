// Virtual keys created at run time through the admin API (docs/admin-api.md):
// the records (gateway/key_json.hpp: a KeyRecord and its JSON forms), the
// AuthPolicy they give with the configuration's keys, and their persistence
// in admin.keys_file. Control thread only: the admin API
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
#include <tl/expected.hpp>

#include "admission/limiter.hpp"
#include "auth/config.hpp"
#include "auth/policy.hpp"
// (The admin API's errors and the key records: every includer of this header used them from here.)
#include "gateway/admin_json.hpp"
#include "gateway/key_json.hpp"

namespace weir::gateway {

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

}  // namespace weir::gateway
