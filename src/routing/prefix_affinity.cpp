#include "routing/prefix_affinity.hpp"

#include <algorithm>
#include <cstdint>

#include "routing/least_load.hpp"
#include "routing/rng.hpp"

namespace weir::routing {

PrefixPick prefix_affinity_pick(std::span<const Candidate> c, std::span<const std::uint64_t> hashes,
                                const PrefixIndex& index, const core::PoolConfig& cfg, Rng& rng) {
  if (hashes.empty()) return {.candidate = least_load_pick(c, rng), .rule = PrefixRule::miss};
  std::uint64_t mask = 0;
  for (const auto& e : c)
    if (e.endpoint < PrefixIndex::kMaxEndpoints) mask |= std::uint64_t{1} << e.endpoint;
  const auto m = index.longest(hashes, mask);
  // The guard, on the endpoint the index chose: only a prefix whose home is
  // saturated (its load that far above the least-loaded candidate's) goes
  // to the least-loaded one instead. One busy endpoint moves its own
  // prefixes, not every other endpoint's as well.
  const auto guarded = [&](PrefixPick p) {
    if (!saturated(c, p.candidate, cfg.imbalance)) return p;
    return PrefixPick{
        .candidate = least_load_pick(c, rng), .rule = PrefixRule::guard, .matched_blocks = p.matched_blocks};
  };
  // The least loaded of the candidates `keep` accepts (load, then fewest in flight; ties broken at random),
  // over all of them; every candidate when none is accepted.
  auto least_loaded_of = [&](auto keep) {
    std::uint32_t best = UINT32_MAX;
    std::uint32_t ties = 0;
    for (std::uint32_t i = 0; i < c.size(); ++i) {
      if (!keep(c[i])) continue;
      if (best == UINT32_MAX || c[i].load < c[best].load ||
          (c[i].load == c[best].load && c[i].in_flight < c[best].in_flight)) {
        best = i;
        ties = 1;
      } else if (c[i].load == c[best].load && c[i].in_flight == c[best].in_flight && rng.below(++ties) == 0) {
        best = i;
      }
    }
    return best == UINT32_MAX ? least_load_pick(c, rng) : best;
  };
  if (m.blocks == 0 ||
      static_cast<double>(m.blocks) < cfg.prefix_affinity.match_threshold * static_cast<double>(hashes.size())) {
    // A new prefix: to the endpoint that holds the fewest indexed blocks
    // (SGLang's smallest tree), the least loaded of those, so prefixes,
    // and with them the load, spread evenly. An endpoint past the index's
    // 64 holds nothing it could count (its 0 would take every new prefix):
    // those take their share of new prefixes, u of n for u such endpoints
    // among n candidates, by load alone.
    const auto indexed = [](const Candidate& e) { return e.endpoint < PrefixIndex::kMaxEndpoints; };
    std::uint64_t fewest = UINT64_MAX;
    std::uint32_t unindexed = 0;
    for (const auto& e : c) {
      if (indexed(e))
        fewest = std::min(fewest, index.held(e.endpoint));
      else
        ++unindexed;
    }
    const bool past = unindexed > 0 && rng.below(static_cast<std::uint32_t>(c.size())) < unindexed;
    const auto k = least_loaded_of(
        [&](const Candidate& e) { return past ? !indexed(e) : indexed(e) && index.held(e.endpoint) == fewest; });
    return guarded({.candidate = k, .rule = PrefixRule::miss, .matched_blocks = m.blocks});
  }
  const auto k = least_loaded_of([&](const Candidate& e) {
    return e.endpoint < PrefixIndex::kMaxEndpoints && ((m.endpoints >> e.endpoint) & 1u);
  });
  return guarded({.candidate = k, .rule = PrefixRule::match, .matched_blocks = m.blocks});
}

}  // namespace weir::routing
