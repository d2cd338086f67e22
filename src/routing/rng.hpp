// The per-worker PRNG of the balancing choices.
#pragma once

#include <cstdint>

namespace weir::routing {

// Small fast PRNG (xorshift64*) per worker, for balancing choices.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed ? seed : 0x9e3779b97f4a7c15ull) {}
  std::uint64_t next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545F4914F6CDD1Dull;
  }
  // Uniform in [0, n), n > 0.
  std::uint32_t below(std::uint32_t n) { return static_cast<std::uint32_t>((next() >> 32) * n >> 32); }

 private:
  std::uint64_t s_;
};

}  // namespace weir::routing
