// Environment-variable references left in the configuration (README,
// "Configuration reference"): Weir expands none, so a secret or URL written
// as ${NAME} is refused rather than used as written. env_reference() and
// check_env_references() are declared in core/config.hpp; parse_config()
// (core/config.cpp) calls check_env_references() before any section is read.
#include "core/config.hpp"

#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace weir::core {

std::optional<std::string> env_reference(std::string_view value) {
  const auto name_start = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  const auto name_char = [&](char c) { return name_start(c) || (c >= '0' && c <= '9'); };
  // A name from `at` on: its length (0: none).
  const auto name_at = [&](std::size_t at) {
    std::size_t n = 0;
    if (at < value.size() && name_start(value[at]))
      for (n = 1; at + n < value.size() && name_char(value[at + n]); ++n) {
      }
    return n;
  };
  for (auto at = value.find("${"); at != std::string_view::npos; at = value.find("${", at + 1))
    if (const auto n = name_at(at + 2); n > 0 && at + 2 + n < value.size() && value[at + 2 + n] == '}')
      return std::string(value.substr(at, n + 3));
  if (value.size() > 1 && value[0] == '$' && name_at(1) == value.size() - 1) return std::string(value);
  return std::nullopt;
}

namespace {

// The values check_env_references() looks at: a dotted path ('*': every key
// of a mapping, "[]": every item of a sequence) and the key that takes the
// value from the environment instead ({} = the variable's name; "": none, a
// URL is expanded with envsubst).
// `secret`: a value a literal may be (a password, a key) that may begin with
// '$': there only "${NAME}" is taken as a reference, not a whole "$NAME".
struct LiteralOnly {
  std::string_view path;
  std::string_view instead;
  bool secret = false;
};
constexpr LiteralOnly kLiteralOnly[] = {
    {"pools.*.api_key", "api_key_env: {}", true},
    {"pools.*.endpoints[]", ""},
    {"admin.token_sha256", "token_env: {}"},
    {"auth.api_keys[].sha256", "key_env: {}"},
    {"auth.jwt.jwks_url", ""},
    {"redis.url", ""},
    {"redis.username", "", true},
    {"redis.password", "password_env: {}", true},
    {"request_log.url", ""},
    {"tracing.otlp_endpoint", ""},
    {"tracing.headers.*", "tracing.headers_env: {{HEADER: {}}}", true},
};

ConfigResult<void> check_literal(const YAML::Node& node, std::string_view rest, const std::string& key,
                                 const LiteralOnly& rule) {
  if (!node) return {};
  if (rest.empty()) {
    if (!node.IsScalar()) return {};  // (the section's reader names the wrong type)
    const auto ref = env_reference(node.Scalar());
    if (!ref || (rule.secret && !ref->starts_with("${"))) return {};
    std::string_view name = *ref;  // "${NAME}" or "$NAME": NAME
    name.remove_prefix(name.starts_with("${") ? 2 : 1);
    if (name.ends_with('}')) name.remove_suffix(1);
    constexpr std::string_view kExpand = "expand the file before Weir reads it (weir -c <(envsubst < weir.yaml))";
    const std::string where =
        rule.instead.empty()
            ? std::string(kExpand)
            : fmt::format("use `{}` instead, or {}", fmt::format(fmt::runtime(rule.instead), name), kExpand);
    return tl::unexpected(config_error(
        node, key,
        fmt::format("{} is an environment variable reference, and Weir does not expand the configuration: it would "
                    "be used as written; {}",
                    *ref, where)));
  }
  const auto dot = rest.find('.');
  std::string_view seg = rest.substr(0, dot);
  const std::string_view next = dot == std::string_view::npos ? std::string_view() : rest.substr(dot + 1);
  const bool each_item = seg.ends_with("[]");
  if (each_item) seg.remove_suffix(2);
  const auto child_key = [&](std::string_view name) {
    return key.empty() ? std::string(name) : key + "." + std::string(name);
  };
  auto descend = [&](const YAML::Node& n, const std::string& k) -> ConfigResult<void> {
    if (!each_item) return check_literal(n, next, k, rule);
    if (!n || !n.IsSequence()) return {};
    for (std::size_t i = 0; i < n.size(); ++i)
      if (auto r = check_literal(n[i], next, fmt::format("{}[{}]", k, i), rule); !r) return r;
    return {};
  };
  if (!node.IsMap()) return {};
  if (seg == "*") {
    for (const auto& kv : node)
      if (kv.first.IsScalar())
        if (auto r = descend(kv.second, child_key(kv.first.Scalar())); !r) return r;
    return {};
  }
  const YAML::Node child = node[std::string(seg)];
  return descend(child, child_key(seg));
}

}  // namespace

ConfigResult<void> check_env_references(const YAML::Node& root) {
  for (const auto& rule : kLiteralOnly)
    if (auto r = check_literal(root, rule.path, "", rule); !r) return r;
  return {};
}

}  // namespace weir::core
