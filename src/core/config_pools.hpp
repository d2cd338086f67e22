// The `pools:` section's parser, for parse_config() (core/config.cpp).
#pragma once

#include <string>

#include <yaml-cpp/yaml.h>

#include "core/config.hpp"

namespace weir::core {

// One pool, `pools.<name>` (node `n`): its endpoints (http:// or https://
// URLs, parse_endpoint_url), retry, outlier detection and circuit breaker,
// queue, balancing, TLS and Anthropic upstream settings. Errors name the
// key and the line (config_error).
ConfigResult<PoolConfig> parse_pool(const std::string& name, const YAML::Node& n);

}  // namespace weir::core
