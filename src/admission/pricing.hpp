// Per-model prices and the spend of one request (the `pricing:` section).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "api/usage.hpp"
#include "core/yaml.hpp"

namespace weir::admission {

// Prices of one model in pico-USD (1e-12 USD) per token, i.e. USD per 1M
// tokens × 1e6: $0.15 / 1M tokens = 150'000. Exact integers for every price
// written with up to six decimals.
struct ModelPrice {
  std::int64_t input = 0;         // prompt tokens that were not served from the prefix cache
  std::int64_t output = 0;        // completion tokens
  std::int64_t cached_input = 0;  // usage.prompt_tokens_details.cached_tokens
};

// The most one request can cost, in nano-USD: 10^15 ($1,000,000), so that
// spend sums over a budget period stay far inside int64.
inline constexpr std::int64_t kMaxCostNanoUsd = 1'000'000'000'000'000;

// The spend of `usage` at `price`, in nano-USD, rounded up, at most
// kMaxCostNanoUsd. Cached tokens are a subset of prompt_tokens (OpenAI usage
// object); completion tokens count at the output price.
std::int64_t cost_nano_usd(const ModelPrice& price, const api::Usage& usage) noexcept;

class Pricing {
 public:
  // Price of `model`: its own entry, else the "*" entry, else nullptr (free).
  const ModelPrice* find(std::string_view model) const noexcept;
  void set(std::string model, ModelPrice price) { prices_[std::move(model)] = price; }
  bool empty() const noexcept { return prices_.empty(); }

 private:
  std::map<std::string, ModelPrice, std::less<>> prices_;
};

// Parses `root["pricing"]` (optional): {MODEL or "*": {input, output,
// cached_input}} with USD per 1M tokens; cached_input defaults to input.
core::ConfigResult<Pricing> parse_pricing_config(const YAML::Node& root, const std::string& file = "<config>");

}  // namespace weir::admission
