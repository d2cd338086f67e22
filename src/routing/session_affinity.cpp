#include "routing/session_affinity.hpp"

#include "routing/mix.hpp"

#include <algorithm>

#include "routing/prefix_index.hpp"

namespace weir::routing {

namespace {
// The rendezvous weight of (session, endpoint).
std::uint64_t weight(std::uint64_t a, std::uint64_t b) { return mix64(a ^ (b * 0x9E3779B97F4A7C15ull)); }
}  // namespace

std::uint64_t endpoint_seed(const core::EndpointConfig& ep) {
  // (host:port alone when there is neither: the seeds sessions had before base paths counted.)
  std::uint64_t h = text_hash(ep.host_header, 0xe9d);
  if (!ep.base_path.empty() || !ep.query.empty()) h = text_hash(ep.base_path + "?" + ep.query, h);
  return h;
}

std::uint32_t session_pick(std::span<const Candidate> c, std::string_view session, std::span<const std::uint64_t> seeds,
                           const core::ImbalanceConfig& guard) {
  const std::uint64_t s = text_hash(session, 0x5e5);
  std::uint32_t lo = c[0].load;
  for (const auto& e : c) lo = std::min(lo, e.load);
  std::uint32_t first = 0, best = UINT32_MAX;
  std::uint64_t first_w = 0, best_w = 0;
  for (std::uint32_t i = 0; i < c.size(); ++i) {
    const std::uint64_t w = weight(s, seeds[c[i].endpoint]);
    if (i == 0 || w > first_w) {
      first = i;
      first_w = w;
    }
    if ((best == UINT32_MAX || w > best_w) && !above(c[i].load, lo, guard)) {
      best = i;
      best_w = w;
    }
  }
  return best == UINT32_MAX ? first : best;
}

}  // namespace weir::routing
