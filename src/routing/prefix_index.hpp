// The approximate prefix index of balance: prefix_affinity: which endpoint
// was last sent which prompt prefix, learned from routing history (no
// model-server events), as the Gateway API Inference Extension's prefix
// scorer does: the prompt text is cut into fixed-size blocks, block i's hash
// chains block i-1's (seeded by the model name), so one hash names a whole
// prefix and "endpoint E holds block i" implies it holds blocks 0..i.
//
// Shared by every worker of the process, with no lock: a fixed table of
// 64-bit atomic slots, 8 per bucket (one cache line), each slot
// tag:40 | endpoint:8 | epoch:16. A lookup is one relaxed load per slot; an
// insert replaces the bucket's least-recently-used slot with one relaxed
// store (two workers racing on one bucket may lose an entry: the index is an
// approximation either way). A slot whose entry is fresh is not written
// again, so hot prefixes are read-only and their cache lines stay shared.
// Memory: 8 bytes per slot, fixed at start (PrefixAffinityConfig::index_entries).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace weir::routing {

// Hashes of the full `block_bytes`-byte blocks of `text` (a trailing partial
// block is not hashed), at most out.size() of them, each chained on the one
// before, the first seeded by `model`. Returns how many were written.
// A 64-bit hash of `s` chained on `seed` (8 bytes per multiply, splitmix64's
// finalizer): the block hash, also used for session values.
std::uint64_t text_hash(std::string_view s, std::uint64_t seed);

std::uint32_t prefix_block_hashes(std::string_view model, std::string_view text, std::uint32_t block_bytes,
                                  std::span<std::uint64_t> out);

class PrefixIndex {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::uint32_t kWays = 8;
  static constexpr std::uint32_t kMaxEndpoints = 64;  // endpoints from 64 on are not indexed

  // `entries` slots, rounded up to a power of two of at least kWays.
  explicit PrefixIndex(std::uint32_t entries);
  std::uint32_t entries() const { return buckets_ * kWays; }

  // The longest indexed prefix of `hashes` among the endpoints whose bit is
  // set in `candidates`: how many leading blocks it covers (0: none) and the
  // endpoints that hold that many (a mask, bit i = endpoint i).
  struct Match {
    std::uint32_t blocks = 0;
    std::uint64_t endpoints = 0;
  };
  Match longest(std::span<const std::uint64_t> hashes, std::uint64_t candidates) const;

  // Endpoint `endpoint` was sent a prompt with these block hashes at `now`.
  void insert(std::span<const std::uint64_t> hashes, std::uint32_t endpoint, Clock::time_point now);

  // Slots endpoint `e` holds now (SGLang's "tree size" of a tenant): what a
  // new prefix is balanced on. Kept with one relaxed atomic add per slot
  // taken or lost, so only inserts of new blocks write it; racing inserts
  // may let it drift by a few slots.
  std::uint64_t held(std::uint32_t e) const {
    const auto v = e < kMaxEndpoints ? held_[e].load(std::memory_order_relaxed) : 0;
    return v < 0 ? 0 : static_cast<std::uint64_t>(v);
  }

  // 16-bit clock of the LRU: units of 2^26 ns (~67 ms), wrapping every ~73 min.
  static std::uint16_t epoch(Clock::time_point now) {
    return static_cast<std::uint16_t>(static_cast<std::uint64_t>(now.time_since_epoch().count()) >> 26);
  }
  // An entry younger than this many epochs (~1 s) is not refreshed.
  static constexpr std::uint16_t kRefreshEpochs = 15;

 private:
  struct alignas(64) Bucket {
    std::atomic<std::uint64_t> slot[kWays];
  };
  std::uint64_t bucket_of(std::uint64_t h) const { return h & (buckets_ - 1); }
  static std::uint64_t tag_of(std::uint64_t h) { return (h >> 24) | 1; }  // 40 bits, never 0 (0 = empty)

  std::uint32_t buckets_;
  std::unique_ptr<Bucket[]> table_;
  std::unique_ptr<std::atomic<std::int64_t>[]> held_;  // kMaxEndpoints counters
};

}  // namespace weir::routing
