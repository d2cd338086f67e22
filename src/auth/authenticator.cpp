#include "auth/authenticator.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "auth/redis_keys.hpp"
#include "core/text.hpp"
#include "core/time.hpp"

namespace weir::auth {

namespace {

constexpr std::size_t kMaxApiKeyBytes = 1024;

constexpr auto trim = core::trim_ows;
using core::iequals;

const std::size_t kCacheDisabled = 0;

// A Redis key's principal owns its KeyPolicy (configured keys point into the
// AuthPolicy). The key takes its tenant's admission scope with no limits or
// budget of its own, so Admission's second scope is a no-op for it.
struct RedisKeyPrincipal final : Principal {
  KeyPolicy own_key;
};

[[gnu::cold, gnu::noinline]] core::Error incorrect_key() { return core::unauthorized("Incorrect API key provided."); }

[[gnu::cold, gnu::noinline]] core::Error key_expired(const KeyPolicy& k) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(k.expires_at.time_since_epoch()).count();
  return core::unauthorized(
      fmt::format("The API key `{}` expired at {} (Unix time {}).", k.id, core::format_rfc3339(s), s));
}

[[gnu::cold, gnu::noinline]] core::Error key_lookup_pending_error() {
  return core::unavailable("The API key is being looked up; retry shortly.", 1);
}

[[gnu::cold, gnu::noinline]] core::Error key_store_unavailable() {
  return core::unavailable("The API key store is unavailable. Please try again shortly.", 1);
}

[[gnu::cold, gnu::noinline]] core::Error key_tenant_not_configured(std::string_view tenant) {
  return core::forbidden(fmt::format("The key's tenant `{}` is not configured.", tenant.substr(0, 128)),
                         "tenant_not_allowed");
}

}  // namespace

Authenticator::Authenticator(std::shared_ptr<const AuthPolicy> policy, JwksCache* jwks, RedisKeys* redis_keys)
    : policy_(std::move(policy)),
      jwks_(jwks),
      cache_(policy_->config().jwt ? policy_->config().jwt->cache_entries : kCacheDisabled),
      redis_keys_(redis_keys) {
  if (redis_keys_) redis_cache_ = std::make_unique<RedisKeyCache>(policy_->config().key_cache_entries);
  set_policy(policy_);
}

Authenticator::~Authenticator() = default;

void Authenticator::forget_redis_keys() noexcept {
  if (redis_cache_) redis_cache_->clear();
}

void Authenticator::set_policy(std::shared_ptr<const AuthPolicy> policy) {
  policy_ = std::move(policy);
  claims_ = ClaimsPolicy{};
  if (const auto& jwt = policy_->config().jwt) {
    claims_.issuer = jwt->issuer;
    claims_.audiences = jwt->audiences;
    claims_.leeway = jwt->leeway;
    claims_.require_exp = jwt->require_exp;
  }
  cache_.clear();
  if (redis_cache_) redis_cache_->clear();  // its principals point at the old policy's tenants
  key_principals_.assign(policy_->keys().size(), nullptr);
  auto anon = std::make_shared<Principal>();
  anon->kind = CredentialKind::anonymous;
  anon->tenant = &policy_->anonymous_tenant();
  anon->tier = anon->tenant->tier;
  anon->policy = policy_;
  anonymous_ = std::move(anon);
}

tl::unexpected<core::Error> Authenticator::reject(core::Error e) {
  ++stats_.rejected;
  return tl::unexpected(std::move(e));
}

tl::unexpected<core::Error> Authenticator::reject_known(core::Error e, std::string_view tenant, std::string_view key_id,
                                                        std::string_view subject) {
  refused_.emplace(RefusedIdentity{std::string(tenant), std::string(key_id), std::string(subject)});
  return reject(std::move(e));
}

std::optional<std::string_view> bearer_token(std::string_view authorization) {
  authorization = trim(authorization);
  if (iequals(authorization, "Bearer")) return std::string_view{};
  const auto sp = authorization.find_first_of(" \t");
  if (sp == std::string_view::npos || !iequals(authorization.substr(0, sp), "Bearer")) return std::nullopt;
  return trim(authorization.substr(sp + 1));
}

std::string_view presented_credential(std::string_view authorization, std::string_view x_api_key) {
  if (const auto token = bearer_token(authorization); token && !token->empty()) return *token;
  return trim(x_api_key);
}

