// A 64-bit integer finalizer for routing's hashes (prefix blocks, rendezvous
// weights): splitmix64's (Steele, Lea, Flood 2014), a bijection whose every
// output bit depends on every input bit.
#pragma once

#include <cstdint>

namespace weir::routing {

constexpr std::uint64_t mix64(std::uint64_t h) {
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace weir::routing
