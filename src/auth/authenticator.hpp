// The authenticate phase: credentials from request headers to a Principal.
// One Authenticator per worker thread (not thread-safe, takes no lock).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tl/expected.hpp>

#include "auth/crypto.hpp"
#include "auth/jwks_cache.hpp"
#include "auth/jwt.hpp"
#include "auth/policy.hpp"
#include "auth/token_cache.hpp"
#include "core/error.hpp"

namespace weir::auth {

class RedisKeys;
class RedisKeyCache;
struct KeyLookup;

// An Authorization field's Bearer credential (RFC 6750 §2.1, RFC 9110
// §11.4): the scheme in any case, then SP or HTAB, then the token, optional
// whitespace trimmed. Returns the token ("" for the scheme alone), or
// nullopt when the field is empty or another scheme. Every reader of a
// request's credential (authentication, the admin token, the capture's
// redaction) reads it through this, so none takes a form another refuses.
std::optional<std::string_view> bearer_token(std::string_view authorization);

// The credential a request presents: its Bearer token, else its x-api-key
// field's value (trimmed); "" when it has none.
std::string_view presented_credential(std::string_view authorization, std::string_view x_api_key);

// An API key that must be looked up in Redis (see Authenticator::key_lookup_pending).
struct PendingKeyLookup {
  Sha256Digest digest{};  // SHA-256 of the key; never log it
  WallTime asked_at{};    // `now` of the authenticate() call that asked; the cache TTL counts from it
};

class Authenticator {
 public:
  // `policy`: the configuration snapshot (shared, immutable). `jwks`: the
  // shared key-set cache when auth.jwt is configured, else nullptr; it must
  // outlive this object. `redis_keys`: the shared Redis key store when
  // auth.redis_keys is on, else nullptr; it must outlive this object.
  Authenticator(std::shared_ptr<const AuthPolicy> policy, JwksCache* jwks, RedisKeys* redis_keys = nullptr);
  ~Authenticator();
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // Authenticates one request from its `Authorization` and `x-api-key` header
  // values (empty when absent), at wall time `now`.
  //
  //  - `Authorization: Bearer <credential>` wins; otherwise `x-api-key: <credential>`.
  //  - A credential shaped like a JWS ("eyJ...", three segments) is verified
  //    as a JWT when auth.jwt is configured (RFC 7519; cached per worker until
  //    exp); anything else is an API key, looked up by SHA-256 in the
  //    configuration, then (with a RedisKeys) in this worker's cache of Redis
  //    keys. A key in neither fails with 503 and key_lookup_pending() set:
  //    the caller waits once for async_key_lookup (auth/redis_keys.hpp) and
  //    calls authenticate() again, which then answers from the cache.
  //  - No credential: the anonymous tenant's principal when auth.required is
  //    false, else 401.
  //
  // Errors: 401 invalid_api_key (missing, unknown or invalid credential,
  // expired token, unknown kid — which also asks the JWKS cache for a
  // rate-limited refetch; an API key that Redis does not hold or holds
  // revoked); 403 (token or Redis key names no configured tenant); 503 (no
  // signing keys loaded yet; the key store did not answer about a key it
  // never vouched for, or for longer than auth.key_stale_ttl; a Redis key
  // lookup is pending). Messages never contain the credential.
  // Cost: cached JWT = one hash + compare; API key = one SHA-256 + one probe
  // (+ one cache probe for a Redis key).
  tl::expected<PrincipalPtr, core::Error> authenticate(std::string_view authorization, std::string_view x_api_key,
                                                       WallTime now);

  // Whether `principal` may use `model`: the tenant's allow-list and, for an
  // API key with its own list, the key's. An empty `model` (a request
  // without one, sent to the default pool, whose upstream picks the model)
  // only when both allow every model. Error: 403 permission_error,
  // code model_not_allowed (OpenAI error shape); the gateway's route phase
  // answers a named model's refusal as an unknown model (404 model_not_found)
  // and logs this code.
  static tl::expected<void, core::Error> check_model(const Principal& principal, std::string_view model);
  // check_model's decision alone, without building its error: which list refuses `model` (the tenant's is
  // read first), or AllowList::none. The access log names it (the client's 404 must not).
  static AllowList refusing_list(const Principal& principal, std::string_view model) noexcept;

