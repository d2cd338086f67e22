// Admission scopes for keys in Redis (auth.redis_keys) that carry limits or
// a budget of their own: each such key gets a scope of the limiter, named
// "key:ID", when a lookup first finds it, so its buckets, stream slots and
// spend are shared by every replica (the RedisLimiter finds shared state by
// the scope's name) beside its tenant's. Control thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "admission/limiter.hpp"
#include "auth/redis_keys.hpp"

namespace weir::gateway {

class RedisKeyScopes {
 public:
  // `limiter` outlives this object. `utc_offset_s`: the running
  // configuration's auth.budget_utc_offset (seconds east of UTC), which
  // aligns a key's calendar budget as it does a tenant's.
  RedisKeyScopes(admission::Limiter& limiter, std::function<std::int32_t()> utc_offset_s);

  // auth::RedisKeys::Resolve: parses the record's `limits` and `budget`
  // fields (JSON objects as POST /admin/v1/keys takes them; empty or `null`:
  // none) and gives the key its scope: the one it had when neither changed,
  // else a new one (the old one's fail-open state carried over, as for a
  // PATCH through the admin API). Returns "" or what is wrong with the
  // fields, or that the limiter holds no more scopes.
  std::string resolve(auth::RedisKeyRecord& rec, std::string_view limits, std::string_view budget);

  // The scope key `id` was last given, if it has one of its own.
  std::optional<std::uint32_t> scope_of(std::string_view id) const;

 private:
  struct Entry {
    std::uint32_t scope = 0;
    auth::Limits limits;
    auth::Budget budget;
  };
  admission::Limiter& limiter_;
  std::function<std::int32_t()> utc_offset_s_;
  std::unordered_map<std::string, Entry> by_id_;
};

}  // namespace weir::gateway
