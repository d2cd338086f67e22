#include "auth/token_cache.hpp"

#include <bit>
#include <cstring>
#include <random>

namespace weir::auth {

namespace {
inline std::uint64_t load64(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
__extension__ typedef unsigned __int128 u128;  // GCC/Clang; __extension__ keeps -Wpedantic quiet
// 64x64 -> 128 multiply folded to 64 bits (the wyhash/rapidhash mixer).
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  const u128 r = static_cast<u128>(a) * b;
  return static_cast<std::uint64_t>(r) ^ static_cast<std::uint64_t>(r >> 64);
}
constexpr std::uint64_t kP0 = 0xa0761d6478bd642full, kP1 = 0xe7037ed1a0b428dbull, kP2 = 0x8ebc6af09c88c6e3ull,
                        kP3 = 0x589965cc75374cc3ull;
}  // namespace

TokenCache::TokenCache(std::size_t capacity) {
  if (capacity == 0) return;
  const std::size_t sets = std::bit_ceil((capacity + kWays - 1) / kWays);
  slots_.resize(sets * kWays);
  set_mask_ = sets - 1;
  std::random_device rd;
  seed_ = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

std::uint64_t TokenCache::hash(std::string_view token) const noexcept {
  // Four independent lanes over 32-byte blocks keep the multipliers busy.
  const char* p = token.data();
  std::size_t n = token.size();
  std::uint64_t a = seed_ ^ kP0, b = seed_ ^ kP1, c = seed_ ^ kP2, d = seed_ ^ kP3;
  while (n >= 32) {
    a = mix(load64(p) ^ kP1, a ^ load64(p + 8));
    b = mix(load64(p + 16) ^ kP2, b ^ load64(p + 24));
    std::swap(a, c);
    std::swap(b, d);
    p += 32;
    n -= 32;
  }
  std::uint64_t h = mix(a ^ c, b ^ d ^ token.size());
  while (n >= 8) {
    h = mix(h ^ load64(p), kP3);
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    std::uint64_t tail = 0;
    std::memcpy(&tail, p, n);
    h = mix(h ^ tail, kP0 ^ n);
  }
  return mix(h, kP1);
}

const PrincipalPtr* TokenCache::find(std::string_view token, WallTime now) {
  if (slots_.empty()) return nullptr;
  const std::uint64_t h = hash(token);
  Slot* set = &slots_[(h & set_mask_) * kWays];
  for (std::size_t i = 0; i < kWays; ++i) {
    Slot& s = set[i];
    if (s.last_used == 0 || s.hash != h || s.token.size() != token.size() ||
        std::memcmp(s.token.data(), token.data(), token.size()) != 0)
      continue;
    if (now >= s.expires_at) {
      s = Slot{};
      return nullptr;
    }
    s.last_used = ++tick_;
    return &s.principal;
  }
  return nullptr;
}

void TokenCache::insert(std::string_view token, PrincipalPtr principal, WallTime expires_at) {
  if (slots_.empty()) return;
  const std::uint64_t h = hash(token);
  Slot* set = &slots_[(h & set_mask_) * kWays];
  Slot* victim = &set[0];
  for (std::size_t i = 0; i < kWays; ++i) {
    Slot& s = set[i];
    if (s.last_used != 0 && s.hash == h && s.token == token) {
      victim = &s;  // refresh in place
      break;
    }
    if (s.last_used < victim->last_used) victim = &s;  // empty slots (0) win
  }
  victim->hash = h;
  victim->last_used = ++tick_;
  victim->expires_at = expires_at;
  victim->token.assign(token.data(), token.size());
  victim->principal = std::move(principal);
}

void TokenCache::clear() {
  for (auto& s : slots_) s = Slot{};
}

std::size_t TokenCache::size() const noexcept {
  std::size_t n = 0;
  for (const auto& s : slots_) n += s.last_used != 0;
  return n;
}

}  // namespace weir::auth
