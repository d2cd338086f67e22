#include "admission/pricing.hpp"

#include <cmath>

#include <fmt/format.h>

namespace weir::admission {

std::int64_t cost_nano_usd(const ModelPrice& price, const api::Usage& usage) noexcept {
  const std::uint64_t cached = std::min(usage.cached_tokens, usage.prompt_tokens);
  const std::uint64_t written = std::min(usage.cache_write_tokens, usage.prompt_tokens - cached);
  long double pico = static_cast<long double>(usage.prompt_tokens - cached - written) * price.input +
                     static_cast<long double>(cached) * price.cached_input +
                     static_cast<long double>(usage.completion_tokens) * price.output;
  if (written != 0) {  // (an Anthropic pool's cache writes; no other upstream reports any)
    const std::uint64_t written_1h = std::min(usage.cache_write_1h_tokens, written);
    pico += static_cast<long double>(written - written_1h) * price.cache_write +
            static_cast<long double>(written_1h) * price.cache_write_1h;
  }
  const long double nano = std::ceil(pico / 1000.0L);
  // A faulty upstream's absurd usage (10^15 tokens) saturates instead of
  // overflowing the conversion (undefined behaviour) or the spend sums.
  return nano >= static_cast<long double>(kMaxCostNanoUsd) ? kMaxCostNanoUsd : static_cast<std::int64_t>(nano);
}

const ModelPrice* Pricing::find(std::string_view model) const noexcept {
  if (prices_.empty()) return nullptr;
  if (auto it = prices_.find(model); it != prices_.end()) return &it->second;
  if (auto it = prices_.find(std::string_view("*")); it != prices_.end()) return &it->second;
  return nullptr;
}

core::ConfigResult<Pricing> parse_pricing_config(const YAML::Node& root, const std::string& file) {
  Pricing p;
  const YAML::Node node = root["pricing"];
  if (!node) return p;
  auto fail = [&](core::ConfigError e) {
    e.file = file;
    return tl::unexpected(std::move(e));
  };
  if (!node.IsMap()) return fail(core::config_error(node, "pricing", "expected a mapping of model names"));
  for (const auto& kv : node) {
    const std::string model = kv.first.Scalar();
    const std::string key = "pricing." + model;
    if (auto ok =
            core::check_keys(kv.second, key, {"input", "output", "cached_input", "cache_write", "cache_write_1h"});
        !ok)
      return fail(ok.error());
    ModelPrice mp;
    bool has_cached = false;
    bool has_write = false;
    bool has_write_1h = false;
    for (auto [name, out] :
         std::initializer_list<std::pair<const char*, std::int64_t*>>{{"input", &mp.input},
                                                                      {"output", &mp.output},
                                                                      {"cached_input", &mp.cached_input},
                                                                      {"cache_write", &mp.cache_write},
                                                                      {"cache_write_1h", &mp.cache_write_1h}}) {
      if (!kv.second[name]) continue;
      auto v = core::read_double(kv.second[name], key + "." + name, 0.0, 1e6);
      if (!v) return fail(v.error());
      // Kept in whole pico-USD per token (USD per 1M tokens × 1e6): a price
      // that is not one (within the decimal-to-binary error of a double: a
      // millionth of a step, or ~1e-15 of the price) would be charged as another (1e-9 as
      // free, 0.0000015 as 0.000002, 1.0000001 as 1), in silence.
      const double pico = *v * 1e6;
      const auto kept = std::llround(pico);
      if (std::abs(static_cast<double>(kept) - pico) > 1e-6 + 1e-15 * pico)
        return fail(core::config_error(kv.second[name], key + "." + name,
                                       fmt::format("{} USD per 1M tokens is finer than the $0.000001 per 1M tokens "
                                                   "Weir prices in (it would be charged as {})",
                                                   *v, static_cast<double>(kept) / 1e6)));
      *out = static_cast<std::int64_t>(kept);
      has_cached = has_cached || std::string_view(name) == "cached_input";
      has_write = has_write || std::string_view(name) == "cache_write";
      has_write_1h = has_write_1h || std::string_view(name) == "cache_write_1h";
    }
    if (!has_cached) mp.cached_input = mp.input;
    if (!has_write) mp.cache_write = mp.input;
    if (!has_write_1h) mp.cache_write_1h = mp.cache_write;
    p.set(model, mp);
  }
  return p;
}

}  // namespace weir::admission
