#include "routing/prefix_affinity.hpp"

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
  if (m.blocks == 0 ||
      static_cast<double>(m.blocks) < cfg.prefix_affinity.match_threshold * static_cast<double>(hashes.size()))
    return {.candidate = least_load_pick(c, rng), .rule = PrefixRule::miss, .matched_blocks = m.blocks};
  // The least loaded of the endpoints that hold the prefix.
  std::array<Candidate, PrefixIndex::kMaxEndpoints> holders;
  std::array<std::uint32_t, PrefixIndex::kMaxEndpoints> where;
  std::uint32_t n = 0;
  for (std::uint32_t i = 0; i < c.size(); ++i)
    if (c[i].endpoint < PrefixIndex::kMaxEndpoints && ((m.endpoints >> c[i].endpoint) & 1u)) {
      holders[n] = c[i];
      where[n++] = i;
    }
  const auto k = least_load_pick(std::span<const Candidate>(holders.data(), n), rng);
  return {.candidate = where[k], .rule = PrefixRule::match, .matched_blocks = m.blocks};
}

}  // namespace weir::routing
