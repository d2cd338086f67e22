// The immutable, shared view of auth configuration that requests read:
// tenants, API keys by hash, model allow-lists, and admission scopes.
// Built once per configuration load; workers share it read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "auth/config.hpp"
#include "auth/crypto.hpp"
#include "auth/jwt.hpp"

namespace weir::auth {

// A model allow-list: exact names, prefixes ("meta-llama/*"), or everything
// ("*"). A list with no entries allows nothing: an operator who empties a
// tenant's or key's list locks it out, never opens it up.
class ModelList {
 public:
  ModelList() = default;  // allows every model (a tenant that names no list)
  explicit ModelList(const std::vector<std::string>& patterns);
  // True when `model` is allowed. Cost: a scan of the list (lists are short).
  bool allows(std::string_view model) const noexcept;
  bool allows_all() const noexcept { return all_; }

 private:
  bool all_ = true;
  std::vector<std::string> exact_;
  std::vector<std::string> prefixes_;
};

// A tenant as requests see it. `scope` indexes admission state (limits, budget).
struct TenantPolicy {
  std::string name;
  ModelList models;
  int priority = 0;
  std::string tier;
  Limits limits;
  Budget budget;
  std::uint32_t scope = 0;
  bool implicit = false;  // TenantConfig::implicit
};

// An API key as requests see it (the key value itself is never held).
struct KeyPolicy {
  std::string id;
  Sha256Digest sha256{};
  const TenantPolicy* tenant = nullptr;  // never null
  std::optional<ModelList> models;       // narrows the tenant's list when set
  std::string tier;                      // effective tier (key's, else tenant's)
  Limits limits;
  Budget budget;
  std::uint32_t scope = 0;
  WallTime expires_at{};  // refused from this instant on (401); epoch (the default) = never
  bool runtime = false;   // created through the admin API (gateway/key_store.hpp), not the configuration
};

// A key created at run time (the admin API), with the admission scope the
// key store gave it: scopes are never renumbered, so a new key's state is
// added beside the existing ones (admission::Limiter::grow) and a key whose
// limits or budget change gets a fresh scope.
struct RuntimeKey {
  ApiKeyConfig key;
  std::uint32_t scope = 0;
};

// One admission scope: a tenant or a key, with its limits and budget. Scopes
// 0..tenants-1 are tenants in name order, then keys in configuration order
// (at start-up; a reload appends: AuthPolicy::build with a prior policy).
struct ScopeInfo {
  std::string name;  // "tenant:NAME" or "key:ID"
  Limits limits;
  Budget budget;
};

// Where AuthPolicy::build takes the scopes it gives anew: the reusable
// ones first, lowest first (admission::Limiter::reusable_scopes: no live
// policy, ticket or carry holds them), then `end`, `end` + 1, ... (past
// every scope the limiter holds). A plain count converts: no reuse.
struct ScopeNumbers {
  ScopeNumbers(std::uint32_t end_ = 0)
      : end(end_) {}  // NOLINT(google-explicit-constructor): a count is the common case
  ScopeNumbers(std::uint32_t end_, std::vector<std::uint32_t> reusable_) : end(end_), reusable(std::move(reusable_)) {}
  std::uint32_t end = 0;
  std::vector<std::uint32_t> reusable;  // ascending, each < end
};

class AuthPolicy {
 public:
  // Builds the policy from a parsed (already validated) configuration.
  static std::shared_ptr<const AuthPolicy> build(AuthConfig config);
  // The same plus runtime keys, each with the scope it was given (all >= the
  // configuration's scopes and < `scope_count`). scopes() then has
  // `scope_count` entries; indexes no live key holds any more (revoked, or
  // replaced after a change of limits) keep a placeholder without limits.
  // A runtime key whose tenant is not configured is left out.
  //
  // With `prior` (the policy running before a configuration reload), a
  // tenant or configured key that `prior` holds under the same name with
  // the same limits and budget keeps its scope there, so its buckets,
  // stream slots and spend go on; any other (new, or with new limits or a
  // budget) gets a fresh scope: a reusable one of `numbers` (one that
  // neither `prior` nor a runtime key names), else the next from
  // max(numbers.end, prior's scopes) on; a scope no one holds any more
  // becomes a placeholder. A scope is never renumbered, and reused only
  // once nothing holds it (docs/operations.md, "Reloading").
  static std::shared_ptr<const AuthPolicy> build(AuthConfig config, const std::vector<RuntimeKey>& runtime,
                                                 ScopeNumbers numbers, const AuthPolicy* prior = nullptr);
  // Scopes the configuration alone gives (tenants, then configured keys).
  static std::uint32_t config_scopes(const AuthConfig& config);

