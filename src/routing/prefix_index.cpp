#include "routing/prefix_index.hpp"

#include "routing/mix.hpp"

#include <bit>
#include <cstring>

namespace weir::routing {

namespace {

constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ull;

constexpr std::uint64_t mix(std::uint64_t h) { return mix64(h); }

// 64-bit hash of `s` chained on `seed`: 8 bytes per multiply.
std::uint64_t hash_bytes(std::string_view s, std::uint64_t seed) {
  std::uint64_t h = seed ^ (s.size() * kMul);
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = std::rotl((h ^ w) * kMul, 29);
  }
  if (i < s.size()) {
    std::uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = std::rotl((h ^ w) * kMul, 29);
  }
  return mix(h);
}

// Slot layout: tag:40 | endpoint:8 | epoch:16.
constexpr std::uint64_t slot_tag(std::uint64_t v) { return v >> 24; }
constexpr std::uint32_t slot_endpoint(std::uint64_t v) { return static_cast<std::uint32_t>((v >> 16) & 0xff); }
constexpr std::uint16_t slot_epoch(std::uint64_t v) { return static_cast<std::uint16_t>(v & 0xffff); }

}  // namespace

std::uint64_t text_hash(std::string_view s, std::uint64_t seed) { return hash_bytes(s, seed); }

std::uint32_t prefix_block_hashes(std::string_view model, std::string_view text, std::uint32_t block_bytes,
                                  std::span<std::uint64_t> out) {
  std::uint64_t h = hash_bytes(model, 0x5ee1);
  std::uint32_t n = 0;
  for (std::size_t at = 0; at + block_bytes <= text.size() && n < out.size(); at += block_bytes) {
    h = hash_bytes(text.substr(at, block_bytes), h);
    out[n++] = h;
  }
  return n;
}

PrefixIndex::PrefixIndex(std::uint32_t entries)
    : buckets_(std::bit_ceil(std::max<std::uint32_t>(entries, kWays) / kWays)),
      table_(std::make_unique<Bucket[]>(buckets_)),
      held_(std::make_unique<std::atomic<std::int64_t>[]>(kMaxEndpoints)) {
  for (std::uint32_t b = 0; b < buckets_; ++b)
    for (auto& s : table_[b].slot) s.store(0, std::memory_order_relaxed);
  for (std::uint32_t e = 0; e < kMaxEndpoints; ++e) held_[e].store(0, std::memory_order_relaxed);
}

PrefixIndex::Match PrefixIndex::longest(std::span<const std::uint64_t> hashes, std::uint64_t candidates) const {
  Match m;
  std::uint64_t alive = candidates;
  for (std::uint32_t i = 0; i < hashes.size() && alive; ++i) {
    const Bucket& b = table_[bucket_of(hashes[i])];
    const std::uint64_t tag = tag_of(hashes[i]);
    std::uint64_t here = 0;
    for (const auto& s : b.slot) {
      const std::uint64_t v = s.load(std::memory_order_relaxed);
      if (slot_tag(v) == tag) here |= std::uint64_t{1} << slot_endpoint(v);
    }
    alive &= here;
    if (!alive) break;
    m.blocks = i + 1;
    m.endpoints = alive;
  }
  return m;
}

void PrefixIndex::insert(std::span<const std::uint64_t> hashes, std::uint32_t endpoint, Clock::time_point now) {
  if (endpoint >= kMaxEndpoints) return;
  const std::uint16_t ep = epoch(now);
  for (const std::uint64_t h : hashes) {
    Bucket& b = table_[bucket_of(h)];
    const std::uint64_t tag = tag_of(h);
    const std::uint64_t fresh = tag << 24 | std::uint64_t{endpoint} << 16 | ep;
    std::uint32_t victim = 0;
    std::uint16_t oldest = 0;
    bool found = false;
    for (std::uint32_t w = 0; w < kWays; ++w) {
      const std::uint64_t v = b.slot[w].load(std::memory_order_relaxed);
      if (v == 0) {
        if (oldest != 0xffff) {  // an empty slot beats any entry
          victim = w;
          oldest = 0xffff;
        }
        continue;
      }
      const auto age = static_cast<std::uint16_t>(ep - slot_epoch(v));
      if (slot_tag(v) == tag && slot_endpoint(v) == endpoint) {
        found = true;
        if (age >= kRefreshEpochs) b.slot[w].store(fresh, std::memory_order_relaxed);
        break;
      }
      if (age >= oldest && oldest != 0xffff) {
        victim = w;
        oldest = age;
      }
    }
    if (found) continue;
    const std::uint64_t old = b.slot[victim].load(std::memory_order_relaxed);
    b.slot[victim].store(fresh, std::memory_order_relaxed);
    if (old != 0) held_[slot_endpoint(old)].fetch_sub(1, std::memory_order_relaxed);
    held_[endpoint].fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace weir::routing