  // Installs a new configuration snapshot (call on this worker's thread).
  // Drops cached principals; requests in flight keep theirs.
  void set_policy(std::shared_ptr<const AuthPolicy> policy);

  // Drops this worker's cached Redis key lookups (auth.redis_keys), so the
  // next request with any key reads Redis again: after this replica's admin
  // API changed, rotated or revoked a key there. Call on this worker's thread.
  void forget_redis_keys() noexcept;

  // After a failed authenticate(): set when the token named a key id the
  // key set does not hold (or no keys are loaded) and a JWKS fetch will
  // answer it (one in flight, or a refetch it started:
  // JwksCache::fetch_for_unknown_kid). The caller may wait until
  // jwks()->completed_fetches() passes this mark and try once more, so a
  // rotated signing key costs its first requests one fetch instead of a 401.
  std::optional<std::uint64_t> refetch_mark() const noexcept { return refetch_mark_; }
  JwksCache* jwks() const noexcept { return jwks_; }

  // After a failed authenticate(): set when the credential was an API key
  // found neither in the configuration nor in this worker's Redis-key cache
  // (a lookup is wanted: async_key_lookup); nullopt otherwise.
  const std::optional<PendingKeyLookup>& key_lookup_pending() const noexcept { return pending_key_; }
  // After a failed authenticate(): who the refused credential names, when it
  // was verified and refused on policy (see RefusedIdentity); nullopt for a
  // missing, unknown or invalid credential.
  const std::optional<RefusedIdentity>& refused_identity() const noexcept { return refused_; }
  RedisKeys* redis_keys() const noexcept { return redis_keys_; }
  // Caches the answer of a Redis key lookup asked for at `asked_at`
  // (async_key_lookup calls it on this worker's thread). A found key's
  // principal is built here, against the current policy: a tenant that is
  // not configured caches a 403.
  void store_key_lookup(const Sha256Digest& digest, const KeyLookup& result, WallTime asked_at);
  const std::shared_ptr<const AuthPolicy>& policy() const noexcept { return policy_; }
  // Whether a client's credential is checked (AuthConfig::verifies_credentials): false, every request is anonymous.
  bool verifies_credentials() const noexcept { return policy_->config().verifies_credentials; }

  struct Stats {
    std::uint64_t jwt_cache_hits = 0;
    std::uint64_t jwt_verified = 0;      // full verifications that succeeded
    std::uint64_t api_key_hits = 0;      // configured keys and cached Redis keys
    std::uint64_t redis_key_hits = 0;    // of which Redis keys (cache hits)
    std::uint64_t redis_key_misses = 0;  // API keys sent to Redis (key_lookup_pending set)
    std::uint64_t anonymous = 0;
    std::uint64_t rejected = 0;  // 401/403/503 returned
  };
  const Stats& stats() const noexcept { return stats_; }

 private:
  tl::expected<PrincipalPtr, core::Error> authenticate_jwt(std::string_view token, WallTime now);
  tl::expected<PrincipalPtr, core::Error> authenticate_key(std::string_view key, WallTime now);
  tl::expected<PrincipalPtr, core::Error> authenticate_redis_key(const Sha256Digest& digest, WallTime now);
  tl::unexpected<core::Error> reject(core::Error e);
  tl::unexpected<core::Error> reject_known(core::Error e, std::string_view tenant, std::string_view key_id,
                                           std::string_view subject);

  std::shared_ptr<const AuthPolicy> policy_;
  JwksCache* jwks_;
  ClaimsPolicy claims_;
  TokenCache cache_;
  std::uint64_t cache_generation_ = 0;
  Sha256Hasher hasher_;
  std::vector<PrincipalPtr> key_principals_;  // per key index, built on first use
  PrincipalPtr anonymous_;
  std::optional<std::uint64_t> refetch_mark_;
  RedisKeys* redis_keys_ = nullptr;
  std::unique_ptr<RedisKeyCache> redis_cache_;  // with redis_keys_ only
  std::optional<PendingKeyLookup> pending_key_;
  std::optional<RefusedIdentity> refused_;
  Stats stats_;
};

}  // namespace weir::auth
