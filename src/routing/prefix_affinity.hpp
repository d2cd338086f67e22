// balance: prefix_affinity — send a request to the endpoint that most likely
// holds its prompt's prefix in KV cache (SGLang's cache-aware policy, with
// the Inference Extension's block-hash index: prefix_index.hpp).
//
//   1. The longest indexed prefix covers at least match_threshold of the
//      prompt's hashed blocks: among the endpoints holding it, the least loaded.
//   2. Otherwise, a new prefix: the endpoint holding the fewest indexed
//      blocks (SGLang's smallest tree: prefixes, and with them the load,
//      spread evenly), the least loaded of those; a prompt shorter than one
//      block: the least-loaded endpoint.
//   3. The guard: when the endpoint 1 or 2 chose is saturated (saturated():
//      its load - min > imbalance.absolute and > imbalance.relative * min),
//      the least-loaded endpoint instead. SGLang tests the pool's max
//      against its min, so one busy endpoint turns affinity off for every
//      prefix; here only the busy endpoint's own prefixes move.
// The caller then records the chosen endpoint in the index (a guard's pick
// too: that endpoint now holds the prefix, and the next request of it
// matches there while its first home is busy).
#pragma once

#include <cstdint>
#include <span>

#include "core/config.hpp"
#include "routing/balance.hpp"
#include "routing/prefix_index.hpp"

namespace weir::routing {

// Which rule chose (for tests and metrics).
enum class PrefixRule : std::uint8_t { guard, match, miss };

struct PrefixPick {
  std::uint32_t candidate = 0;  // index into the candidates
  PrefixRule rule = PrefixRule::miss;
  std::uint32_t matched_blocks = 0;
};

// `hashes`: the prompt's block hashes (prefix_block_hashes).
PrefixPick prefix_affinity_pick(std::span<const Candidate> c, std::span<const std::uint64_t> hashes,
                                const PrefixIndex& index, const core::PoolConfig& cfg, Rng& rng);

}  // namespace weir::routing
