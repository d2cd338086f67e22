// The `server.cors` section's parser, for parse_server() (core/config.cpp).
#pragma once

#include <yaml-cpp/yaml.h>

#include "core/config.hpp"

namespace weir::core {

// `server.cors` (node `n`) into `c`, enabling it: allowed_origins (required:
// serialized origins as a browser sends them, or "*" alone), allowed_headers
// and expose_headers (header names; allowed_headers also prefixes ending in
// '*', or "*"; each defaults to what browsers' OpenAI and Anthropic SDKs
// need), max_age (whole seconds, 0s..1d) and allow_credentials (never with
// "*"). Names are stored lower-case. Errors name the key and the line
// (config_error).
ConfigResult<void> parse_cors(const YAML::Node& n, CorsConfig& c);

}  // namespace weir::core
