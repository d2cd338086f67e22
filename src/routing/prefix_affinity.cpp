#include "routing/prefix_affinity.hpp"

#include <algorithm>
#include <array>

#include "routing/least_load.hpp"

namespace weir::routing {

PrefixPick prefix_affinity_pick(std::span<const Candidate> c, std::span<const std::uint64_t> hashes,
                                const PrefixIndex& index, const core::PoolConfig& cfg, Rng& rng) {
  if (imbalanced(c, cfg.imbalance)) return {.candidate = least_load_pick(c, rng), .rule = PrefixRule::guard};
  if (hashes.empty()) return {.candidate = least_load_pick(c, rng), .rule = PrefixRule::miss};
  std::uint64_t mask = 0;
  for (const auto& e : c)
    if (e.endpoint < PrefixIndex::kMaxEndpoints) mask |= std::uint64_t{1} << e.endpoint;
  const auto m = index.longest(hashes, mask);
  // The least loaded of the candidates `keep` accepts.
  std::array<Candidate, PrefixIndex::kMaxEndpoints> some;
  std::array<std::uint32_t, PrefixIndex::kMaxEndpoints> where;
  auto least_loaded_of = [&](auto keep) {
    std::uint32_t n = 0;
    for (std::uint32_t i = 0; i < c.size() && n < some.size(); ++i)
      if (keep(c[i])) {
        some[n] = c[i];
        where[n++] = i;
      }
    return n == 0 ? least_load_pick(c, rng) : where[least_load_pick(std::span<const Candidate>(some.data(), n), rng)];
  };
  if (m.blocks == 0 ||
      static_cast<double>(m.blocks) < cfg.prefix_affinity.match_threshold * static_cast<double>(hashes.size())) {
    // A new prefix: to the endpoint that holds the fewest indexed blocks
    // (SGLang's smallest tree), the least loaded of those, so prefixes,
    // and with them the load, spread evenly. An endpoint past the index's
    // 64 holds nothing it could count: it is one of those always, chosen
    // by load alone (it would take every new prefix if its 0 were compared).
    const auto indexed = [](const Candidate& e) { return e.endpoint < PrefixIndex::kMaxEndpoints; };
    std::uint64_t fewest = UINT64_MAX;
    for (const auto& e : c)
      if (indexed(e)) fewest = std::min(fewest, index.held(e.endpoint));
    const auto k = least_loaded_of([&](const Candidate& e) { return !indexed(e) || index.held(e.endpoint) == fewest; });
    return {.candidate = k, .rule = PrefixRule::miss, .matched_blocks = m.blocks};
  }
  const auto k = least_loaded_of([&](const Candidate& e) {
    return e.endpoint < PrefixIndex::kMaxEndpoints && ((m.endpoints >> e.endpoint) & 1u);
  });
  return {.candidate = k, .rule = PrefixRule::match, .matched_blocks = m.blocks};
}

}  // namespace weir::routing
