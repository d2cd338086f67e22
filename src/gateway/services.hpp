// The control-plane services behind identity and admission: the JWKS key
// set cache, virtual keys in Redis, and the limiter (in process, or shared
// through Redis). Built from the loaded configuration, started, and stopped
// through this one object (Seastar's start()/stop() pattern). They run on
// the control io_context (one thread, not a worker); workers reach them
// only through the pointers attach() puts into Shared.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

#include <boost/asio/io_context.hpp>

#include "admission/limiter.hpp"
#include "admission/redis_limiter.hpp"
#include "auth/jwks_cache.hpp"
#include "auth/redis_keys.hpp"
#include "core/async.hpp"
#include "gateway/key_store.hpp"
#include "gateway/load_config.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

class RedisKeyScopes;

class Services {
 public:
  // Builds what `loaded` asks for, on `control`, for `workers` worker
  // threads; takes loaded.auth and loaded.pricing. With loaded.admin (and
  // auth), the runtime key store too: its keys_file is read here, and a
  // file that cannot be read or is not a valid keys file is a configuration
  // error (`error()`: start-up exits 2, as `weir --check` does on the same
  // file). Nothing starts yet.
  Services(boost::asio::io_context& control, LoadedConfig& loaded, unsigned workers);
  // Why construction failed (a keys file that cannot be read); empty = fine.
  const std::string& error() const noexcept { return error_; }
  // The runtime keys (admin API); null without admin: or without auth.
  KeyStore* key_store() noexcept { return key_store_.get(); }
  ~Services();
  Services(const Services&) = delete;
  Services& operator=(const Services&) = delete;

  // Fills the workers' view: policy, limiter, key set, key store.
  // Call before the workers are constructed.
  void attach(Shared& shared);

  // A configuration reload (docs/operations.md, "Reloading"), on the
  // control thread, in two steps. prepare_reload() builds the auth policy
  // of `next` (nothing changes yet): tenants and keys keep their admission
  // scopes unless their limits or budget changed (then a new scope, to
  // which commit carries the old one's bucket levels and spend); runtime
  // keys stay. New scopes are numbered past every scope the limiter holds
  // (keys in Redis add theirs at run time). commit_reload() adds the limiter state of the new
  // scopes and carries the changed ones over, makes the policy the one the
  // admin API and later key changes start from, and returns it for the
  // workers; an error (the limiter is full) changes nothing.
  struct Reload {
    std::optional<auth::AuthConfig> auth;                          // the new auth: and tenants:, with auth on
    std::shared_ptr<const auth::AuthPolicy> policy;                // null without auth
    std::vector<std::pair<std::uint32_t, std::uint32_t>> carries;  // (old scope, new scope)
  };
  tl::expected<Reload, std::string> prepare_reload(const LoadedConfig& next) const;
  tl::expected<std::shared_ptr<const auth::AuthPolicy>, std::string> commit_reload(Reload r);
  // A reload's JWT key set (docs/operations.md, "Reloading"), once the
  // reload was committed: with auth.jwt.jwks_file, installs the set
  // load_config read and checked (`next.jwks_text`), which every worker
  // verifies with from the next token on (one published snapshot; their
  // token caches drop what older keys verified); with jwks_url, starts a
  // fetch at once, past min_refetch_interval (JwksCache::refetch_now: its
  // outcome is said when it comes). Returns the part of the reload's line:
  // "auth.jwt.jwks_file: key set ~ (N keys)", "auth.jwt.jwks_url: key set
  // being refetched", or empty (no JWT, or the same set).
  std::string reload_jwks(const LoadedConfig& next);
  // The policy the last key change or reload made (null without auth).
  std::shared_ptr<const auth::AuthPolicy> policy() const { return key_store_ ? key_store_->policy() : policy_; }
  // Starts fetching keys and syncing limits (on the control thread, or before it runs).
  void start();
  // The drain began: no more periodic JWKS fetches (cached keys stay valid).
  void begin_drain();
  // After the workers drained, on the control thread: pending key lookups
  // answer `unavailable`, leases and stream slots go back to Redis and the
  // last spend is pushed (at most redis.command_timeout). Destroy the object
  // only after this completed and the control io_context stopped.
  core::Task<void> stop();

 private:
  std::shared_ptr<const auth::AuthPolicy> policy_;
  std::unique_ptr<auth::JwksCache> jwks_;
  std::unique_ptr<auth::RedisKeys> redis_keys_;
  std::unique_ptr<admission::Limiter> limiter_;
  admission::RedisLimiter* redis_limiter_ = nullptr;
  std::unique_ptr<RedisKeyScopes> redis_key_scopes_;  // keys in Redis with limits or a budget of their own
  std::unique_ptr<KeyStore> key_store_;
  std::string error_;
};

}  // namespace weir::gateway
