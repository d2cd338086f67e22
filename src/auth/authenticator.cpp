#include "auth/authenticator.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace weir::auth {

namespace {

constexpr std::size_t kMaxApiKeyBytes = 1024;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x | 0x20) == (y | 0x20);
         });
}

const std::size_t kCacheDisabled = 0;

}  // namespace

bool looks_like_jwt(std::string_view c) noexcept {
  if (c.size() <= 3 || c.substr(0, 3) != "eyJ") return false;
  // memchr is vectorized; a byte loop over an 800-byte token costs more than the cache lookup.
  const auto d1 = c.find('.');
  const auto d2 = d1 == std::string_view::npos ? d1 : c.find('.', d1 + 1);
  return d2 != std::string_view::npos && c.find('.', d2 + 1) == std::string_view::npos;
}

Authenticator::Authenticator(std::shared_ptr<const AuthPolicy> policy, JwksCache* jwks)
    : policy_(std::move(policy)),
      jwks_(jwks),
      cache_(policy_->config().jwt ? policy_->config().jwt->cache_entries : kCacheDisabled) {
  set_policy(policy_);
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

tl::expected<PrincipalPtr, core::Error> Authenticator::authenticate(std::string_view authorization,
                                                                    std::string_view x_api_key, WallTime now) {
  std::string_view credential;
  authorization = trim(authorization);
  if (!authorization.empty()) {
    const auto sp = authorization.find_first_of(" \t");
    if (sp != std::string_view::npos && iequals(authorization.substr(0, sp), "Bearer"))
      credential = trim(authorization.substr(sp + 1));
    else if (trim(x_api_key).empty())
      return reject(core::unauthorized("The Authorization header must use the Bearer scheme."));
  }
  if (credential.empty()) credential = trim(x_api_key);
  if (credential.empty()) {
    if (!policy_->config().required) {
      ++stats_.anonymous;
      return anonymous_;
    }
    return reject(core::unauthorized(
        "You didn't provide an API key. Pass it in an Authorization header using Bearer auth "
        "(Authorization: Bearer YOUR_KEY) or in an x-api-key header."));
  }
  if (jwks_ && policy_->config().jwt && looks_like_jwt(credential)) return authenticate_jwt(credential, now);
  return authenticate_key(credential);
}

tl::expected<PrincipalPtr, core::Error> Authenticator::authenticate_key(std::string_view key) {
  if (key.size() > kMaxApiKeyBytes) return reject(core::unauthorized("Incorrect API key provided."));
  const KeyPolicy* kp = policy_->find_key(hasher_(key));
  if (!kp) return reject(core::unauthorized("Incorrect API key provided."));
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
    if (err.kind == JwtFailure::unknown_kid || err.kind == JwtFailure::no_keys) {
      const auto mark = jwks_->completed_fetches();
      if (jwks_->request_refresh(now)) refetch_mark_ = mark;
    }
    if (err.kind == JwtFailure::no_keys)
      return reject(core::unavailable("Signing keys are not loaded yet; retry shortly.", 1));
    return reject(core::unauthorized("Invalid bearer token: " + err.message + "."));
  }
  const auto& jwt_cfg = *policy_->config().jwt;
  std::string_view tenant_name = string_claim(verified->claims, jwt_cfg.tenant_claim);
  if (tenant_name.empty()) tenant_name = jwt_cfg.default_tenant;
  if (tenant_name.empty())
    return reject(core::forbidden(fmt::format("The token has no '{}' claim naming a tenant.", jwt_cfg.tenant_claim),
                                  "tenant_not_allowed"));
  const TenantPolicy* tenant = policy_->find_tenant(tenant_name);
  if (!tenant)
    return reject(core::forbidden(
        fmt::format("Tenant `{}` is not configured.", tenant_name.substr(0, 128)), "tenant_not_allowed"));
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

tl::expected<void, core::Error> Authenticator::check_model(const Principal& principal, std::string_view model) {
  const bool ok = principal.tenant->models.allows(model) &&
                  (!principal.key || !principal.key->models || principal.key->models->allows(model));
  if (ok) return {};
  return tl::unexpected(core::forbidden(
      fmt::format("The model `{}` is not available to tenant `{}`.", model.substr(0, 256), principal.tenant->name)));
}

}  // namespace weir::auth
