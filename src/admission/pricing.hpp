// Per-model prices and the spend of one request (the `pricing:` section).
#pragma once

#include <algorithm>
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
  // Prompt tokens written to the prompt cache (usage.prompt_tokens_details.cache_write_tokens: an Anthropic
  // pool's cache_creation_input_tokens, which Anthropic bills at 1.25× input for 5-minute writes), and of
  // them those written for an hour (cache_creation.ephemeral_1h_input_tokens: 2× input).
  std::int64_t cache_write = 0;
  std::int64_t cache_write_1h = 0;
  // The most one prompt token can cost (the reservation's price for the prompt: it may all be cache writes).
  std::int64_t prompt_worst() const noexcept { return std::max({input, cache_write, cache_write_1h}); }
};

// The most one request can cost, in nano-USD: 10^15 ($1,000,000), so that
// spend sums over a budget period stay far inside int64.
inline constexpr std::int64_t kMaxCostNanoUsd = 1'000'000'000'000'000;

// The spend of `usage` at `price`, in nano-USD, rounded up, at most
// kMaxCostNanoUsd. Cached (read) and cache-write tokens are parts of
// prompt_tokens (OpenAI usage object; taken as at most what is left of it),
// each at its price, the 1-hour writes (of the writes) at cache_write_1h, the
// rest of the prompt at input; completion tokens count at the output price.
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
// cached_input, cache_write, cache_write_1h}} with USD per 1M tokens;
// cached_input and cache_write default to input, cache_write_1h to cache_write.
core::ConfigResult<Pricing> parse_pricing_config(const YAML::Node& root, const std::string& file = "<config>");

}  // namespace weir::admission
