#include "routing/route_table.hpp"

namespace weir::routing {

RouteTable::RouteTable(const core::Config& cfg) : cfg_(cfg) {
  for (std::uint32_t i = 0; i < cfg.models.size(); ++i) {
    const auto& m = cfg.models[i];
    Route r;
    r.pool = static_cast<std::uint32_t>(m.pool);
    r.model_index = i;
    r.canonical = m.name;
    r.default_max_tokens = m.default_max_tokens;
    r.media_tokens = m.media_tokens;
    r.fallbacks = m.fallbacks;
    // An alias is renamed to the upstream name, or to the canonical name when none is given.
    r.upstream_model = m.upstream_model.empty() ? std::string_view{} : std::string_view(m.upstream_model);
    by_name_.emplace(m.name, r);
    Route ra = r;
    if (ra.upstream_model.empty()) ra.upstream_model = m.name;
    for (const auto& a : m.aliases) by_name_.emplace(a, ra);
  }
}

std::optional<Route> RouteTable::find(std::string_view model) const {
  if (auto it = by_name_.find(model); it != by_name_.end()) return it->second;
  if (cfg_.default_pool) {
    Route r;
    r.pool = static_cast<std::uint32_t>(*cfg_.default_pool);
    r.model_index = kUnlistedModel;
    return r;
  }
  return std::nullopt;
}

}  // namespace weir::routing