tl::expected<PrincipalPtr, core::Error> Authenticator::authenticate(std::string_view authorization,
                                                                    std::string_view x_api_key, WallTime now) {
  pending_key_.reset();
  refused_.reset();
  if (!policy_->config().verifies_credentials) {  // no auth: section: the client's credential is not Weir's
    ++stats_.anonymous;
    return anonymous_;
  }
  // (The scheme with no credential: "You didn't provide an API key" below.)
  if (!trim(authorization).empty() && !bearer_token(authorization) && trim(x_api_key).empty())
    return reject(core::unauthorized("The Authorization header must use the Bearer scheme."));
  const std::string_view credential = presented_credential(authorization, x_api_key);
  if (credential.empty()) {
    if (!policy_->config().required) {
      ++stats_.anonymous;
      return anonymous_;
    }
    return reject(
        core::unauthorized("You didn't provide an API key. Pass it in an Authorization header using Bearer auth "
                           "(Authorization: Bearer YOUR_KEY) or in an x-api-key header."));
  }
  if (jwks_ && policy_->config().jwt && looks_like_jwt(credential)) return authenticate_jwt(credential, now);
  return authenticate_key(credential, now);
}

tl::expected<PrincipalPtr, core::Error> Authenticator::authenticate_key(std::string_view key, WallTime now) {
  if (key.size() > kMaxApiKeyBytes) return reject(incorrect_key());
  const Sha256Digest digest = hasher_(key);
  const KeyPolicy* kp = policy_->find_key(digest);
  if (!kp) {
    if (redis_keys_) return authenticate_redis_key(digest, now);
    return reject(incorrect_key());
  }
  if (kp->expires_at != WallTime{} && now >= kp->expires_at) [[unlikely]]
    return reject_known(key_expired(*kp), kp->tenant->name, kp->id, {});
  auto& slot = key_principals_[static_cast<std::size_t>(kp - policy_->keys().data())];
  if (!slot) {
    auto p = std::make_shared<Principal>();
    p->kind = CredentialKind::api_key;
    p->tenant = kp->tenant;
    p->key = kp;
    p->subject = kp->id;
    p->tier = kp->tier;
    p->policy = policy_;
    slot = std::move(p);
  }
  ++stats_.api_key_hits;
  return slot;
}

tl::expected<PrincipalPtr, core::Error> Authenticator::authenticate_redis_key(const Sha256Digest& digest,
                                                                              WallTime now) {
  const RedisKeyCache::Entry* e = redis_cache_->find(digest, now);
  if (!e) {
    pending_key_ = PendingKeyLookup{digest, now};
    ++stats_.redis_key_misses;
    return tl::unexpected(key_lookup_pending_error());
  }
  switch (e->state) {
    case RedisKeyCache::State::found:
      if (const KeyPolicy* k = e->principal->key; k->expires_at != WallTime{} && now >= k->expires_at) [[unlikely]]
        return reject_known(key_expired(*k), k->tenant->name, k->id, {});
      ++stats_.api_key_hits;
      ++stats_.redis_key_hits;
      if (e->stale) [[unlikely]]
        redis_keys_->note_stale_served();
      return e->principal;
    case RedisKeyCache::State::forbidden:
      if (!e->record) return reject(key_tenant_not_configured({}));
      return reject_known(key_tenant_not_configured(e->record->tenant), e->record->tenant, e->record->id, {});
    case RedisKeyCache::State::unavailable:
      return reject(key_store_unavailable());
    case RedisKeyCache::State::unknown:
      if (e->record) return reject_known(incorrect_key(), e->record->tenant, e->record->id, {});  // revoked
      break;
    case RedisKeyCache::State::empty:
      break;
  }
  return reject(incorrect_key());
}

