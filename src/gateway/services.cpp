#include "gateway/services.hpp"

#include <algorithm>
#include <chrono>
#include <set>

#include <fmt/format.h>

#include "admission/local_limiter.hpp"
#include "gateway/redis_key_scopes.hpp"

namespace weir::gateway {

Services::Services(boost::asio::io_context& control, LoadedConfig& loaded, unsigned workers) {
  if (!loaded.auth) return;  // every request anonymous, no limits
  auto& auth_cfg = *loaded.auth;
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
    ko.stale_if_error = redis_cfg->fail_open;
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
  // The policy the workers get holds its scopes (Limiter::adopt): once no
  // request holds it any more, the scopes it alone named are reused.
  if (key_store_) {
    // The key store holds the running policy from here on (Services::policy()). A copy kept here would hold
    // the start-up policy's scopes for the life of the process, and through each carry's pin every scope a
    // reload or key change gave its tenants and keys since: none would ever be reused.
    key_store_->set_limiter(limiter_.get());
    policy_.reset();
  } else {
    policy_ = limiter_->adopt(policy_);
  }
  if (redis_keys_) {
    redis_key_scopes_ = std::make_unique<RedisKeyScopes>(*limiter_, [this] {
      const auto p = policy();
      return p ? p->config().budget_utc_offset_s : 0;
    });
    redis_keys_->set_resolver(
        [s = redis_key_scopes_.get()](auth::RedisKeyRecord& rec, std::string_view limits, std::string_view budget) {
          return s->resolve(rec, limits, budget);
        });
  }
}

Services::~Services() = default;

void Services::attach(Shared& shared) {
  shared.auth_policy = policy();
  shared.jwks = jwks_.get();
  shared.redis_keys = redis_keys_.get();
  shared.redis_key_scopes = redis_key_scopes_.get();
  shared.limiter = limiter_.get();
  shared.redis_limiter = redis_limiter_;
}

tl::expected<Services::Reload, std::string> Services::prepare_reload(const LoadedConfig& next) const {
  Reload r;
  const auto prior = policy();
  if (!next.auth || !prior) return r;  // identity and admission off (a change of that is restart-only)
  r.auth = *next.auth;
  if (key_store_) {
    // As start-up reads the keys file (KeyStore::load): each id and each secret names one key.
    std::set<auth::Sha256Digest> runtime;
    for (const auto& rk : key_store_->keys()) runtime.insert(rk.sha256);
    for (const auto& k : r.auth->api_keys) {
      if (key_store_->find(k.id))
        return tl::unexpected(
            fmt::format("auth.api_keys: id '{}' is also a runtime key's (admin.keys_file): ids must be unique", k.id));
      if (runtime.contains(k.sha256))
        return tl::unexpected(fmt::format(
            "auth.api_keys: key '{}' has a runtime key's secret (admin.keys_file): a secret names one key", k.id));
    }
  }
  r.policy = key_store_ ? key_store_->rebased_policy(*r.auth)
                        : auth::AuthPolicy::build(
                              *r.auth, {},
                              auth::ScopeNumbers(
                                  std::max(limiter_->scope_count(), static_cast<std::uint32_t>(prior->scopes().size())),
                                  limiter_->reusable_scopes()),
                              prior.get());
  // A tenant or configured key kept under its name but given a new scope
  // (its limits or budget changed) carries its state over at commit.
  auto carry = [&](std::uint32_t old_scope, std::uint32_t scope) {
    if (old_scope != scope) r.carries.emplace_back(old_scope, scope);
  };
  for (const auto& t : r.policy->tenants())
    if (const auto* old = prior->find_tenant(t.name)) carry(old->scope, t.scope);
  for (const auto& k : r.policy->keys()) {
    if (k.runtime) continue;  // keeps its scope
    for (const auto& o : prior->keys())
      if (!o.runtime && o.id == k.id) carry(o.scope, k.scope);
  }
  return r;
}

tl::expected<std::shared_ptr<const auth::AuthPolicy>, std::string> Services::commit_reload(Reload r) {
  if (!r.policy) return r.policy;
  auto policy = limiter_->adopt(std::move(r.policy));
  if (!policy)
    return tl::unexpected(fmt::format(
        "the limiter holds at most {} admission scopes (tenants and keys, those whose limits changed while requests "
        "admitted under the old ones still run, and keys in Redis with limits of their own)",
        limiter_->scope_count()));
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [from, to] : r.carries) limiter_->carry(from, to, now);
  if (key_store_)
    key_store_->rebase(std::move(*r.auth), policy);
  else
    policy_ = policy;
  return policy;
}

std::string Services::reload_jwks(const LoadedConfig& next) {
  if (!jwks_ || !next.auth || !next.auth->jwt) return {};
  const auto& j = *next.auth->jwt;
  if (!j.jwks_url.empty()) {
    jwks_->refetch_now();
    return "auth.jwt.jwks_url: key set being refetched";
  }
  // (Read and checked by load_config: a usable set. An error here would be a bug; the set in use stays.)
  auto changed = jwks_->install(next.jwks_text);
  if (!changed) return "auth.jwt.jwks_file: not installed: " + changed.error();
  if (!*changed) return {};
  const auto keys = jwks_->keys();
  const std::size_t n = keys ? keys->keys.size() : 0;
  return fmt::format("auth.jwt.jwks_file: key set ~ ({} key{})", n, n == 1 ? "" : "s");
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