  const AuthConfig& config() const noexcept { return config_; }
  // The tenant named `name`, or nullptr. O(log tenants).
  const TenantPolicy* find_tenant(std::string_view name) const noexcept;
  // The tenant a credential (API key, JWT claim) may name: find_tenant's,
  // except the implicit anonymous tenant (TenantConfig::implicit), nullptr.
  const TenantPolicy* credential_tenant(std::string_view name) const noexcept;
  // The key whose SHA-256 is `digest`, or nullptr. One hash probe; the final
  // comparison of digests is constant-time.
  const KeyPolicy* find_key(const Sha256Digest& digest) const noexcept;
  const TenantPolicy& anonymous_tenant() const noexcept { return *anonymous_; }

  const std::vector<TenantPolicy>& tenants() const noexcept { return tenants_; }
  const std::vector<KeyPolicy>& keys() const noexcept { return keys_; }
  const std::vector<ScopeInfo>& scopes() const noexcept { return scopes_; }
  // The scopes its tenants and keys name, ascending (the others of
  // scopes() are placeholders): what the policy holds while it lives
  // (admission::Limiter::adopt).
  const std::vector<std::uint32_t>& held_scopes() const noexcept { return held_; }

 private:
  AuthPolicy() = default;
  struct DigestHash {
    std::size_t operator()(const Sha256Digest& d) const noexcept;
  };
  struct DigestEq {
    bool operator()(const Sha256Digest& a, const Sha256Digest& b) const noexcept;
  };

  AuthConfig config_;
  std::vector<TenantPolicy> tenants_;  // sorted by name
  std::vector<KeyPolicy> keys_;
  std::vector<ScopeInfo> scopes_;
  std::vector<std::uint32_t> held_;
  std::unordered_map<Sha256Digest, std::uint32_t, DigestHash, DigestEq> by_digest_;
  const TenantPolicy* anonymous_ = nullptr;
};

// How the caller proved who it is.
enum class CredentialKind : std::uint8_t { anonymous, api_key, jwt };

// Who a refused credential names, when Weir verified it and refused it on
// policy (an expired key, a key or token whose tenant is not configured):
// for the access log, so an operator sees whose request a 401/403 was.
// Empty fields are unknown. The tenant is the name the credential claims,
// which may not be configured.
struct RefusedIdentity {
  std::string tenant;
  std::string key_id;   // API keys
  std::string subject;  // JWTs: the subject claim
};

// Who is calling: the result of authentication, shared by the requests that
// present the same credential on one worker (so a request copies one pointer,
// not strings). Holds its AuthPolicy alive, so `tenant` and `key` stay valid
// across configuration reloads for as long as a request keeps the principal.
struct Principal {
  CredentialKind kind = CredentialKind::anonymous;
  const TenantPolicy* tenant = nullptr;  // never null
  const KeyPolicy* key = nullptr;        // the API key, for kind == api_key
  std::string subject;                   // JWT subject claim, or the key id
  std::string tier;                      // JWT tier claim, else key's, else tenant's
  std::shared_ptr<const AuthPolicy> policy;

  std::string_view tenant_name() const noexcept { return tenant->name; }
  int priority() const noexcept { return tenant->priority; }
  // The key id for API keys, empty otherwise (for logs: never the key value).
  std::string_view key_id() const noexcept { return key ? std::string_view(key->id) : std::string_view(); }
};
using PrincipalPtr = std::shared_ptr<const Principal>;

// Which allow-list refused a principal a model (Authenticator::refusing_list): the tenant's
// (tenants.NAME.models) or its API key's own (auth.api_keys[].models); `none`: the model is allowed.
enum class AllowList : std::uint8_t { none, tenant, key };
std::string_view to_string(AllowList l);  // "tenant", "key"; "" for none

}  // namespace weir::auth