void Authenticator::store_key_lookup(const Sha256Digest& digest, const KeyLookup& result, WallTime asked_at) {
  const WallTime now = asked_at;  // TTLs count from the request that asked: a lookup never stretches them
  if (!redis_cache_) return;
  const AuthConfig& cfg = policy_->config();
  using State = RedisKeyCache::State;
  switch (result.status) {
    case KeyLookup::Status::found: {
      if (!result.record) break;
      const RedisKeyRecord& rec = *result.record;
      const TenantPolicy* tenant = policy_->credential_tenant(rec.tenant);
      if (!tenant) {
        redis_cache_->insert(digest, State::forbidden, nullptr, result.record, now, cfg.key_negative_ttl);
        return;
      }
      // A key id is unique (docs/auth.md): a record taking a configured or
      // admin key's id would mix two credentials in the log, the metrics,
      // the request log and a shared limit's key:<id>. Refused as unknown.
      const auto& keys = policy_->keys();
      if (std::any_of(keys.begin(), keys.end(), [&](const KeyPolicy& k) { return k.id == rec.id; })) {
        redis_cache_->insert(digest, State::unknown, nullptr, nullptr, now, cfg.key_negative_ttl);
        return;
      }
      auto p = std::make_shared<RedisKeyPrincipal>();
      KeyPolicy& k = p->own_key;
      k.id = rec.id;
      k.sha256 = digest;
      k.tenant = tenant;
      if (rec.models) k.models = ModelList(*rec.models);
      k.tier = rec.tier.empty() ? tenant->tier : rec.tier;
      if (rec.own_scope) {  // its own limits and budget, beside the tenant's (RedisKeys::Resolve)
        k.scope = rec.scope;
        k.limits = rec.limits;
        k.budget = rec.budget;
      } else {
        k.scope = tenant->scope;  // limits and budget stay empty: the tenant's scope governs
      }
      if (rec.expires_at > 0) k.expires_at = wall_from_unix_seconds(rec.expires_at);
      p->kind = CredentialKind::api_key;
      p->tenant = tenant;
      p->key = &k;
      p->subject = k.id;
      p->tier = k.tier;
      p->policy = policy_;
      // With fail_open, kept key_stale_ttl longer, to be served while Redis does not answer.
      redis_cache_->insert(digest, State::found, std::move(p), nullptr, now, cfg.key_cache_ttl,
                           redis_keys_->stale_if_error() ? cfg.key_stale_ttl : std::chrono::milliseconds{});
      return;
    }
    case KeyLookup::Status::unavailable: {
      // Short: a key that Redis would have answered for works again soon after it is back.
      const auto retry = std::min<std::chrono::milliseconds>(cfg.key_negative_ttl, std::chrono::seconds(1));
      // Stale-if-error: a key Redis last vouched for (found, not since seen
      // revoked or deleted) is served from its expired entry for as long,
      // then asked for again; bounded by its stale_until, which passes its
      // TTL only with redis.fail_open (above): that is the choice that an
      // outage lets requests through (without it the limiter refuses them all).
      if (redis_cache_->serve_stale(digest, now, retry)) return;
      redis_cache_->insert(digest, State::unavailable, nullptr, nullptr, now, retry);
      return;
    }
    case KeyLookup::Status::revoked:
      // Refused as unknown; its id and tenant kept for the refusal's log line.
      redis_cache_->insert(digest, State::unknown, nullptr, result.record, now, cfg.key_negative_ttl);
      return;
    case KeyLookup::Status::unknown:
    case KeyLookup::Status::invalid:
      break;
  }
  redis_cache_->insert(digest, State::unknown, nullptr, nullptr, now, cfg.key_negative_ttl);
}

