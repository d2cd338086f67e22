// Model name → route: which pool serves it and under which upstream name.
// Built once per configuration snapshot; read-only afterwards.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/config.hpp"

namespace weir::routing {

struct Route {
  std::uint32_t pool = 0;           // index into Config::pools
  std::uint32_t model_index = 0;    // index into Config::models; kUnlistedModel for default-pool routes
  std::string_view canonical;       // the configured model name (empty for unlisted models)
  std::string_view upstream_model;  // name to send upstream; empty = leave the body's model as is
  // Completion tokens the admission estimate assumes when a request gives no max_tokens.
  std::uint32_t default_max_tokens = core::ModelConfig::kDefaultMaxTokens;
  // Prompt tokens the admission estimate counts per media part (models.X.media_tokens).
  std::uint32_t media_tokens = core::ModelConfig::kDefaultMediaTokens;
  // Where the request goes when this pool's attempts are spent, in order (models.X.fallbacks).
  std::span<const core::FallbackTarget> fallbacks;
};

inline constexpr std::uint32_t kUnlistedModel = 0xffffffffu;

class RouteTable {
 public:
  explicit RouteTable(const core::Config& cfg);

  // Route for the model name a client sent (a configured name or alias), or
  // for the default pool when one is configured; nullopt = unknown model (404).
  std::optional<Route> find(std::string_view model) const;

  // Number of configured (canonical) models, for metric label tables.
  std::size_t model_count() const { return cfg_.models.size(); }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  const core::Config& cfg_;
  std::unordered_map<std::string, Route, Hash, std::equal_to<>> by_name_;
};

}  // namespace weir::routing
