#include "routing/balance.hpp"

#include <algorithm>

namespace weir::routing {

std::string_view pick_rule_label(PickRule r) {
  switch (r) {
    case PickRule::p2c:
      return "p2c";
    case PickRule::least_load:
      return "least_load";
    case PickRule::prefix_match:
      return "prefix_match";
    case PickRule::prefix_miss:
      return "prefix_miss";
    case PickRule::prefix_guard:
      return "prefix_guard";
    case PickRule::session:
    case PickRule::count_:
      break;
  }
  return "session";
}

void compare_in_flight(std::span<Candidate> c) {
  for (auto& e : c) {
    e.load = e.in_flight;
    e.scraped = false;
  }
}

bool saturated(std::span<const Candidate> c, std::uint32_t i, const core::ImbalanceConfig& cfg) {
  std::uint32_t lo = c[i].load;
  for (const auto& e : c) lo = std::min(lo, e.load);
  return above(c[i].load, lo, cfg);
}

}  // namespace weir::routing
