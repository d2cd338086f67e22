// The control-plane services behind identity and admission: the JWKS key
// set cache, virtual keys in Redis, and the limiter (in process, or shared
// through Redis). Built from the loaded configuration, started, and stopped
// through this one object (Seastar's start()/stop() pattern). They run on
// the control io_context (one thread, not a worker); workers reach them
// only through the pointers attach() puts into Shared.
#pragma once

#include <memory>

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

class Services {
 public:
  // Builds what `loaded` asks for, on `control`, for `workers` worker
  // threads; takes loaded.auth and loaded.pricing. With loaded.admin (and
  // auth), the runtime key store too: its keys_file is read here, and a
  // file that cannot be read is a start-up error (`error()`). Nothing starts yet.
  Services(boost::asio::io_context& control, LoadedConfig& loaded, unsigned workers);
  // Why construction failed (a keys file that cannot be read); empty = fine.
  const std::string& error() const noexcept { return error_; }
  // The runtime keys (admin API); null without admin: or without auth.
  KeyStore* key_store() noexcept { return key_store_.get(); }
  ~Services();
  Services(const Services&) = delete;
  Services& operator=(const Services&) = delete;

  // Fills the workers' view: policy, pricing, limiter, key set, key store.
  // Call before the workers are constructed.
  void attach(Shared& shared);
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
  admission::Pricing pricing_;
  std::unique_ptr<auth::JwksCache> jwks_;
  std::unique_ptr<auth::RedisKeys> redis_keys_;
  std::unique_ptr<admission::Limiter> limiter_;
  admission::RedisLimiter* redis_limiter_ = nullptr;
  std::unique_ptr<KeyStore> key_store_;
  std::string error_;
};

}  // namespace weir::gateway