tl::expected<PrincipalPtr, core::Error> Authenticator::authenticate_jwt(std::string_view token, WallTime now) {
  refetch_mark_.reset();
  const std::uint64_t gen = jwks_->generation();
  if (gen != cache_generation_) {  // key set changed: tokens verified with old keys must be checked again
    cache_.clear();
    cache_generation_ = gen;
  }
  if (const PrincipalPtr* hit = cache_.find(token, now)) {
    ++stats_.jwt_cache_hits;
    return *hit;
  }
  const auto keys = jwks_->keys();
  auto verified = verify_jwt(token, *keys, claims_, now);
  if (!verified) {
    const auto& err = verified.error();
    if (err.kind == JwtFailure::unknown_kid || err.kind == JwtFailure::no_keys)
      refetch_mark_ = jwks_->fetch_for_unknown_kid();  // the fetch in flight, or one started now, if any
    // No key at all: none loaded yet (503, retry), or the key set in use has
    // none Weir can use (an issuer that withdrew them all: no token is valid).
    if (err.kind == JwtFailure::no_keys && jwks_->stats().updates == 0)
      return reject(core::unavailable("Signing keys are not loaded yet; retry shortly.", 1));
    if (err.kind == JwtFailure::no_keys)
      return reject(core::unauthorized("Invalid bearer token: the issuer's key set has no signing key Weir can use."));
    if (err.claims) {  // signed, but expired, not yet valid, or for another issuer or audience
      const auto& jwt_cfg = *policy_->config().jwt;
      std::string_view tenant_name = string_claim(*err.claims, jwt_cfg.tenant_claim);
      if (tenant_name.empty()) tenant_name = jwt_cfg.default_tenant;
      return reject_known(core::unauthorized("Invalid bearer token: " + err.message + "."), tenant_name, {},
                          string_claim(*err.claims, jwt_cfg.subject_claim));
    }
    return reject(core::unauthorized("Invalid bearer token: " + err.message + "."));
  }
  const auto& jwt_cfg = *policy_->config().jwt;
  std::string_view tenant_name = string_claim(verified->claims, jwt_cfg.tenant_claim);
  // default_tenant is for a token without the claim (or with null): one
  // whose claim is there but names no tenant ("", a number, an object) is
  // the issuer's mistake, refused, never given the default's rights.
  if (const auto* claim = find_claim(verified->claims, jwt_cfg.tenant_claim);
      tenant_name.empty() && claim && !claim->is_null())
    return reject_known(
        core::forbidden(
            fmt::format("The token's '{}' claim does not name a tenant (a non-empty string).", jwt_cfg.tenant_claim),
            "tenant_not_allowed"),
        {}, {}, string_claim(verified->claims, jwt_cfg.subject_claim));
  if (tenant_name.empty()) tenant_name = jwt_cfg.default_tenant;
  if (tenant_name.empty())
    return reject_known(
        core::forbidden(fmt::format("The token has no '{}' claim naming a tenant.", jwt_cfg.tenant_claim),
                        "tenant_not_allowed"),
        {}, {}, string_claim(verified->claims, jwt_cfg.subject_claim));
  const TenantPolicy* tenant = policy_->credential_tenant(tenant_name);
  if (!tenant)
    return reject_known(core::forbidden(fmt::format("Tenant `{}` is not configured.", tenant_name.substr(0, 128)),
                                        "tenant_not_allowed"),
                        tenant_name, {}, string_claim(verified->claims, jwt_cfg.subject_claim));
  auto p = std::make_shared<Principal>();
  p->kind = CredentialKind::jwt;
  p->tenant = tenant;
  p->subject = std::string(string_claim(verified->claims, jwt_cfg.subject_claim));
  const auto tier = string_claim(verified->claims, jwt_cfg.tier_claim);
  p->tier = tier.empty() ? tenant->tier : std::string(tier);
  p->policy = policy_;
  PrincipalPtr principal = std::move(p);
  cache_.insert(token, principal, verified->expires_at);
  ++stats_.jwt_verified;
  return principal;
}

AllowList Authenticator::refusing_list(const Principal& principal, std::string_view model) noexcept {
  const bool key_listed = principal.key && principal.key->models;
  if (model.empty()) {
    // (A request without a model: only a principal that may use every model, as check_model says.)
    if (!principal.tenant->models.allows_all()) return AllowList::tenant;
    return key_listed && !principal.key->models->allows_all() ? AllowList::key : AllowList::none;
  }
  if (!principal.tenant->models.allows(model)) return AllowList::tenant;
  return key_listed && !principal.key->models->allows(model) ? AllowList::key : AllowList::none;
}

tl::expected<void, core::Error> Authenticator::check_model(const Principal& principal, std::string_view model) {
  const AllowList by = refusing_list(principal, model);
  if (by == AllowList::none) return {};
  if (model.empty())
    // A request without a model goes to the default pool, whose upstream picks the model: Weir cannot tell
    // which, so only a principal that may use every model may send one.
    return tl::unexpected(core::forbidden(
        by == AllowList::key
            ? fmt::format("A request without a model may be for any model, and API key `{}` may use only some: "
                          "name the model.",
                          principal.key->id.substr(0, 128))
            : fmt::format("A request without a model may be for any model, and tenant `{}` may use only some: "
                          "name the model.",
                          principal.tenant->name)));
  if (by == AllowList::tenant)
    return tl::unexpected(core::forbidden(
        fmt::format("The model `{}` is not available to tenant `{}`.", model.substr(0, 256), principal.tenant->name)));
  // The key's own list refused it: say so, so no one goes looking in the tenant's.
  return tl::unexpected(core::forbidden(fmt::format("The model `{}` is not available to API key `{}`.",
                                                    model.substr(0, 256), principal.key->id.substr(0, 128))));
}

}  // namespace weir::auth
