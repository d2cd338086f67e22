#include "gateway/services.hpp"

#include "admission/local_limiter.hpp"

namespace weir::gateway {

Services::Services(boost::asio::io_context& control, LoadedConfig& loaded, unsigned workers) {
  if (!loaded.auth) return;  // every request anonymous, no limits
  auto& auth_cfg = *loaded.auth;
  pricing_ = std::move(loaded.pricing);
  if (auth_cfg.jwt) {
    const auto& j = *auth_cfg.jwt;
    auto source = j.jwks_url.empty() ? auth::make_file_jwks_source(j.jwks_file)
                                     : auth::make_http_jwks_source(control, j.jwks_url, j.fetch_timeout);
    auth::JwksOptions opt;
    opt.refresh_interval = j.refresh_interval;
    opt.min_refetch_interval = j.min_refetch_interval;
    jwks_ = std::make_unique<auth::JwksCache>(control, std::move(source), opt);
  }
  const auto& redis_cfg = loaded.redis;
  if (auth_cfg.redis_keys && redis_cfg) {
    // Virtual keys created and revoked in Redis (docs/auth.md, "Keys in Redis").
    auth::RedisKeysOptions ko;
    ko.client = admission::client_options(*redis_cfg);
    ko.key_prefix = redis_cfg->key_prefix;
    redis_keys_ = std::make_unique<auth::RedisKeys>(control, std::move(ko));
  }
  if (loaded.admin) {
    // Runtime keys (admin API): the configuration plus the persisted keys.
    key_store_ = std::make_unique<KeyStore>(auth_cfg, loaded.admin->keys_file);
    if (auto ok = key_store_->load(); !ok) error_ = ok.error();
    policy_ = key_store_->policy();
  } else {
    policy_ = auth::AuthPolicy::build(std::move(auth_cfg));
  }
  if (redis_cfg) {
    // Limits and spend shared with other replicas; leases keep Redis off the request path.
    auto r = std::make_unique<admission::RedisLimiter>(control, policy_->scopes(), workers, *redis_cfg,
                                                       std::chrono::steady_clock::now());
    redis_limiter_ = r.get();
    limiter_ = std::move(r);
  } else {
    limiter_ = std::make_unique<admission::LocalLimiter>(policy_->scopes(), workers, std::chrono::steady_clock::now());
  }
  if (key_store_) key_store_->set_limiter(limiter_.get());
}

Services::~Services() = default;

void Services::attach(Shared& shared) {
  shared.auth_policy = policy_;
  shared.pricing = pricing_;
  shared.jwks = jwks_.get();
  shared.redis_keys = redis_keys_.get();
  shared.limiter = limiter_.get();
  shared.redis_limiter = redis_limiter_;
}

void Services::start() {
  if (jwks_) jwks_->start();
  if (redis_limiter_) redis_limiter_->start();
  if (redis_keys_) redis_keys_->start();
}

void Services::begin_drain() {
  if (jwks_) jwks_->stop();
}

core::Task<void> Services::stop() {
  if (jwks_) jwks_->stop();
  // Lookups still in flight answer `unavailable` (no worker waits for them any more).
  if (redis_keys_) redis_keys_->stop();
  // Give unused leases back and push the last spend before leaving.
  if (redis_limiter_) co_await redis_limiter_->shutdown();
}

}  // namespace weir::gateway
