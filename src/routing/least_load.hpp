// balance: least_load — the endpoint with the least load (load_of in
// balance.hpp: vLLM's running + waiting from its /metrics, plus this
// worker's in-flight change since the scrape; this worker's in-flight for
// every candidate while one has no usable scrape: compare_in_flight). Also
// the fallback of the other load-aware policies.
#pragma once

#include <cstdint>
#include <span>

#include "routing/balance.hpp"

namespace weir::routing {

// The least-loaded candidate (index into `c`, which is non-empty). Ties go
// to the fewest of this worker's in-flight requests, then to the first from
// a random starting point (one rng draw), so workers that see equal loads
// do not all pick the same endpoint. O(n).
std::uint32_t least_load_pick(std::span<const Candidate> c, Rng& rng);

}  // namespace weir::routing
