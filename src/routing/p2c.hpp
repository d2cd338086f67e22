// balance: p2c (the default) — power of two choices on this worker's
// in-flight requests (Mitzenmacher, "The Power of Two Choices in Randomized
// Load Balancing"): two distinct candidates at random, the one with fewer
// in flight, the first drawn on a tie. Two rng draws, O(1); it reads no
// scrape and no request text.
#pragma once

#include <cstdint>
#include <span>

#include "routing/rng.hpp"

namespace weir::routing {

// `healthy` holds ≥ 2 endpoint indexes; `in_flight(i)` returns endpoint i's
// in-flight count. Returns the chosen endpoint index (not a position).
template <class InFlight>
std::uint32_t p2c_pick(std::span<const std::uint32_t> healthy, Rng& rng, InFlight in_flight) {
  const auto m = static_cast<std::uint32_t>(healthy.size());
  const std::uint32_t a = rng.below(m);
  std::uint32_t b = rng.below(m - 1);
  if (b >= a) ++b;
  const auto ia = healthy[a], ib = healthy[b];
  return in_flight(ib) < in_flight(ia) ? ib : ia;
}

}  // namespace weir::routing
