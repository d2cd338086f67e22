// A set of one pool's endpoints, by index: those a request tried, those it
// must not go back to (routing::Attempts, the gateway's resume and held
// stream retry). Pools are small, so the first 64 endpoints are the bits of
// one inline word: a request on such a pool allocates nothing. A pool may be
// larger (a host name behind DNS can give hundreds): the endpoints from 64
// on spill to a bit vector, allocated on the first insert of one of them
// and kept (clear() keeps its capacity) for a reused request context.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace weir::routing {

class EndpointSet {
 public:
  // Endpoint `i` is in the set. O(1).
  bool contains(std::uint32_t i) const {
    if (i < 64) return ((low_ >> i) & 1u) != 0;
    const std::size_t w = (i - 64) / 64;
    return w < high_.size() && ((high_[w] >> (i % 64)) & 1u) != 0;
  }
  // Adds endpoint `i`; allocates only for i ≥ 64 beyond the words held.
  void insert(std::uint32_t i) {
    if (i < 64) {
      low_ |= std::uint64_t{1} << i;
      return;
    }
    const std::size_t w = (i - 64) / 64;
    if (w >= high_.size()) high_.resize(w + 1, 0);
    high_[w] |= std::uint64_t{1} << (i % 64);
  }
  bool empty() const {
    return low_ == 0 && std::all_of(high_.begin(), high_.end(), [](std::uint64_t w) { return w == 0; });
  }
  // Empties the set (its spilled words are kept, zeroed: no allocation next time).
  void clear() {
    low_ = 0;
    std::fill(high_.begin(), high_.end(), std::uint64_t{0});
  }
  // Adds every endpoint of `o`.
  EndpointSet& operator|=(const EndpointSet& o) {
    low_ |= o.low_;
    if (high_.size() < o.high_.size()) high_.resize(o.high_.size(), 0);
    for (std::size_t w = 0; w < o.high_.size(); ++w) high_[w] |= o.high_[w];
    return *this;
  }
  friend EndpointSet operator|(EndpointSet a, const EndpointSet& b) { return a |= b; }

 private:
  std::uint64_t low_ = 0;            // endpoints 0..63 (bit i = endpoint i)
  std::vector<std::uint64_t> high_;  // endpoints from 64 on (bit j of word w = endpoint 64 + 64w + j)
};

}  // namespace weir::routing
