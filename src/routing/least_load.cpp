#include "routing/least_load.hpp"

#include "routing/pool.hpp"

namespace weir::routing {

std::uint32_t least_load_pick(std::span<const Candidate> c, Rng& rng) {
  const auto n = static_cast<std::uint32_t>(c.size());
  if (n == 1) return 0;
  const std::uint32_t start = rng.below(n);
  std::uint32_t best = start;
  for (std::uint32_t k = 1; k < n; ++k) {
    const std::uint32_t i = (start + k) % n;
    if (c[i].load < c[best].load || (c[i].load == c[best].load && c[i].in_flight < c[best].in_flight)) best = i;
  }
  return best;
}

}  // namespace weir::routing
