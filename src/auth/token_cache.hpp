// Per-worker cache of verified bearer tokens: a repeated token costs one hash
// and one comparison instead of a signature check. Not thread-safe by design
// (one per worker; shared-nothing).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "auth/jwt.hpp"
#include "auth/policy.hpp"

namespace weir::auth {

// A bounded, 4-way set-associative cache from token to principal. Entries
// expire at the token's exp (plus leeway, as verification allowed); a full
// set evicts its least recently used entry.
//
// Keyed by a 64-bit hash of the token under a per-cache random seed, and a
// hit also compares the whole token, so a collision can never return another
// token's principal. The comparison is an ordinary memcmp: reaching it at all
// needs a 64-bit collision under a secret seed, so its timing leaks nothing an
// attacker can aim.
class TokenCache {
 public:
  // `capacity` entries, rounded up to a multiple of 4 (at least 4). 0 disables the cache.
  explicit TokenCache(std::size_t capacity);

  // The cached principal for `token` if present and unexpired at `now`, else
  // nullptr (an expired entry is dropped). Cost: one hash of the token.
  const PrincipalPtr* find(std::string_view token, WallTime now);
  // Caches `principal` for `token` until `expires_at`. Copies the token.
  void insert(std::string_view token, PrincipalPtr principal, WallTime expires_at);
  void clear();

  std::size_t size() const noexcept;
  std::size_t capacity() const noexcept { return slots_.size(); }

  // The hash used for keys (exposed for tests and benchmarks).
  std::uint64_t hash(std::string_view token) const noexcept;

 private:
  struct Slot {
    std::uint64_t hash = 0;
    std::uint64_t last_used = 0;  // tick of the last hit; 0 = empty
    WallTime expires_at{};
    std::string token;
    PrincipalPtr principal;
  };
  static constexpr std::size_t kWays = 4;
  std::vector<Slot> slots_;
  std::size_t set_mask_ = 0;
  std::uint64_t seed_ = 0;
  std::uint64_t tick_ = 0;
};

}  // namespace weir::auth
