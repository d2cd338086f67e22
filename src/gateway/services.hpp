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
#include "gateway/load_config.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

class Services {
 public:
  // Builds what `loaded` asks for, on `control`, for `workers` worker
  // threads; takes loaded.auth and loaded.pricing. Nothing starts yet.
  Services(boost::asio::io_context& control, LoadedConfig& loaded, unsigned workers);
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
};

}  // namespace weir::gateway
